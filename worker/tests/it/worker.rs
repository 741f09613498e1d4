//! The worker in process against real Postgres and Redis, with the scripted provider.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentq_agent::spec::SessionSpec;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{EnqueueReason, NewSession, QueueHealth, SessionStatus, SessionStore, WorkQueue};
use agentq_testkit::{RedisServer, pttl, shared_postgres};
use agentq_worker::{Processed, Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;

use common::{read_entry, run_one, setup, start, wait_terminal, wait_until};

const SCRIPT: &str = r#"{"turns":[
  {"text":"listing","tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":10,"output_tokens":3}},
  {"text":"done: {{prompt}}","usage":{"input_tokens":20,"output_tokens":4}}
]}"#;

fn config(dir: &std::path::Path) -> WorkerSettings {
    let mut cfg = WorkerSettings {
        concurrency: 8,
        read_block: Duration::from_millis(200),
        heartbeat_interval: Duration::from_millis(300),
        lease_ttl: Duration::from_secs(2),
        reclaim_min_idle: Duration::from_secs(2),
        reclaim_interval: Duration::from_millis(500),
        workspace_root: dir.to_path_buf(),
        ..WorkerSettings::default()
    };
    // The scripted model is opted into, never the default.
    cfg.default_provider = Some("scripted".into());
    cfg.providers.script = Some(SCRIPT.into());
    cfg
}

/// A policy that also allows `tools` (the default allows the read-only ones).
fn allowing(tools: &[&str]) -> Arc<agentq_core::policy::Policy> {
    let mut section = agentq_core::config::PolicySection::default();
    section.tools.extend(tools.iter().map(|t| t.to_string()));
    Arc::new(agentq_core::policy::Policy::from_section(&section).unwrap())
}

