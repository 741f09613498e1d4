//! A parent and a redriven child (the embedded store and queue): the parent is told of
//! each outcome once. A parent that read the retried child as unfinished and went back to
//! waiting is woken by the retry's outcome (it would wait forever if the outcome counted
//! as the failure it was already told of), and redelivering an outcome changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;

use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::lifecycle::notify_parent;
use agentq_core::mem_queue::MemQueue;
use agentq_core::protocol::InboxKind;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{
    Claim, InboxStore, LeaseStore, NewSession, RetryResult, SessionStatus, SessionStore,
};

const TTL: Duration = Duration::from_secs(30);

async fn suspend_waiting(store: &SqliteStore, id: &str) {
    let Claim::Acquired { lease, row, .. } = store.claim(id, "w", TTL, 10).await.unwrap() else {
        panic!("claim {id}")
    };
    let now = store
        .suspend(&lease, SessionStatus::Waiting, row.wake_seq, None)
        .await
        .unwrap();
    assert_eq!(now.status, SessionStatus::Waiting);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_parent_hears_the_outcome_of_a_retried_child() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let queue = MemQueue::new();

    let parent = NewSession::root(SessionSpec::new("parent"), "default");
    store.create_session(&parent).await.unwrap();
    let mut spec = SessionSpec::new("child");
    spec.metadata = json!({"agentq": {"label": "c", "wait": true, "tool_call_id": "call_1"}});
    let child = NewSession {
        parent_id: Some(parent.id.clone()),
        root_id: parent.id.clone(),
        depth: 1,
        ..NewSession::root(spec, "default")
    };
    store.create_session(&child).await.unwrap();
    suspend_waiting(&store, &parent.id).await;

    // The child fails: its parent is woken once.
    let failed = store
        .fail(&child.id, "LLM call failed")
        .await
        .unwrap()
        .unwrap();
    notify_parent(&store, &queue, &failed).await.unwrap();
    notify_parent(&store, &queue, &failed).await.unwrap();
    assert_eq!(
        store.get(&parent.id).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );
    let told = store
        .inbox(&parent.id, &[InboxKind::ChildDone], 0)
        .await
        .unwrap();
    assert_eq!(told.len(), 1, "told of the failure once");

    // Redriven before the parent ran: the parent finds it unfinished and waits again.
    let RetryResult::Retried(_) = store.retry(&child.id, false).await.unwrap() else {
        panic!("retry")
    };
    suspend_waiting(&store, &parent.id).await;

    // The retry completes: the parent is woken to read it, once.
    let Claim::Acquired { lease, state, .. } = store.claim(&child.id, "w2", TTL, 10).await.unwrap()
    else {
        panic!("claim the child")
    };
    let mut state = *state;
    let from = state.messages.len();
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("ok".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
    let done = store.get(&child.id).await.unwrap().unwrap();
    assert_eq!((done.status, done.retries), (SessionStatus::Completed, 1));
    notify_parent(&store, &queue, &done).await.unwrap();
    notify_parent(&store, &queue, &done).await.unwrap();
    assert_eq!(
        store.get(&parent.id).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );
    let told = store
        .inbox(&parent.id, &[InboxKind::ChildDone], 0)
        .await
        .unwrap();
    assert_eq!(told.len(), 2, "the failure once, the retry's outcome once");
    store.close().await;
}
