//! The HTTP API against a real Postgres and a real Redis (the testkit's private servers):
//! enqueue (row + stream entry + `enqueued_at`), idempotency, batches, reads and paging,
//! cancellation (queued, running, cascading to children), every documented 4xx with its
//! JSON body and no writes, the checks of steering and approval bodies, the answers' bytes,
//! the sweeper, readiness, and surviving a Redis outage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::pg::PgStore;
use agentq_core::protocol::WorkerSignal;
use agentq_core::queue::EventRecord;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    EventStreams, LeaseStore, NewSession, QueueHealth, SessionStatus, SessionStore, Signals,
    SweepStore, WaitReason, WorkQueue,
};
use agentq_scheduler::sweeper::sweep_once;
use agentq_scheduler::{QueueRegistry, Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, pttl, shared_postgres};

use common::{bearer_client, read, wait_until};

/// The operator's key of these tests: every existing case runs as the admin (tenant
/// `default`, every scope); the tenant and scope checks have their own tests (`auth.rs`).
const ADMIN_KEY: &str = "test-admin-key";

struct Env {
    base: String,
    http: reqwest::Client,
    store: Arc<PgStore>,
    queue: Arc<RedisQueue>,
    state: Scheduler,
    redis: RedisServer,
    db_url: String,
}

impl Env {
    async fn start() -> Env {
        Self::start_with(SchedulerSettings::default()).await
    }

