//! The SQLite file survives its process being SIGKILLed: every checkpoint the store
//! acknowledged is in the file when it is reopened, no checkpoint is half there, and an
//! embedded restart (`requeue_runnable` onto a fresh `MemQueue`, then a claim once the dead
//! process's lease expired) resumes the session from exactly that state.
//!
//! The child process is this test binary itself, run with `CHILD_DB` set so that only
//! `child_process_body` does anything: it claims the session and checkpoints one step after
//! another as fast as it can, printing `ACK <n>` after each acknowledged checkpoint; the
//! parent kills it mid-stream, while it is writing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use agentq_agent::schema::{Message, ToolCall, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::{Outcome, SessionState};
use agentq_core::mem_queue::MemQueue;
use agentq_core::sqlite::{SqliteStore, requeue_runnable};
use agentq_core::store::Store;
use agentq_core::{
    Claim, EnqueueReason, LeaseStore, NewSession, SessionStatus, SessionStore, SweepStore,
    WorkQueue,
};

const CHILD_DB: &str = "AGENTQ_TEST_SQLITE_CHILD_DB";
const CHILD_SESSION: &str = "AGENTQ_TEST_SQLITE_CHILD_SESSION";
/// The child's lease: short, so the parent's claim does not wait long after the kill.
const CHILD_TTL: Duration = Duration::from_millis(1500);
/// The parent kills the child once it has seen this many acknowledged checkpoints.
const KILL_AFTER: u64 = 300;
/// The child stops on its own here (only if nobody killed it).
const CHILD_MAX_STEPS: u64 = 200_000;

/// Step `n` (1-based) of the scripted run: odd steps are an assistant response with a
/// tool call (committed before the tool runs), even steps the tool's result.
fn apply_step(state: &mut SessionState, n: u64) {
    let call = format!("call_{}", n.div_ceil(2));
    if n % 2 == 1 {
        let mut reply = Message::assistant(format!("step {n}: reading notes"));
        reply.tool_calls = vec![ToolCall {
            id: call,
            name: "read_file".into(),
            arguments: json!({ "path": "notes.txt", "step": n }).into(),
        }];
        reply.usage = Some(Usage {
            input_tokens: 100,
            output_tokens: 10,
            ..Usage::default()
        });
        state.push_assistant(reply);
    } else {
        state.messages.push(Message::tool_result(
            call,
            "read_file",
            format!("notes at step {n}"),
            false,
        ));
    }
}

/// The state after `steps` steps, as the child built it.
fn state_after(id: &str, spec: &SessionSpec, steps: u64) -> SessionState {
    let mut state = SessionState::new(id, spec.clone());
    state.started_at = Some(started_at());
    for n in 1..=steps {
        apply_step(&mut state, n);
    }
    state
}

fn started_at() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap() + chrono::Duration::microseconds(678_901)
}

fn spec() -> SessionSpec {
    SessionSpec::new("survive a SIGKILL")
}