async fn submit(store: &PgStore, queue: &RedisQueue, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let s = NewSession::root(SessionSpec::new(format!("task {i}")), "default");
        let (row, _) = store.create_session(&s).await.unwrap();
        queue
            .enqueue("default", &row.id, EnqueueReason::New)
            .await
            .unwrap();
        ids.push(row.id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_complete_and_duplicates_run_once() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let ids = submit(&store, &queue, 20).await;
    // A duplicate entry for the first session.
    queue
        .enqueue("default", &ids[0], EnqueueReason::Retry)
        .await
        .unwrap();
    let running = start(&store, &queue, config(dir.path()));
    wait_terminal(&store, &queue, &ids, Duration::from_secs(60)).await;
    for id in &ids {
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(row.iteration, 2);
        assert_eq!(row.usage.input_tokens, 30);
        let msgs = store.messages(id).await.unwrap();
        assert_eq!(msgs.len(), 4, "user, assistant+call, tool result, answer");
        assert!(msgs[3].content.starts_with("done: task"));
    }
    // The duplicate ran nothing: still exactly 4 messages and 2 iterations above, and
    // once every entry (the duplicate too) is delivered and acked, still 20 runs.
    wait_until("every entry handled", Duration::from_secs(30), || async {
        let stats = queue.stats("default").await.unwrap();
        if stats.pending == 0 && stats.lag == Some(0) {
            Ok(())
        } else {
            Err(stats)
        }
    })
    .await;
    assert_eq!(
        running
            .worker
            .stats()
            .completed
            .load(std::sync::atomic::Ordering::SeqCst),
        20
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_to_start_on_a_schema_that_is_behind() {
    let url = shared_postgres().unwrap().fresh_database().unwrap();
    let store = PgStore::connect(&url, 2).await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::new(Arc::new(store), Arc::new(queue), config(dir.path()));
    let err = worker.run(CancellationToken::new()).await.unwrap_err();
    assert!(err.to_string().contains("agentq migrate"), "{err}");
}

/// A session the worker cannot build (here a tool nobody has) fails at once with the
/// reason, through the run's own fenced checkpoint, and is settled like any finished one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_cannot_be_built_fails_with_the_reason() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SessionSpec::new("use a tool that is not there");
    spec.tools = Some(vec!["no_such_tool".into()]);
    // The policy allows it: building is what fails.
    let mut cfg = config(dir.path());
    cfg.policy = allowing(&["no_such_tool"]);
    let (done, worker) = run_one(&store, &queue, cfg, spec).await;
    assert_eq!(done.status, SessionStatus::Failed, "{done:?}");
    let error = done.error.clone().unwrap_or_default();
    assert!(error.contains("no_such_tool"), "{error}");
    assert_eq!(done.iteration, 0);
    assert_eq!(done.lease_owner, None);
    assert_eq!(
        worker
            .stats()
            .completed
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// An embedding program's own tool: counts its calls.
struct Stamp(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait::async_trait]
impl agentq_agent::tools::Tool for Stamp {
    fn name(&self) -> &str {
        "stamp"
    }
    fn description(&self) -> &str {
        "stamps the task"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    fn side_effect(&self, _args: &serde_json::Value) -> agentq_agent::tools::SideEffect {
        agentq_agent::tools::SideEffect::Pure
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        ctx: &agentq_agent::tools::ToolContext,
    ) -> Result<agentq_agent::tools::ToolOutput, agentq_agent::tools::ToolError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(agentq_agent::tools::ToolOutput::ok(format!(
            "stamped {}",
            ctx.idempotency_key
        )))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_call_the_embedding_programs_own_tools() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut cfg = config(dir.path());
    cfg.tools.register(Arc::new(Stamp(calls.clone())));
    cfg.policy = allowing(&["stamp"]);
    cfg.providers.script = Some(
        r#"{"turns":[
          {"text":"stamping","tool_calls":[{"name":"stamp","arguments":{}}]},
          {"text":"stamped"}
        ]}"#
        .into(),
    );
    let mut spec = SessionSpec::new("stamp it");
    spec.tools = Some(vec!["stamp".into(), "read_file".into()]);
    let (done, _) = run_one(&store, &queue, cfg, spec).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("stamped"));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    let messages = store.messages(&done.id).await.unwrap();
    let result = messages
        .iter()
        .find(|m| m.role == agentq_agent::schema::Role::Tool)
        .unwrap();
    assert_eq!(result.content, format!("stamped {}:call_0_0", done.id));
}

async fn pending(queue: &RedisQueue, consumer: &str) -> usize {
    queue
        .read_own_pending(&["default".to_string()], consumer, 100)
        .await
        .unwrap()
        .len()
}

/// How many completions were published (each is also added to the completions stream).
async fn completions_published(redis: &RedisServer) -> usize {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("XLEN")
        .arg(agentq_core::queue::COMPLETIONS_STREAM)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// `Worker::process` drives one delivery to its end on the test's task, without the run
/// loop: the session completes and its entry is acknowledged once (at the claim, which
/// settling does not repeat), and its event stream expires (the expiry set by the event
/// writer, behind the run's events); processing it again finds it finished and
/// announced, and only acks it (its completion is not published twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_runs_one_delivery_to_completion_and_acks_it() {
    let (store, queue, redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let ids = submit(&store, &queue, 1).await;
    let worker = Worker::new(store.clone(), queue.clone(), config(dir.path()));
    let d = read_entry(&queue, worker.consumer(), &ids[0]).await;
    assert_eq!(pending(&queue, worker.consumer()).await, 1);

    let before = redis.command_calls("xack").unwrap();
    let done = worker.process(d.clone()).await.unwrap();
    assert_eq!(done, Processed::Finished { acked: true });
    assert_eq!(
        redis.command_calls("xack").unwrap() - before,
        1,
        "one ack per run"
    );
    let row = store.get(&ids[0]).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_eq!(row.iteration, 2);
    assert_eq!(store.messages(&ids[0]).await.unwrap().len(), 4);
    assert_eq!(pending(&queue, worker.consumer()).await, 0);
    assert_eq!(worker.stats().completed.load(Ordering::SeqCst), 1);

    assert_eq!(completions_published(&redis).await, 1);
    let stream = agentq_core::queue::events_stream(&ids[0]);
    common::wait_until(
        "the event stream's expiry",
        Duration::from_secs(30),
        || async {
            let left = pttl(&redis.url(), &stream).await.unwrap();
            if left > 0 { Ok(()) } else { Err(left) }
        },
    )
    .await;

    // A redelivery of a finished session runs nothing and publishes nothing.
    assert_eq!(
        worker.process(d).await.unwrap(),
        Processed::Finished { acked: true }
    );
    assert_eq!(store.messages(&ids[0]).await.unwrap().len(), 4);
    assert_eq!(worker.stats().completed.load(Ordering::SeqCst), 1);
    assert_eq!(completions_published(&redis).await, 1);
}

/// A tool that is not read-only (so the response that called it is committed before it
/// runs) but safe to run again, whose first call never returns: the crash point.
struct Hang {
    calls: Arc<AtomicUsize>,
    entered: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl agentq_agent::tools::Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn description(&self) -> &str {
        "hangs the first time"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    fn side_effect(&self, _args: &serde_json::Value) -> agentq_agent::tools::SideEffect {
        agentq_agent::tools::SideEffect::Idempotent
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: &agentq_agent::tools::ToolContext,
    ) -> Result<agentq_agent::tools::ToolOutput, agentq_agent::tools::ToolError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(agentq_agent::tools::ToolOutput::ok("done hanging"))
    }
}

/// Processing dropped in the middle of a session (its first response committed, its tool
/// call running) stands for a worker that died there: nothing is settled, and once the
/// dead worker's liveness row (made at its claim; it never beat) expires, another worker
/// re-queues the session from the store and resumes it from that checkpoint, without
/// asking the model for the committed response again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_dropped_mid_run_is_resumed_by_another_worker() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let cfg = || {
        let mut cfg = config(dir.path());
        cfg.tools.register(Arc::new(Hang {
            calls: calls.clone(),
            entered: entered.clone(),
        }));
        cfg.policy = allowing(&["hang"]);
        cfg.providers.script = Some(
            r#"{"turns":[
              {"text":"hanging","tool_calls":[{"name":"hang","arguments":{}}]},
              {"text":"resumed"}
            ]}"#
            .into(),
        );
        cfg
    };
    let mut spec = SessionSpec::new("hang, then finish");
    spec.tools = Some(vec!["hang".into()]);
    let (row, _) = store
        .create_session(&NewSession::root(spec, "default"))
        .await
        .unwrap();
    queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();

    let first = Worker::new(store.clone(), queue.clone(), cfg());
    let d = read_entry(&queue, first.consumer(), &row.id).await;
    let crashing = tokio::spawn({
        let first = first.clone();
        async move { first.process(d).await }
    });
    tokio::time::timeout(Duration::from_secs(20), entered.notified())
        .await
        .unwrap();
    crashing.abort();
    assert!(crashing.await.unwrap_err().is_cancelled());
    let mid = store.get(&row.id).await.unwrap().unwrap();
    assert_eq!(mid.status, SessionStatus::Running, "{mid:?}");
    assert_eq!(mid.iteration, 1, "the response with the call is committed");
    // The entry was acked at the claim: the store alone knows the session runs.
    assert_eq!(pending(&queue, first.consumer()).await, 0);

    let second = start(&store, &queue, cfg());
    wait_terminal(
        &store,
        &queue,
        std::slice::from_ref(&row.id),
        Duration::from_secs(30),
    )
    .await;
    let second = second.stop().await;
    let done = store.get(&row.id).await.unwrap().unwrap();
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("resumed"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the unfinished call ran again"
    );
    assert_eq!(second.stats().resumed.load(Ordering::SeqCst), 1);
    let messages = store.messages(&row.id).await.unwrap();
    assert_eq!(
        messages.len(),
        4,
        "user, assistant+call, tool result, answer"
    );
    assert_eq!(
        messages
            .iter()
            .filter(|m| m.role == agentq_agent::schema::Role::Assistant)
            .count(),
        2
    );
    // Settled by the second worker: nothing pending anywhere.
    assert_eq!(pending(&queue, first.consumer()).await, 0);
    assert_eq!(pending(&queue, second.consumer()).await, 0);
}

