//! `GET /v1/sessions/{id}/events` and `GET /metrics` (on its own listener) against a real Postgres and Redis,
//! with the session's event stream written by hand: which stored events a replay drops
//! (redone steps, zombie runs), `reset` on a reconnect and live, the transcript rebuilt
//! when there is no stream, closing after the completion, and the queue gauges; many
//! clients followed over a few Redis connections, a slow one holding up no other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::{Outcome, SessionState};
use agentq_core::pg::PgStore;
use agentq_core::queue::EventRecord;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    Claim, EnqueueReason, EventStreams, LeaseStore, NewSession, SessionStore, WorkQueue,
};
use agentq_scheduler::events::READERS;
use agentq_scheduler::{Scheduler, SchedulerSettings, metrics_router, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::bearer_client;

/// The operator's key of these tests: every existing case runs as the admin (tenant
/// `default`, every scope); the tenant and scope checks have their own tests (`auth.rs`).
const ADMIN_KEY: &str = "test-admin-key";

struct Env {
    base: String,
    /// `/metrics` has a listener of its own, without keys.
    metrics_base: String,
    http: reqwest::Client,
    store: Arc<PgStore>,
    queue: Arc<RedisQueue>,
    redis: RedisServer,
}

impl Env {
    async fn start() -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        let state = Scheduler::new(store.clone(), queue.clone(), settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_addr: SocketAddr = metrics.local_addr().unwrap();
        let metrics_app = metrics_router(state.clone());
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        tokio::spawn(async move { axum::serve(metrics, metrics_app).await });
        Env {
            base: format!("http://{addr}"),
            metrics_base: format!("http://{metrics_addr}"),
            http: bearer_client(ADMIN_KEY),
            store,
            queue,
            redis,
        }
    }

    async fn session(&self) -> String {
        let (row, _) = self
            .store
            .create_session(&NewSession::root(SessionSpec::new("hello"), "default"))
            .await
            .unwrap();
        row.id
    }

    /// A worker's claim of `id`: its lease and the state to resume from.
    async fn claimed(&self, id: &str) -> (agentq_core::Lease, Box<SessionState>) {
        let Claim::Acquired { lease, state, .. } = self
            .store
            .claim(id, "w", Duration::from_secs(30), 5)
            .await
            .unwrap()
        else {
            panic!("not claimed")
        };
        (lease, state)
    }

    async fn append(&self, id: &str, events: &[(u64, i64, Value)]) {
        let recs: Vec<EventRecord> = events
            .iter()
            .map(|(seq, epoch, data)| EventRecord {
                session_id: id.into(),
                id: String::new(),
                seq: *seq,
                epoch: *epoch,
                data: data.to_string(),
            })
            .collect();
        self.queue.append_events(&recs).await.unwrap();
    }

    async fn connect(&self, id: &str, last: Option<&str>) -> Sse {
        let mut req = self
            .http
            .get(format!("{}/v1/sessions/{id}/events", self.base));
        if let Some(l) = last {
            req = req.header("last-event-id", l);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        Sse {
            body: Box::pin(resp.bytes_stream().map(|r| r.map(|b| b.to_vec()))),
            buf: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Ev {
    id: Option<String>,
    event: String,
    data: Value,
}

struct Sse {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buf: String,
}

impl Sse {
    /// The next event; `None` when the server ended the stream. Panics after 10 s.
    async fn next(&mut self) -> Option<Ev> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    id: None,
                    event: "message".into(),
                    data: Value::Null,
                };
                let mut data = String::new();
                let mut any = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.into());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = v.into();
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                        any = true;
                    }
                }
                if !any {
                    continue; // a keep-alive comment
                }
                ev.data = serde_json::from_str(&data).unwrap();
                return Some(ev);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next())
                .await
                .expect("no event within 10 s");
            match chunk {
                Some(Ok(b)) => self.buf.push_str(&String::from_utf8_lossy(&b)),
                _ => return None,
            }
        }
    }

    async fn take(&mut self, n: usize) -> Vec<Ev> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.next().await.expect("the stream ended early"));
        }
        out
    }
}

fn text(t: &str) -> Value {
    json!({"type": "text_delta", "text": t})
}

