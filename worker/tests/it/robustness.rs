//! Sessions that would crash a worker: numbers past any clock in a stored spec (a row
//! written before the API bounded them, or inserted directly) and tools that panic. Each
//! ends its own session, releases its lease and slot, and leaves the worker serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::spec::SessionSpec;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    EnqueueReason, InboxStore, SessionRow, SessionStatus, SessionStore, SweepStore, WorkQueue,
};
use agentq_worker::{Processed, Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;

use common::{read_entry, row, setup, submit, wait_until};

const SCRIPT: &str = r#"{"turns":[
  {"text":"listing","tool_calls":[{"name":"list_dir","arguments":{"path":"."}}]},
  {"text":"done: {{prompt}}"}
]}"#;

fn config(dir: &std::path::Path) -> WorkerSettings {
    let mut cfg = WorkerSettings {
        concurrency: 1,
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

/// `timeout_secs` of 9e15 used to panic computing the deadline inside the run: the
/// session stayed `running`, its lease renewed forever. Now the deadline is clamped and
/// the session runs to its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_past_the_clock_runs_to_completion() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), config(dir.path()));
    for secs in [9_000_000_000_000_000, u64::MAX] {
        let mut spec = SessionSpec::new("take your time");
        spec.timeout_secs = Some(secs);
        spec.tool_timeout_secs = u64::MAX;
        spec.retry_delay_ms = u64::MAX;
        spec.tool_output_max_chars = usize::MAX;
        let id = submit(&store, &queue, spec).await;
        let d = read_entry(&queue, worker.consumer(), &id).await;
        assert_eq!(
            worker.process(d).await.unwrap(),
            Processed::Finished { acked: true }
        );
        let done = row(&store, &id).await;
        assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
        assert_eq!(done.lease_owner, None);
        assert!(worker.active_sessions().is_empty());
    }
}

/// A huge `approval_timeout_secs` used to panic when the session suspended for the
/// approval, on every delivery until it was dead-lettered. Now its deadline is clamped:
/// the session waits for the human like any other and finishes once approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_approval_timeout_suspends_and_resumes() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), config(dir.path()));
    let mut spec = SessionSpec::new("list it once approved");
    spec.approval_timeout_secs = u64::MAX;
    spec.sensitive_tools = vec!["list_dir".into()];
    let id = submit(&store, &queue, spec).await;
    let d = read_entry(&queue, worker.consumer(), &id).await;
    assert_eq!(worker.process(d).await.unwrap(), Processed::Suspended);
    let waiting = row(&store, &id).await;
    assert_eq!(
        waiting.status,
        SessionStatus::AwaitingApproval,
        "{waiting:?}"
    );
    assert_eq!(waiting.lease_owner, None);
    let deadline = waiting.approval_deadline.expect("a deadline");
    assert!(
        deadline > chrono::Utc::now() + chrono::Duration::days(365 * 50),
        "{deadline}"
    );

    let held = store.messages(&id).await.unwrap()[1].tool_calls[0]
        .id
        .clone();
    store
        .decide_approval(&id, &held, true, None, None)
        .await
        .unwrap();
    queue
        .enqueue("default", &id, EnqueueReason::Resume)
        .await
        .unwrap();
    let d = read_entry(&queue, worker.consumer(), &id).await;
    assert_eq!(
        worker.process(d).await.unwrap(),
        Processed::Finished { acked: true }
    );
    let done = row(&store, &id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
}

/// A tool that panics.
struct Boom;

#[async_trait::async_trait]
impl agentq_agent::tools::Tool for Boom {
    fn name(&self) -> &str {
        "boom"
    }
    fn description(&self) -> &str {
        "panics"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    async fn call(
        &self,
        _args: serde_json::Value,
        _ctx: &agentq_agent::tools::ToolContext,
    ) -> Result<agentq_agent::tools::ToolOutput, agentq_agent::tools::ToolError> {
        panic!("the boom tool exploded");
    }
}

fn boom_config(dir: &std::path::Path) -> WorkerSettings {
    let mut cfg = config(dir);
    cfg.tools.register(Arc::new(Boom));
    let mut section = agentq_core::config::PolicySection::default();
    section.tools.push("boom".into());
    cfg.policy = Arc::new(agentq_core::policy::Policy::from_section(&section).unwrap());
    cfg.providers.script = Some(
        r#"{"turns":[
          {"text":"boom","tool_calls":[{"name":"boom","arguments":{}}]},
          {"text":"survived"}
        ]}"#
        .into(),
    );
    cfg
}

async fn wait_terminal(store: &PgStore, queue: &RedisQueue, id: &str) -> SessionRow {
    common::wait_terminal(store, queue, &[id.to_string()], Duration::from_secs(30))
        .await
        .remove(0)
}