/// The child's work; a no-op in a normal test run.
#[tokio::test]
async fn child_process_body() {
    let (Ok(db), Ok(id)) = (std::env::var(CHILD_DB), std::env::var(CHILD_SESSION)) else {
        return;
    };
    let store = SqliteStore::open(Path::new(&db)).await.unwrap();
    let (lease, mut state) = match store.claim(&id, "child", CHILD_TTL, 10).await.unwrap() {
        Claim::Acquired { lease, state, .. } => (lease, *state),
        other => panic!("child: expected Acquired, got {other:?}"),
    };
    state.started_at = Some(started_at());
    let mut persisted = state.messages.len();
    let mut out = std::io::stdout();
    for n in 1..=CHILD_MAX_STEPS {
        apply_step(&mut state, n);
        store.checkpoint(&lease, &state, persisted).await.unwrap();
        persisted = state.messages.len();
        // Keep the lease alive while we run; it expires CHILD_TTL after the kill.
        if n % 50 == 0 {
            store
                .heartbeat(&lease.owner, std::slice::from_ref(&lease), CHILD_TTL)
                .await
                .unwrap();
        }
        use std::io::Write;
        writeln!(out, "ACK {n}").unwrap();
        out.flush().unwrap();
    }
    println!("DONE");
    // Wait to be killed: the parent kills this process (and drops it with
    // `kill_on_drop`) whatever happens.
    std::future::pending::<()>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_checkpoints_survive_sigkill_and_the_session_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("agentq.db");

    // The sessions: one the child runs, one only queued, one already finished.
    let store = SqliteStore::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    let (run, _) = store
        .create_session(&NewSession::root(spec(), "default"))
        .await
        .unwrap();
    let (waiting, _) = store
        .create_session(&NewSession::root(SessionSpec::new("queued"), "other"))
        .await
        .unwrap();
    let (done, _) = store
        .create_session(&NewSession::root(SessionSpec::new("done"), "default"))
        .await
        .unwrap();
    store.request_cancel(&done.id).await.unwrap();
    store.close().await;

    // Its name as the test harness knows it: the module path within this binary.
    let child_test = format!(
        "{}::child_process_body",
        module_path!().split_once("::").map_or("", |(_, m)| m)
    );
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            child_test.as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &db)
        .env(CHILD_SESSION, &run.id)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = 0u64;
    let read = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(n) = line.strip_prefix("ACK ") {
                acked = n.trim().parse().unwrap();
                if acked >= KILL_AFTER {
                    return true;
                }
            }
            assert_ne!(line.trim(), "DONE", "the child finished before the kill");
        }
        false
    })
    .await
    .expect("the child did not get far enough in time");
    assert!(read, "the child exited early");
    // SIGKILL, mid-stream: the child is writing its next checkpoints right now.
    child.start_kill().unwrap();
    let status = child.wait().await.unwrap();
    assert!(!status.success());
    let killed_at = std::time::Instant::now();

    // Reopen: the file is intact and holds at least every acknowledged step, and only
    // whole checkpoints (the row and its messages agree).
    let store = SqliteStore::open(&db).await.unwrap();
    store.check_schema().await.unwrap();
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(integrity, "ok");
    let messages = store.messages(&run.id).await.unwrap();
    let committed = u64::try_from(messages.len() - 1).unwrap();
    eprintln!("acknowledged {acked} steps; the file has {committed}");
    assert!(
        committed >= acked,
        "lost acknowledged steps: {committed} < {acked}"
    );
    let expected = state_after(&run.id, &spec(), committed);
    assert_eq!(messages, expected.messages);
    let row = store.get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Running);
    assert_eq!(row.lease_owner.as_deref(), Some("child"));
    assert_eq!(row.lease_epoch, 1);
    assert_eq!(row.iteration, expected.iteration);
    assert_eq!(row.usage, expected.usage);

    // The embedded restart: a fresh in-memory queue gets every runnable session back.
    let queue = MemQueue::new();
    assert_eq!(requeue_runnable(&store, &queue).await.unwrap(), 2);
    assert!(
        store
            .unenqueued(Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let qs = vec!["default".to_string(), "other".to_string()];
    let ds = queue
        .read(&qs, "restarted", 10, Duration::from_millis(100))
        .await
        .unwrap();
    let mut got: Vec<(&str, &str)> = ds
        .iter()
        .map(|d| (d.queue.as_str(), d.session_id.as_str()))
        .collect();
    got.sort();
    let mut want = vec![("default", run.id.as_str()), ("other", waiting.id.as_str())];
    want.sort();
    assert_eq!(got, want);
    assert!(ds.iter().all(|d| d.reason == EnqueueReason::Resume));

    // The dead child's lease holds until it expires; then the claim resumes from exactly
    // the committed state.
    if killed_at.elapsed() < CHILD_TTL / 2 {
        assert_eq!(
            store
                .claim(&run.id, "restarted", Duration::from_secs(30), 10)
                .await
                .unwrap(),
            Claim::Busy
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (lease, mut state) = loop {
        match store
            .claim(&run.id, "restarted", Duration::from_secs(30), 10)
            .await
            .unwrap()
        {
            Claim::Acquired { lease, state, row } => {
                // The child's checkpoints saved progress (resetting the crash count):
                // this claim is the first since.
                assert_eq!(row.attempts, 1);
                break (lease, *state);
            }
            Claim::Busy if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("expected the claim to succeed after expiry, got {other:?}"),
        }
    };
    assert_eq!(lease.epoch, 2);
    assert_eq!(state, expected);

    // It runs to the end under the new lease.
    let from = state.messages.len();
    state.push_assistant(Message::assistant("all done"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("all done".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
    let row = store.get(&run.id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(
        store.runnable_sessions().await.unwrap(),
        vec![(waiting.id.clone(), "other".to_string())]
    );
    store.close().await;
}