/// A model that answers with NUL (which Postgres' text cannot hold), next to bystanders
/// on the same worker: every session completes, and the NUL reads back intact in the
/// transcript and the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_answering_with_nul_completes_and_reads_back_intact() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.providers.script = Some(
        r#"{"turns":[
          {"text":"thinking \u0000 aloud","tool_calls":[{"name":"list_dir","arguments":{"path":".\u0000"}}]},
          {"text":"done \u0000 {{prompt}}"}
        ]}"#
        .into(),
    );
    let ids = submit(&store, &queue, 6).await;
    let running = start(&store, &queue, cfg);
    wait_terminal(&store, &queue, &ids, Duration::from_secs(60)).await;
    running.stop().await;
    for id in &ids {
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        let msgs = store.messages(id).await.unwrap();
        assert_eq!(msgs.len(), 4, "{msgs:?}");
        assert_eq!(msgs[1].content, "thinking \0 aloud");
        assert_eq!(msgs[1].tool_calls[0].arguments.value()["path"], ".\0");
        assert!(msgs[3].content.starts_with("done \0 task"), "{msgs:?}");
        assert_eq!(row.result.as_deref(), Some(msgs[3].content.as_str()));
    }
}

/// A step the database refuses as data (here a trigger raising SQLSTATE 22023 on one
/// session's answer, as Postgres does for a value it cannot hold) is not retried: that
/// session fails at once with the reason and its lease given up, on its first delivery,
/// and the bystanders committing beside it on the same worker complete. Every one's event
/// stream expires, the failed one's too (the worker's drain writes the expiries last).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_stored_fails_its_session_with_the_reason() {
    let (store, queue, redis) = setup().await;
    sqlx::raw_sql(
        r#"CREATE FUNCTION refuse_poison() RETURNS trigger AS $$
           BEGIN
             IF NEW.body->>'role' = 'assistant' AND NEW.body::text LIKE '%refuse-me%' THEN
               RAISE EXCEPTION 'value refused' USING ERRCODE = '22023';
             END IF;
             RETURN NEW;
           END $$ LANGUAGE plpgsql;
           CREATE TRIGGER refuse_poison BEFORE INSERT ON messages
             FOR EACH ROW EXECUTE FUNCTION refuse_poison();"#,
    )
    .execute(store.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.providers.script = Some(r#"{"turns":[{"text":"done {{prompt}}"}]}"#.into());
    let bystanders = submit(&store, &queue, 6).await;
    let (poison, _) = store
        .create_session(&NewSession::root(SessionSpec::new("refuse-me"), "default"))
        .await
        .unwrap();
    queue
        .enqueue("default", &poison.id, EnqueueReason::New)
        .await
        .unwrap();
    let running = start(&store, &queue, cfg);
    let mut all = bystanders.clone();
    all.push(poison.id.clone());
    wait_terminal(&store, &queue, &all, Duration::from_secs(60)).await;
    running.stop().await;

    let row = store.get(&poison.id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    let error = row.error.clone().unwrap_or_default();
    assert!(
        error.contains("could not be stored") && error.contains("22023"),
        "{error}"
    );
    assert!(row.lease_owner.is_none());
    assert_eq!(
        row.attempts, 1,
        "failed on its first delivery, not dead-lettered"
    );
    for id in &bystanders {
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    }
    for id in &all {
        let left = pttl(&redis.url(), &agentq_core::queue::events_stream(id))
            .await
            .unwrap();
        assert!(left > 0, "{id}'s event stream expires in {left} ms");
    }
}

/// Sessions name their model: 500 distinct names must not become 500 label values on the
/// worker's `/metrics`. A model the operator configured (here the policy names it) keeps
/// its own; every other one is `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_cannot_add_model_series() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let section = agentq_core::config::PolicySection {
        models: vec!["*".into(), "named-by-policy".into()],
        ..Default::default()
    };
    let mut cfg = config(dir.path());
    cfg.policy = Arc::new(agentq_core::policy::Policy::from_section(&section).unwrap());
    let mut ids = Vec::new();
    for i in 0..500 {
        let mut spec = SessionSpec::new(format!("task {i}"));
        spec.model = Some(if i == 0 {
            "named-by-policy".to_string()
        } else {
            format!("caller-model-{i}")
        });
        let (row, _) = store
            .create_session(&NewSession::root(spec, "default"))
            .await
            .unwrap();
        ids.push(row.id);
    }
    let items: Vec<(String, EnqueueReason)> = ids
        .iter()
        .map(|id| (id.clone(), EnqueueReason::New))
        .collect();
    queue.enqueue_many("default", &items).await.unwrap();
    let running = start(&store, &queue, cfg);
    wait_terminal(&store, &queue, &ids, Duration::from_secs(300)).await;
    running.stop().await;

    let text = agentq_core::metrics::global().render();
    let model_series = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("model=\""))
        .count();
    assert!(
        !text.contains("caller-model-"),
        "a caller's model became a label value"
    );
    assert!(text.contains("model=\"other\""), "{text}");
    assert!(text.contains("model=\"named-by-policy\""), "{text}");
    // A handful of label sets (provider × model × outcome/type, and histogram buckets),
    // whatever the number of distinct models sessions named.
    assert!(
        model_series < 400,
        "{model_series} series carry a model label"
    );
}