fn kinds(evs: &[Ev]) -> Vec<String> {
    evs.iter()
        .map(|e| match e.data["text"].as_str() {
            Some(t) => format!("{}:{t}@{}", e.event, e.data["seq"]),
            None => format!("{}@{}", e.event, e.data["seq"]),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_session_and_bad_last_event_id() {
    let env = Env::start().await;
    let r = env
        .http
        .get(format!("{}/v1/sessions/nope/events", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found");

    let id = env.session().await;
    let r = env
        .http
        .get(format!("{}/v1/sessions/{id}/events", env.base))
        .header("last-event-id", "garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["field"], "Last-Event-ID");
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_drops_abandoned_events_and_resets_the_client() {
    let env = Env::start().await;
    let id = env.session().await;
    // Run 1: a committed turn at 1, its tool result at 2, then it dies streaming 3.
    env.append(
        &id,
        &[
            (1, 1, json!({"type": "iteration_started", "iteration": 1})),
            (1, 1, text("a")),
            (1, 1, json!({"type": "tool_call", "id": "c", "name": "t", "arguments": {}})),
            (1, 1, json!({"type": "iteration_completed", "iteration": 1, "usage": {}})),
            (2, 1, json!({"type": "tool_result", "id": "c", "name": "t", "content": "ok", "is_error": false})),
            (3, 1, json!({"type": "iteration_started", "iteration": 2})),
            (3, 1, text("lost")),
        ],
    )
    .await;

    // A client follows live and sees run 1's doomed step.
    let mut live = env.connect(&id, None).await;
    let first = live.take(7).await;
    assert_eq!(
        kinds(&first),
        [
            "iteration_started@1",
            "text_delta:a@1",
            "tool_call@1",
            "iteration_completed@1",
            "tool_result@2",
            "iteration_started@3",
            "text_delta:lost@3"
        ]
    );
    let lost_id = first[6].id.clone().unwrap();

    // Run 2 redoes 3; run 1 wakes up (a zombie) and appends more.
    env.append(
        &id,
        &[
            (3, 2, json!({"type": "iteration_started", "iteration": 2})),
            (3, 2, text("redo")),
        ],
    )
    .await;
    env.append(&id, &[(3, 1, text("zombie"))]).await;
    env.append(&id, &[(3, 2, text("more"))]).await;

    // Live: a reset to 3, then the new run's events; the zombie's are skipped.
    let next = live.take(4).await;
    assert_eq!(
        kinds(&next),
        [
            "reset@3",
            "iteration_started@3",
            "text_delta:redo@3",
            "text_delta:more@3"
        ]
    );
    assert_eq!(next[0].id, None);
    drop(live);

    // A fresh replay never shows the abandoned or the zombie events.
    let mut fresh = env.connect(&id, None).await;
    let replay = fresh.take(8).await;
    assert_eq!(
        kinds(&replay),
        [
            "iteration_started@1",
            "text_delta:a@1",
            "tool_call@1",
            "iteration_completed@1",
            "tool_result@2",
            "iteration_started@3",
            "text_delta:redo@3",
            "text_delta:more@3"
        ]
    );
    drop(fresh);
    // The live client's view after applying its reset equals the replay.
    let mut applied: Vec<Ev> = first.clone();
    for e in &next {
        if e.event == "reset" {
            let s = e.data["seq"].as_u64().unwrap();
            applied.retain(|x| x.data["seq"].as_u64().unwrap() < s);
        } else {
            applied.push(e.clone());
        }
    }
    assert_eq!(applied, replay);

    // A client that disconnected right after "lost" and reconnects now: a reset, then
    // the rest.
    let mut again = env.connect(&id, Some(&lost_id)).await;
    let rest = again.take(4).await;
    assert_eq!(
        kinds(&rest),
        [
            "reset@3",
            "iteration_started@3",
            "text_delta:redo@3",
            "text_delta:more@3"
        ]
    );
    // One that had seen everything gets nothing more until the session moves on; then
    // the session completes and the stream ends.
    let mut caught_up = env.connect(&id, replay[7].id.as_deref()).await;
    env.store.fail(&id, "test over").await.unwrap();
    env.append(
        &id,
        &[(
            4,
            2,
            json!({"type": "session_completed", "finish_reason": "error", "result": null,
                   "error": "test over", "iterations": 2, "usage": {}}),
        )],
    )
    .await;
    let done = caught_up.next().await.unwrap();
    assert_eq!(done.event, "session_completed");
    assert_eq!(
        caught_up.next().await,
        None,
        "the stream ends after the completion"
    );
    // Reconnecting after the completion: nothing more, the stream ends at once.
    let mut after = env.connect(&id, done.id.as_deref()).await;
    assert_eq!(after.next().await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn terminal_session_without_a_completion_event_gets_one() {
    let env = Env::start().await;
    let id = env.session().await;
    env.append(&id, &[(1, 1, text("partial"))]).await;
    let mut sse = env.connect(&id, None).await;
    assert_eq!(kinds(&sse.take(1).await), ["text_delta:partial@1"]);
    // Dead-lettered: failed in the store, no session_completed ever written.
    env.store.fail(&id, "poison").await.unwrap();
    let done = sse.next().await.unwrap();
    assert_eq!(done.event, "session_completed");
    assert_eq!(done.data["finish_reason"], "error");
    assert_eq!(done.data["error"], "poison");
    assert_eq!(sse.next().await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_stream_the_transcript_is_replayed() {
    let env = Env::start().await;
    let id = env.session().await;
    let (lease, mut state) = env.claimed(&id).await;
    let base = state.messages.len();
    let mut a = Message::assistant("Fetching.");
    a.tool_calls.push(ToolCall {
        id: "c1".into(),
        name: "http_fetch".into(),
        arguments: json!({"url": "u"}).into(),
    });
    state.messages.push(a);
    state
        .messages
        .push(Message::tool_result("c1", "http_fetch", "ok", false));
    state.messages.push(Message::assistant("Done."));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("Done.".into()),
        error: None,
    });
    env.store.checkpoint(&lease, &state, 0).await.unwrap();

    let mut sse = env.connect(&id, None).await;
    let mut all = Vec::new();
    while let Some(e) = sse.next().await {
        all.push(e);
    }
    let b = base;
    assert_eq!(
        kinds(&all),
        [
            format!("iteration_started@{b}"),
            format!("text_delta:Fetching.@{b}"),
            format!("tool_call@{b}"),
            format!("iteration_completed@{b}"),
            format!("tool_result@{}", b + 1),
            format!("iteration_started@{}", b + 2),
            format!("text_delta:Done.@{}", b + 2),
            format!("iteration_completed@{}", b + 2),
            format!("session_completed@{}", b + 3),
        ]
    );
    assert_eq!(all[0].id.as_deref(), Some(format!("t-{b}-0").as_str()));
    assert_eq!(all[8].data["result"], "Done.");
    // Resuming within the rebuilt events.
    let mut sse = env.connect(&id, all[3].id.as_deref()).await;
    let mut rest = Vec::new();
    while let Some(e) = sse.next().await {
        rest.push(e);
    }
    assert_eq!(rest, all[4..].to_vec());
}

/// A client that read the history before the worker held its call learns of the hold
/// from the stream, although the event sits at the position of a step the rebuilt
/// transcript already covered; once, however often it is appended.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_held_after_the_transcript_was_read_is_still_announced() {
    let env = Env::start().await;
    let id = env.session().await;
    let (lease, mut state) = env.claimed(&id).await;
    let b = state.messages.len() as u64;
    let mut a = Message::assistant("Writing.");
    a.tool_calls.push(ToolCall {
        id: "w1".into(),
        name: "write_file".into(),
        arguments: json!({"path": "report.txt"}).into(),
    });
    state.messages.push(a);
    env.store.checkpoint(&lease, &state, 0).await.unwrap();

    let mut sse = env.connect(&id, None).await;
    assert_eq!(
        kinds(&sse.take(4).await),
        [
            format!("iteration_started@{b}"),
            format!("text_delta:Writing.@{b}"),
            format!("tool_call@{b}"),
            format!("iteration_completed@{b}"),
        ]
    );
    let held = json!({"type": "approval_requested", "id": "w1", "name": "write_file",
                      "arguments": {"path": "report.txt"}});
    // Appended twice (a redelivered step announces again), then a step that is news.
    env.append(&id, &[(b, 1, held.clone()), (b, 1, held)]).await;
    env.append(&id, &[(b + 1, 1, text("next"))]).await;
    let got = sse.take(2).await;
    assert_eq!(
        kinds(&got),
        [
            format!("approval_requested@{b}"),
            format!("text_delta:next@{}", b + 1)
        ]
    );
    assert_eq!(got[0].data["id"], "w1");
    assert_eq!(got[0].data["arguments"], json!({"path": "report.txt"}));
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_export_queue_gauges() {
    let env = Env::start().await;
    env.queue.ensure_queue("default").await.unwrap();
    for _ in 0..3 {
        let id = env.session().await;
        env.queue
            .enqueue("default", &id, EnqueueReason::New)
            .await
            .unwrap();
    }
    // Not on the API's port any more; the scraper holds no key.
    let r = env
        .http
        .get(format!("{}/metrics", env.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = reqwest::get(format!("{}/metrics", env.metrics_base))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = r.text().await.unwrap();
    assert!(
        text.contains("agentq_queue_length{queue=\"default\"} 3"),
        "{text}"
    );
    assert!(text.contains("agentq_queue_pending{queue=\"default\"} 0"));
    assert!(text.contains("agentq_queue_lag{queue=\"default\"} 3"));
    assert!(text.contains("agentq_build_info{version="));
}

/// Many clients of different sessions: their live events come over the scheduler's few
/// event readers, not a Redis connection per client, and every client gets its own.
#[tokio::test(flavor = "multi_thread")]
async fn many_streams_share_a_few_redis_connections() {
    let env = Env::start().await;
    const N: usize = 40;
    let mut ids = Vec::new();
    for _ in 0..N {
        ids.push(env.session().await);
    }
    let mut streams = Vec::new();
    for id in &ids {
        streams.push(env.connect(id, None).await);
    }
    for round in 0..2u64 {
        for id in &ids {
            env.append(id, &[(round + 1, 1, text(&format!("{id}/{round}")))])
                .await;
        }
        for (id, sse) in ids.iter().zip(streams.iter_mut()) {
            let ev = sse.next().await.expect("the stream ended");
            assert_eq!(ev.event, "text_delta");
            assert_eq!(ev.data["text"], format!("{id}/{round}"));
        }
        // Every client is following live now: the shared command connection and the
        // readers are all the scheduler holds (the test shares its command connection).
        let clients = env.redis.connected_clients().unwrap();
        assert!(
            clients <= 1 + READERS as u64,
            "{clients} Redis connections for {N} event streams"
        );
    }
}

/// A client that reads nothing while its session streams a lot holds up no other
/// client, and, once it reads, gets every event in order (caught up from where the
/// fan-out let it go).
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_client_holds_up_no_other_and_misses_nothing() {
    let env = Env::start().await;
    let slow_id = env.session().await;
    let other_id = env.session().await;
    let mut slow = env.connect(&slow_id, None).await;
    let mut other = env.connect(&other_id, None).await;
    // Far more than the socket buffers, the relay's channel and the fan-out's hold.
    const EVENTS: usize = 6000;
    let pad = "x".repeat(2000);
    for chunk in 0..EVENTS / 20 {
        let batch: Vec<(u64, i64, Value)> = (0..20)
            .map(|i| (1, 1, text(&format!("{}:{pad}", chunk * 20 + i))))
            .collect();
        env.append(&slow_id, &batch).await;
        // The other session's client is served meanwhile.
        if chunk % 50 == 0 {
            env.append(&other_id, &[(1, 1, text(&format!("o{chunk}")))])
                .await;
            let ev = other.next().await.expect("the other stream ended");
            assert_eq!(ev.data["text"], format!("o{chunk}"));
        }
    }
    for n in 0..EVENTS {
        let ev = slow.next().await.expect("the slow stream ended");
        let t = ev.data["text"].as_str().unwrap();
        assert_eq!(t.split(':').next().unwrap(), n.to_string());
    }
}