    async fn start_with(mut settings: SchedulerSettings) -> Env {
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let state = Scheduler::new(store.clone(), queue.clone(), settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let app = router(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Env {
            base: format!("http://{addr}"),
            http: bearer_client(ADMIN_KEY),
            store,
            queue,
            state,
            redis,
            db_url,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        read(r).await
    }

    async fn post_raw(&self, path: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        read(r).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        read(self.http.get(self.url(path)).send().await.unwrap()).await
    }

    fn sql(&self, q: &str) -> String {
        shared_postgres().unwrap().psql(&self.db_url, q).unwrap()
    }

    fn row_count(&self) -> u64 {
        self.sql("SELECT count(*) FROM sessions").parse().unwrap()
    }

    fn enqueued(&self, id: &str) -> bool {
        self.sql(&format!(
            "SELECT enqueued_at IS NOT NULL FROM sessions WHERE id = '{id}'"
        )) == "t"
    }

    async fn stream_len(&self, queue: &str) -> u64 {
        self.queue.stats(queue).await.unwrap().length
    }
}

fn assert_error(resp: &(u16, Value), status: u16, code: &str, field: Option<&str>) {
    let (s, v) = resp;
    assert_eq!(*s, status, "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    match field {
        Some(f) => assert_eq!(v["error"]["field"], f, "{v}"),
        None => assert!(v["error"]["field"].is_null(), "{v}"),
    }
}

#[tokio::test]
async fn create_inserts_enqueues_and_marks() {
    let env = Env::start().await;
    let (status, body) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "hello", "mode": "think", "max_iterations": 3,
                    "metadata": {"user": "u1"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["status"], "queued");
    let id = body["id"].as_str().unwrap().to_string();

    let row = env.store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.queue, "default");
    assert_eq!(row.spec.max_iterations, 3);
    assert_eq!(env.stream_len("default").await, 1);
    assert!(env.enqueued(&id));

    let (status, view) = env.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["id"], id.as_str());
    assert_eq!(view["status"], "queued");
    assert_eq!(view["prompt"], "hello");
    assert_eq!(view["mode"], "think");
    assert_eq!(view["iterations"], 0);
    assert_eq!(view["root_id"], id.as_str());
    assert_eq!(view["metadata"]["user"], "u1");
    assert_eq!(view["children"], json!([]));
    assert!(view["created_at"].is_string());
    assert!(view["finished_at"].is_null());

    let (status, msgs) = env.get(&format!("/v1/sessions/{id}/messages")).await;
    assert_eq!(status, 200, "{msgs}");
    assert_eq!(msgs["messages"][0]["role"], "user");
    assert_eq!(msgs["messages"][0]["content"], "hello");

    // A queue an admin created gets its group; sessions may then name it.
    let (status, body) = env.post("/v1/queues", &json!({"name": "gpu-1"})).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = env
        .post("/v1/sessions", &json!({"prompt": "p", "queue": "gpu-1"}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(env.stream_len("gpu-1").await, 1);
    let stats = env.queue.stats("gpu-1").await.unwrap();
    assert_eq!(stats.lag, Some(1), "the consumer group exists");
}

#[tokio::test]
async fn idempotency_key_repeats_return_the_same_session() {
    let env = Env::start().await;
    let req = json!({"prompt": "once", "idempotency_key": "order-42"});
    let (s1, b1) = env.post("/v1/sessions", &req).await;
    let (s2, b2) = env.post("/v1/sessions", &req).await;
    assert_eq!(s1, 201, "{b1}");
    assert_eq!(s2, 200, "{b2}");
    assert_eq!(b1["id"], b2["id"]);
    assert_eq!(b2["status"], "queued");
    assert_eq!(env.row_count(), 1);
    assert_eq!(env.stream_len("default").await, 1);

    // The repeat reports the current status.
    let id = b1["id"].as_str().unwrap();
    let (s, _) = env
        .post(&format!("/v1/sessions/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(s, 200);
    let (s3, b3) = env.post("/v1/sessions", &req).await;
    assert_eq!((s3, &b3["status"]), (200, &json!("cancelled")), "{b3}");
}

#[tokio::test]
async fn batch_of_a_thousand() {
    let env = Env::start().await;
    let (status, body) = env.post("/v1/queues", &json!({"name": "bulk"})).await;
    assert_eq!(status, 201, "{body}");
    let items: Vec<Value> = (0..1000)
        .map(|i| {
            if i % 4 == 0 {
                json!({"prompt": format!("task {i}"), "queue": "bulk"})
            } else {
                json!({"prompt": format!("task {i}")})
            }
        })
        .collect();
    let (status, body) = env.post("/v1/sessions/batch", &json!(items)).await;
    assert_eq!(status, 201, "{body}");
    let sessions = body["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1000);
    assert!(sessions.iter().all(|s| s["status"] == "queued"));
    let mut ids: Vec<&str> = sessions.iter().map(|s| s["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 1000);
    assert_eq!(env.row_count(), 1000);
    assert_eq!(env.stream_len("default").await, 750);
    assert_eq!(env.stream_len("bulk").await, 250);
    assert_eq!(
        env.sql("SELECT count(*) FROM sessions WHERE enqueued_at IS NULL"),
        "0"
    );
    // Items keep their order.
    let first = env
        .store
        .get(sessions[1]["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.spec.prompt, "task 1");
}

#[tokio::test]
async fn batch_with_one_bad_item_writes_nothing() {
    let env = Env::start().await;
    let items = json!([{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "mode": "sprint"}]);
    let r = env.post("/v1/sessions/batch", &items).await;
    assert_error(&r, 422, "invalid_field", Some("[2].mode"));
    let r = env.post("/v1/sessions/batch", &json!([])).await;
    assert_error(&r, 422, "invalid_batch", None);
    let r = env
        .post("/v1/sessions/batch", &json!({"prompt": "x"}))
        .await;
    assert_error(&r, 422, "invalid_body", None);
    assert_eq!(env.row_count(), 0);
    assert_eq!(env.stream_len("default").await, 0);
}

#[tokio::test]
async fn list_and_page_with_a_cursor() {
    let env = Env::start().await;
    let mut created = Vec::new();
    for i in 0..5 {
        let (s, b) = env
            .post("/v1/sessions", &json!({"prompt": format!("p{i}")}))
            .await;
        assert_eq!(s, 201);
        created.push(b["id"].as_str().unwrap().to_string());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/sessions?limit=2&cursor={c}"),
            None => "/v1/sessions?limit=2".to_string(),
        };
        let (s, b) = env.get(&q).await;
        assert_eq!(s, 200, "{b}");
        pages += 1;
        for v in b["sessions"].as_array().unwrap() {
            seen.push(v["id"].as_str().unwrap().to_string());
        }
        match b["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    created.reverse(); // newest first
    assert_eq!(seen, created);

    let (s, b) = env.get("/v1/sessions").await;
    assert_eq!(s, 200);
    assert_eq!(b["sessions"].as_array().unwrap().len(), 5);
    assert!(b["next_cursor"].is_null());

    // Filter by status.
    let (s, _) = env
        .post(&format!("/v1/sessions/{}/cancel", created[0]), &json!({}))
        .await;
    assert_eq!(s, 200);
    let (_, b) = env.get("/v1/sessions?status=cancelled").await;
    let ids: Vec<&str> = b["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![created[0].as_str()]);
    let (_, b) = env.get("/v1/sessions?status=queued&limit=10").await;
    assert_eq!(b["sessions"].as_array().unwrap().len(), 4);

    assert_error(
        &env.get("/v1/sessions?limit=0").await,
        422,
        "invalid_field",
        Some("limit"),
    );
    assert_error(
        &env.get("/v1/sessions?limit=-5").await,
        422,
        "invalid_field",
        Some("limit"),
    );
    assert_error(
        &env.get("/v1/sessions?limit=1001").await,
        422,
        "invalid_field",
        Some("limit"),
    );
    assert_error(
        &env.get("/v1/sessions?limit=ten").await,
        422,
        "invalid_field",
        Some("limit"),
    );
    assert_error(
        &env.get("/v1/sessions?status=done").await,
        422,
        "invalid_field",
        Some("status"),
    );
}

#[tokio::test]
async fn cancel_a_queued_session_publishes_its_completion() {
    let env = Env::start().await;
    let (_, b) = env
        .post("/v1/sessions", &json!({"prompt": "never runs"}))
        .await;
    let id = b["id"].as_str().unwrap().to_string();

    let mut done = env.queue.subscribe_completion(&id).await.unwrap();
    let r = env
        .post(&format!("/v1/sessions/{id}/cancel"), &json!(null))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1, json!({"id": id, "status": "cancelled"}));

    let c = tokio::time::timeout(Duration::from_secs(5), done.next())
        .await
        .expect("completion within 5 s")
        .expect("a completion");
    assert_eq!(c.session_id, id);
    assert_eq!(c.status, SessionStatus::Cancelled);

    let (_, view) = env.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(view["status"], "cancelled");
    assert_eq!(view["finish_reason"], "interrupted");

    let r = env
        .post(&format!("/v1/sessions/{id}/cancel"), &json!({}))
        .await;
    assert_error(&r, 409, "already_finished", None);
    let r = env
        .post(
            "/v1/sessions/0190aaaa-0000-7000-8000-000000000000/cancel",
            &json!({}),
        )
        .await;
    assert_error(&r, 404, "not_found", None);
}

#[tokio::test]
async fn cancel_a_running_session_notifies_workers() {
    let env = Env::start().await;
    let (_, b) = env.post("/v1/sessions", &json!({"prompt": "long"})).await;
    let id = b["id"].as_str().unwrap().to_string();
    let claim = env
        .store
        .claim(&id, "worker-1", Duration::from_secs(30), 5)
        .await
        .unwrap();
    assert!(matches!(claim, agentq_core::Claim::Acquired { .. }));

    let mut cancels = env.queue.subscribe_signals().await.unwrap();
    let r = env
        .post(&format!("/v1/sessions/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(r.0, 202, "{}", r.1);
    assert_eq!(
        r.1,
        json!({"id": id, "status": "running", "cancel_requested": true})
    );
    let got = tokio::time::timeout(Duration::from_secs(5), cancels.next())
        .await
        .expect("cancel within 5 s");
    assert_eq!(got, Some(WorkerSignal::Cancel(id.clone())));
    assert!(env.store.get(&id).await.unwrap().unwrap().cancel_requested);
}

/// Cancelling a parent waiting for its child cancels both now, and lets both event
/// streams expire: no worker settles a session cancelled while it waited, and the stream
/// its earlier runs wrote would otherwise be kept for good.
#[tokio::test]
async fn cancelling_a_parent_cancels_its_children() {
    let env = Env::start().await;
    let parent = NewSession::root(SessionSpec::new("parent"), "default");
    env.store.create_session(&parent).await.unwrap();
    let agentq_core::Claim::Acquired { lease, row, .. } = env
        .store
        .claim(&parent.id, "w1", Duration::from_secs(30), 10)
        .await
        .unwrap()
    else {
        panic!("claim the parent");
    };
    let child = NewSession {
        id: agentq_core::model::new_session_id(),
        spec: SessionSpec::new("child"),
        queue: "default".into(),
        parent_id: Some(parent.id.clone()),
        root_id: parent.id.clone(),
        depth: 1,
        idempotency_key: None,
        idempotency_hash: None,
        tenant: parent.tenant.clone(),
        sched: Default::default(),
        files: Vec::new(),
        workspace_from: None,
    };
    env.store.create_session(&child).await.unwrap();
    let waiting = env
        .store
        .suspend_for(&lease, row.wake_seq, WaitReason::Children, None)
        .await
        .unwrap();
    assert_eq!(waiting.status, SessionStatus::Waiting);
    // What the parent's run wrote, and a child's (one woken from a wait of its own).
    for id in [&parent.id, &child.id] {
        env.queue
            .append_events(&[EventRecord {
                session_id: id.clone(),
                id: String::new(),
                seq: 1,
                epoch: 1,
                data: r#"{"type":"iteration_started","iteration":1}"#.into(),
            }])
            .await
            .unwrap();
    }
    let stream_ttl = async |id: &str| {
        pttl(&env.redis.url(), &agentq_core::queue::events_stream(id))
            .await
            .unwrap()
    };
    assert_eq!(stream_ttl(&parent.id).await, -1);

    let (_, view) = env.get(&format!("/v1/sessions/{}", parent.id)).await;
    assert_eq!(view["children"], json!([child.id]));

    let r = env
        .post(&format!("/v1/sessions/{}/cancel", parent.id), &json!({}))
        .await;
    assert_eq!(r.0, 200, "{}", r.1);
    assert_eq!(r.1["status"], "cancelled", "{}", r.1);
    let c = env.store.get(&child.id).await.unwrap().unwrap();
    assert_eq!(c.status, SessionStatus::Cancelled);
    for id in [&parent.id, &child.id] {
        let left = stream_ttl(id).await;
        assert!(left > 0, "the stream of {id} expires in {left} ms");
    }
}

#[tokio::test]
async fn bad_requests_get_documented_errors_and_write_nothing() {
    let env = Env::start().await;
    let post = |body: Value| {
        let env = &env;
        async move { env.post("/v1/sessions", &body).await }
    };

    let r = env
        .post_raw(
            "/v1/sessions",
            "application/json",
            b"{\"prompt\": \"x\",".to_vec(),
        )
        .await;
    assert_error(&r, 400, "invalid_json", None);
    let r = env
        .post_raw("/v1/sessions", "application/json", b"".to_vec())
        .await;
    assert_error(&r, 400, "invalid_json", None);
    let r = env
        .post_raw(
            "/v1/sessions",
            "text/plain",
            b"{\"prompt\": \"x\"}".to_vec(),
        )
        .await;
    assert_error(&r, 415, "unsupported_media_type", None);

    let r = post(json!({"prompt": "p", "mode": "yolo"})).await;
    assert_error(&r, 422, "invalid_field", Some("mode"));
    let msg = r.1["error"]["message"].as_str().unwrap();
    assert!(msg.contains("act") && msg.contains("plan-act"), "{msg}");

    let r = post(json!({"prompt": "p", "max_iterations": -1})).await;
    assert_error(&r, 422, "invalid_field", Some("max_iterations"));
    let r = post(json!({"prompt": "p", "max_iterations": 0})).await;
    assert_error(&r, 422, "invalid_field", Some("max_iterations"));
    let r = post(json!({"prompt": "p", "max_tokens": -10})).await;
    assert_error(&r, 422, "invalid_field", Some("max_tokens"));
    let r = post(json!({"prompt": "p", "temperature": 5})).await;
    assert_error(&r, 422, "invalid_field", Some("temperature"));
    let r = post(json!({"prompt": "x".repeat(1_000_001)})).await;
    assert_error(&r, 413, "too_large", Some("prompt"));
    let r = post(json!({"prompt": "p", "queue": "no spaces"})).await;
    assert_error(&r, 422, "invalid_field", Some("queue"));
    let r = post(json!({"prompt": "p", "queue": "a:b"})).await;
    assert_error(&r, 422, "invalid_field", Some("queue"));
    let r = post(json!({"prompt": "p", "api_key": "sk-live"})).await;
    assert_error(&r, 422, "credential_not_allowed", Some("api_key"));
    assert!(!r.1.to_string().contains("sk-live"));
    let r = post(json!({"prompt": "p", "provider": "bard"})).await;
    assert_error(&r, 422, "invalid_field", Some("provider"));
    let r = post(json!({"prompt": "   "})).await;
    assert_error(&r, 422, "invalid_field", Some("prompt"));
    let r = post(json!({"model": "m"})).await;
    assert_error(&r, 422, "invalid_field", Some("prompt"));
    let r = post(json!({"prompt": "p", "tools": "shell"})).await;
    assert_error(&r, 422, "invalid_field", Some("tools"));
    let r = post(json!({"prompt": "p", "max_iteratons": 3})).await;
    assert_error(&r, 422, "unknown_field", Some("max_iteratons"));

    let unknown = "0190aaaa-0000-7000-8000-000000000000";
    assert_error(
        &env.get(&format!("/v1/sessions/{unknown}")).await,
        404,
        "not_found",
        None,
    );
    assert_error(
        &env.get(&format!("/v1/sessions/{unknown}/messages")).await,
        404,
        "not_found",
        None,
    );
    assert_error(&env.get("/v1/nope").await, 404, "not_found", None);
    let r = read(
        env.http
            .delete(env.url("/v1/sessions"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_error(&r, 405, "method_not_allowed", None);

    assert_eq!(env.row_count(), 0);
    assert_eq!(env.stream_len("default").await, 0);
}

#[tokio::test]
async fn steering_and_approval_bodies_are_checked_and_answers_keep_their_shape() {
    let env = Env::start().await;
    let unknown = "0190aaaa-0000-7000-8000-000000000000";
    let r = env
        .post(
            &format!("/v1/sessions/{unknown}/messages"),
            &json!({"content": "x"}),
        )
        .await;
    assert_error(&r, 404, "not_found", None);

    let (_, b) = env
        .post("/v1/sessions", &json!({"prompt": "p", "temperature": 0.7}))
        .await;
    let id = b["id"].as_str().unwrap().to_string();
    let messages = format!("/v1/sessions/{id}/messages");
    let r = env
        .post(&messages, &json!({"content": "x", "strategy": "shout"}))
        .await;
    assert_error(&r, 422, "invalid_field", Some("strategy"));
    let msg = r.1["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("inject, enqueue, interrupt or reject"),
        "{msg}"
    );
    let r = env
        .post(&messages, &json!({"content": "x", "extra": 1}))
        .await;
    assert_error(&r, 422, "unknown_field", Some("extra"));
    let r = env.post(&messages, &json!({"content": "  "})).await;
    assert_error(&r, 422, "invalid_field", Some("content"));
    let r = env.post(&messages, &json!({"strategy": "inject"})).await;
    assert_error(&r, 422, "invalid_field", Some("content"));
    let r = env.post(&messages, &json!(["x"])).await;
    assert_error(&r, 422, "invalid_body", None);
    // An oversize message is refused as such, even with another field also wrong.
    let r = env
        .post(
            &messages,
            &json!({"content": "x".repeat(1_000_001), "strategy": "shout"}),
        )
        .await;
    assert_error(&r, 413, "too_large", Some("content"));

    let (s, b) = env
        .post(
            &messages,
            &json!({"content": "also this", "strategy": "inject"}),
        )
        .await;
    assert_eq!(s, 202, "{b}");
    assert_eq!(
        b,
        json!({"id": id, "status": "queued", "delivery": "inject", "seq": b["seq"]})
    );
    assert!(b["seq"].is_u64(), "{b}");

    let approvals = format!("/v1/sessions/{id}/approvals");
    let r = env.post(&approvals, &json!({"approve": "yes"})).await;
    assert_error(&r, 422, "invalid_field", Some("tool_call_id"));
    let r = env
        .post(&approvals, &json!({"tool_call_id": "c1", "approve": "yes"}))
        .await;
    assert_error(&r, 422, "invalid_field", Some("approve"));
    let r = env
        .post(
            &approvals,
            &json!({"tool_call_id": "nope", "approve": true}),
        )
        .await;
    assert_error(&r, 422, "invalid_field", Some("tool_call_id"));
    let r = env
        .post(
            &approvals,
            &json!({"tool_call_id": "nope", "approve": true, "why": "x"}),
        )
        .await;
    assert_error(&r, 422, "unknown_field", Some("why"));

    let (s, tree) = env.get(&format!("/v1/sessions/{id}/tree")).await;
    assert_eq!(s, 200, "{tree}");
    assert_eq!(tree["id"], id.as_str());
    assert_eq!(tree["children"], json!([]));

    // Views go out as they always have: keys sorted, an f32 written through its f64.
    let text = env
        .http
        .get(env.url(&format!("/v1/sessions/{id}")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(text, v.to_string());
    assert!(
        text.contains(r#""temperature":0.699999988079071"#),
        "{text}"
    );
    let text = env
        .http
        .get(env.url("/v1/sessions/nope"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        text,
        r#"{"error":{"code":"not_found","field":null,"message":"session nope not found"}}"#
    );
}

#[tokio::test]
async fn sweeper_adds_entries_the_enqueue_missed() {
    let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let redis = RedisServer::start().unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());

    // One pass by hand: a row without an entry (the crash between insert and XADD).
    let (row, _) = store
        .create_session(&NewSession::root(SessionSpec::new("lost"), "default"))
        .await
        .unwrap();
    let registry = QueueRegistry::new(vec!["default".into()]);
    let n = sweep_once(store.as_ref(), queue.as_ref(), &registry, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(queue.stats("default").await.unwrap().length, 1);
    // Marked: the next pass leaves it alone.
    let n = sweep_once(store.as_ref(), queue.as_ref(), &registry, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(n, 0);
    assert!(
        store
            .unenqueued(Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let _ = row;

    // The whole scheduler: `run` creates the configured groups, serves, sweeps, stops.
    let settings = SchedulerSettings {
        sweep_interval: Duration::from_millis(100),
        sweep_age: Duration::ZERO,
        queues: vec!["default".into(), "reports".into()],
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let token = CancellationToken::new();
    let server = tokio::spawn(agentq_scheduler::run(
        store.clone(),
        queue.clone(),
        settings,
        listener,
        None,
        token.clone(),
    ));
    wait_until("the reports group", Duration::from_secs(10), || async {
        queue.stats("reports").await.is_ok_and(|s| s.lag == Some(0))
    })
    .await;
    store
        .create_session(&NewSession::root(SessionSpec::new("lost 2"), "reports"))
        .await
        .unwrap();
    wait_until("the sweeper", Duration::from_secs(10), || async {
        queue.stats("reports").await.unwrap().length == 1
    })
    .await;
    let r = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "ok");

    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("run stops on the token")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn readiness_follows_redis_and_draining() {
    let mut env = Env::start().await;
    let (s, b) = env.get("/readyz").await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["status"], "ready");
    let (s, _) = env.get("/healthz").await;
    assert_eq!(s, 200);

    env.redis.stop().unwrap();
    let (s, b) = env.get("/readyz").await;
    assert_eq!(s, 503, "{b}");
    assert_eq!(b["down"], json!(["redis"]));
    // Liveness does not depend on the backends.
    assert_eq!(env.get("/healthz").await.0, 200);

    env.redis.restart().unwrap();
    wait_until("ready again", Duration::from_secs(10), || async {
        env.get("/readyz").await.0 == 200
    })
    .await;

    env.state.begin_drain();
    let (s, b) = env.get("/readyz").await;
    assert_eq!(s, 503);
    assert_eq!(b["status"], "draining");
}

#[tokio::test]
async fn a_redis_outage_does_not_lose_a_created_session() {
    let mut env = Env::start().await;
    env.redis.stop().unwrap();
    let (s, b) = env
        .post("/v1/sessions", &json!({"prompt": "durable"}))
        .await;
    assert_eq!(s, 201, "the row is committed, so the request succeeds: {b}");
    let id = b["id"].as_str().unwrap().to_string();
    assert!(!env.enqueued(&id));

    env.redis.restart().unwrap();
    let registry = QueueRegistry::new(vec!["default".into()]);
    wait_until(
        "the sweeper to enqueue",
        Duration::from_secs(10),
        || async {
            sweep_once(
                env.store.as_ref(),
                env.queue.as_ref(),
                &registry,
                Duration::ZERO,
            )
            .await
            .is_ok_and(|n| n == 1)
        },
    )
    .await;
    assert_eq!(env.stream_len("default").await, 1);
    assert!(env.enqueued(&id));
}

#[tokio::test]
async fn sessions_are_re_added_after_redis_comes_back_empty() {
    use agentq_scheduler::sweeper::recover_lost;
    let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let mut redis = RedisServer::start().unwrap();
    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
    let registry = QueueRegistry::new(vec!["default".into()]);
    registry.ensure(&queue, "default").await;
    queue.mark_queue("default").await.unwrap();

    let mut ids = Vec::new();
    for i in 0..3 {
        let (row, _) = store
            .create_session(&NewSession::root(
                SessionSpec::new(format!("s{i}")),
                "default",
            ))
            .await
            .unwrap();
        queue
            .enqueue("default", &row.id, agentq_core::EnqueueReason::New)
            .await
            .unwrap();
        store
            .mark_enqueued(std::slice::from_ref(&row.id))
            .await
            .unwrap();
        ids.push(row.id);
    }
    // Nothing lost yet: recovery and a sweep change nothing.
    recover_lost(&store, &queue, &registry).await;
    assert_eq!(
        sweep_once(&store, &queue, &registry, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
    assert_eq!(queue.stats("default").await.unwrap().length, 3);

    // Redis restarts without persistence: the entries are gone.
    redis.restart().unwrap();
    wait_until("redis back", Duration::from_secs(10), || async {
        queue.ping().await.is_ok()
    })
    .await;
    assert_eq!(queue.stats("default").await.unwrap().length, 0);
    recover_lost(&store, &queue, &registry).await;
    assert_eq!(
        sweep_once(&store, &queue, &registry, Duration::ZERO)
            .await
            .unwrap(),
        3
    );
    let entries = queue
        .read(&["default".to_string()], "c1", 10, Duration::ZERO)
        .await
        .unwrap();
    let mut got: Vec<String> = entries.into_iter().map(|d| d.session_id).collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    // Marked again: the next pass adds nothing more.
    recover_lost(&store, &queue, &registry).await;
    assert_eq!(
        sweep_once(&store, &queue, &registry, Duration::ZERO)
            .await
            .unwrap(),
        0
    );
}

/// Queues are the operator's: a session naming a queue nobody configured or created is
/// refused naming `queue` (one request and a batch item), with nothing written and no
/// stream made; an admin creates one (stored, so it survives and every scheduler sees
/// it), after which sessions may name it; past `scheduler.max_queues` no more are made.
#[tokio::test]
async fn queues_are_configured_or_created_by_an_admin() {
    let env = Env::start_with(SchedulerSettings {
        queues: vec!["default".into()],
        max_queues: 3,
        ..Default::default()
    })
    .await;
    let (status, v) = env
        .post("/v1/sessions", &json!({"prompt": "p", "queue": "invented"}))
        .await;
    assert_error(&(status, v.clone()), 422, "invalid_field", Some("queue"));
    assert!(
        v["error"]["message"].as_str().unwrap().contains("invented"),
        "{v}"
    );
    let (status, v) = env
        .post(
            "/v1/sessions/batch",
            &json!([{"prompt": "p"}, {"prompt": "p", "queue": "invented"}]),
        )
        .await;
    assert_error(&(status, v), 422, "invalid_field", Some("[1].queue"));
    assert_eq!(env.row_count(), 0);
    assert_eq!(env.stream_len("invented").await, 0);

    // A bad name, and a configured queue (nothing to create).
    let (status, v) = env.post("/v1/queues", &json!({"name": "a b"})).await;
    assert_error(&(status, v), 422, "invalid_field", Some("name"));
    let (status, v) = env.post("/v1/queues", &json!({"name": "default"})).await;
    assert_eq!((status, &v["created"]), (200, &json!(false)), "{v}");

    let (status, v) = env.post("/v1/queues", &json!({"name": "invented"})).await;
    assert_eq!(
        (status, &v),
        (201, &json!({"name": "invented", "created": true}))
    );
    let (status, v) = env.post("/v1/queues", &json!({"name": "invented"})).await;
    assert_eq!((status, &v["created"]), (200, &json!(false)), "{v}");
    let (status, v) = env
        .post("/v1/sessions", &json!({"prompt": "p", "queue": "invented"}))
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(env.stream_len("invented").await, 1);

    // Another scheduler on the same store knows it too.
    let other = Scheduler::new(
        env.store.clone(),
        env.queue.clone(),
        SchedulerSettings::default(),
    );
    other
        .queues()
        .check_known(env.store.as_ref(), "invented", "queue")
        .await
        .unwrap();

    // The cap: `default` and `invented` exist, one more fits.
    let (status, v) = env.post("/v1/queues", &json!({"name": "third"})).await;
    assert_eq!(status, 201, "{v}");
    let (status, v) = env.post("/v1/queues", &json!({"name": "fourth"})).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["field"], "name", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("scheduler.max_queues"),
        "{v}"
    );
    let (status, v) = env
        .post("/v1/sessions", &json!({"prompt": "p", "queue": "fourth"}))
        .await;
    assert_error(&(status, v), 422, "invalid_field", Some("queue"));
    let (status, v) = env.get("/v1/queues").await;
    assert_eq!(
        (status, v),
        (
            200,
            json!({"queues": ["default", "invented", "third"], "max_queues": 3})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_and_batch_caps_are_checked_and_shown() {
    let env = Env::start().await;
    for bad in [json!(10), json!(-1), json!(2.5), json!("high"), json!(true)] {
        let (s, v) = env
            .post("/v1/sessions", &json!({"prompt": "p", "priority": bad}))
            .await;
        assert_eq!(s, 422, "{bad}: {v}");
        assert_eq!(v["error"]["field"], "priority", "{v}");
    }
    let (s, v) = env
        .post(
            "/v1/sessions/batch",
            &json!([{"prompt": "a"}, {"prompt": "b", "priority": 99}]),
        )
        .await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v["error"]["field"], "[1].priority", "{v}");
    for bad in ["0", "-3", "x", "99999999999"] {
        let (s, v) = env
            .post(
                &format!("/v1/sessions/batch?max_running={bad}"),
                &json!([{"prompt": "a"}]),
            )
            .await;
        assert_eq!(s, 422, "{bad}: {v}");
        assert_eq!(v["error"]["field"], "max_running", "{v}");
    }

    let (s, v) = env
        .post("/v1/sessions", &json!({"prompt": "p", "priority": 8}))
        .await;
    assert_eq!(s, 201, "{v}");
    let (_, view) = env
        .get(&format!("/v1/sessions/{}", v["id"].as_str().unwrap()))
        .await;
    assert_eq!(view["priority"], 8);
    assert_eq!(view["batch_id"], Value::Null);
    // An idempotency key repeated with another priority is another request.
    let keyed = json!({"prompt": "p", "idempotency_key": "prio-1", "priority": 7});
    let (s, first) = env.post("/v1/sessions", &keyed).await;
    assert_eq!(s, 201, "{first}");
    let (s, again) = env.post("/v1/sessions", &keyed).await;
    assert_eq!((s, &again["id"]), (200, &first["id"]), "{again}");
    let (s, v) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "idempotency_key": "prio-1", "priority": 2}),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["field"], "idempotency_key", "{v}");
    let (s, v) = env
        .post(
            "/v1/sessions/batch?max_running=2",
            &json!([{"prompt": "a"}, {"prompt": "b", "priority": 0}]),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let a = v["sessions"][0]["id"].as_str().unwrap().to_string();
    let b = v["sessions"][1]["id"].as_str().unwrap().to_string();
    let (_, va) = env.get(&format!("/v1/sessions/{a}")).await;
    let (_, vb) = env.get(&format!("/v1/sessions/{b}")).await;
    assert_eq!(
        (va["priority"].clone(), vb["priority"].clone()),
        (json!(5), json!(0))
    );
    assert!(va["batch_id"].is_string());
    assert_eq!(va["batch_id"], vb["batch_id"]);

    // A retry of a session that is not failed is a 409 with a JSON body; a missing one 404.
    let (s, v) = env
        .post(&format!("/v1/sessions/{a}/retry"), &json!({}))
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["code"], "not_failed");
    let (s, v) = env
        .post(
            "/v1/sessions/00000000-0000-7000-8000-000000000000/retry",
            &json!({}),
        )
        .await;
    assert_eq!(s, 404, "{v}");
}