/// `agentq_sessions_finished_total` on the default queue for `reason`.
fn finished_total(reason: &str) -> f64 {
    let label = format!("finish_reason=\"{reason}\"");
    agentq_core::metrics::global()
        .render()
        .lines()
        .filter(|l| l.starts_with("agentq_sessions_finished_total{"))
        .filter(|l| l.contains(&label) && l.contains("queue=\"default\""))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// A model that makes the same call every turn (as small real models do) is told so from
/// the second time on, and at the fifth the session ends `stuck` without running it: the
/// stored row, the transcript and the finish-reason counter all say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_repeating_one_call_ends_stuck_warned_and_counted() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.providers.script = Some(
        r#"{"turns":[{"text":"looking again",
            "tool_calls":[{"name":"list_dir","arguments":{"path":"."}}]}],
           "repeat_last":true}"#
            .into(),
    );
    let before = finished_total("stuck");
    let (row, _) = run_one(&store, &queue, cfg, SessionSpec::new("what is here?")).await;

    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    assert_eq!(
        row.finish_reason,
        Some(agentq_agent::spec::ExitReason::Stuck),
        "{row:?}"
    );
    assert_eq!(row.iteration, 5, "ended at the fifth same call, not at 40");
    let error = row.error.clone().unwrap_or_default();
    assert!(
        error.contains("`list_dir` was called 5 times in a row"),
        "{error}"
    );
    let results: Vec<String> = store
        .messages(&row.id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role == agentq_agent::schema::Role::Tool)
        .map(|m| m.content)
        .collect();
    assert_eq!(results.len(), 5, "{results:#?}");
    assert!(!results[0].contains("[agentq:"), "{}", results[0]);
    for (i, r) in results[1..4].iter().enumerate() {
        assert!(
            r.contains(&format!(
                "[agentq: you have called `list_dir` with these same arguments {} times in a row",
                i + 2
            )),
            "{r}"
        );
    }
    assert!(results[4].starts_with("Not run:"), "{}", results[4]);
    assert_eq!(finished_total("stuck"), before + 1.0);
}