/// A panic inside a tool fails that session with the panic's message, gives its lease
/// back, stops its heartbeat and frees its slot: the worker (one slot) goes on to run the
/// next session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_fails_its_session_and_the_worker_serves_on() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), boom_config(dir.path()));
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let (w, s) = (worker.clone(), stop.clone());
        async move { w.run(s).await }
    });

    let mut spec = SessionSpec::new("blow up");
    spec.tools = Some(vec!["boom".into()]);
    let id = submit(&store, &queue, spec).await;
    let failed = wait_terminal(&store, &queue, &id).await;
    assert_eq!(failed.status, SessionStatus::Failed, "{failed:?}");
    let error = failed.error.clone().unwrap_or_default();
    assert!(error.contains("the boom tool exploded"), "{error}");
    assert!(error.contains("panicked"), "{error}");
    assert_eq!(failed.lease_owner, None);

    // The one slot is free again: a bystander runs to its end (the script's call of
    // `boom` is not a tool it has, so it gets an error result and answers).
    let mut spec = SessionSpec::new("bystander");
    spec.tools = Some(vec!["list_dir".into()]);
    let other = submit(&store, &queue, spec).await;
    let done = wait_terminal(&store, &queue, &other).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.result.as_deref(), Some("survived"));
    // The row is final once the last checkpoint commits; the run lets go of its slot
    // just after (ack, completion): wait for that, not for the clock.
    wait_until(
        "the worker to hold no session",
        Duration::from_secs(10),
        || async { worker.active_sessions().is_empty() },
    )
    .await;

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// The same panic under `Worker::process` (the caller's task): the call returns, the
/// session is failed and acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_under_process_fails_the_session_and_returns() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::new(store.clone(), queue.clone(), boom_config(dir.path()));
    let mut spec = SessionSpec::new("blow up");
    spec.tools = Some(vec!["boom".into()]);
    let id = submit(&store, &queue, spec).await;
    let d = read_entry(&queue, worker.consumer(), &id).await;
    assert_eq!(
        worker.process(d).await.unwrap(),
        Processed::Finished { acked: true }
    );
    let failed = row(&store, &id).await;
    assert_eq!(failed.status, SessionStatus::Failed, "{failed:?}");
    assert!(
        failed
            .error
            .as_deref()
            .is_some_and(|e| e.contains("the boom tool exploded")),
        "{failed:?}"
    );
    assert_eq!(failed.lease_owner, None);
    assert!(worker.active_sessions().is_empty());
    // The history it had is kept, whole: the call that panicked has no result.
    let messages = store.messages(&id).await.unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
}

/// A model reporting `u64::MAX` tokens on every response: the counts saturate within what
/// the store holds, so each checkpoint is still written and the session completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_usage_from_the_model_is_stored_saturated() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.providers.script = Some(
        r#"{"turns":[
          {"text":"listing","tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":18446744073709551615,"output_tokens":18446744073709551615}},
          {"text":"done","usage":{"input_tokens":18446744073709551615,"output_tokens":18446744073709551615}}
        ]}"#
        .into(),
    );
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let id = submit(&store, &queue, SessionSpec::new("count this")).await;
    let d = read_entry(&queue, worker.consumer(), &id).await;
    assert_eq!(
        worker.process(d).await.unwrap(),
        Processed::Finished { acked: true }
    );
    let done = row(&store, &id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.usage.input_tokens, i64::MAX as u64);
    assert_eq!(done.lease_owner, None);
}

/// A model that names its call with a NUL (`"id": "c\u0000"`), which no Postgres text
/// holds: the approval of that call can never be read. The session used to suspend at
/// every wake, its approval deadline long past, for good; now the unreadable approval
/// counts as none, and past the deadline the call is refused as timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_id_the_store_cannot_hold_times_out_its_approval() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.providers.script = Some(
        r#"{"turns":[
          {"text":"listing","tool_calls":[{"id":"c\u0000x","name":"list_dir","arguments":{"path":"."}}]},
          {"text":"done"}
        ]}"#
        .into(),
    );
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let mut spec = SessionSpec::new("list it");
    spec.approval_timeout_secs = 1;
    spec.sensitive_tools = vec!["list_dir".into()];
    let id = submit(&store, &queue, spec).await;
    let d = read_entry(&queue, worker.consumer(), &id).await;
    assert_eq!(worker.process(d).await.unwrap(), Processed::Suspended);
    let waiting = row(&store, &id).await;
    assert_eq!(
        waiting.status,
        SessionStatus::AwaitingApproval,
        "{waiting:?}"
    );
    assert!(waiting.approval_deadline.is_some(), "a deadline");
    // What the sweeper does for a deadline that passed, at every sweep while it holds:
    // the first sweep past the deadline (the store's clock) wakes it.
    let mut woken = wait_until(
        "the approval deadline to pass",
        Duration::from_secs(30),
        || async {
            let woken = SweepStore::wake_expired_approvals(store.as_ref(), 10)
                .await
                .unwrap();
            if woken.is_empty() {
                Err(woken)
            } else {
                Ok(woken)
            }
        },
    )
    .await;
    for _ in 0..3 {
        if woken.is_empty() {
            break;
        }
        queue
            .enqueue("default", &id, EnqueueReason::Resume)
            .await
            .unwrap();
        let d = read_entry(&queue, worker.consumer(), &id).await;
        worker.process(d).await.unwrap();
        woken = SweepStore::wake_expired_approvals(store.as_ref(), 10)
            .await
            .unwrap();
    }
    let done = row(&store, &id).await;
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
}
