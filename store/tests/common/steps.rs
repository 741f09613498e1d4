//! The steps the contract cases are written in: sessions created, claimed, iterated the
//! way the driver does it, finished; the payloads the API and a finished child deliver;
//! the answers a waker gives for one session. Budget trees' steps are in [`tree`],
//! workspaces' in [`files`].

pub mod files;
pub mod tree;

use std::time::Duration;

use serde_json::json;

use agentq_agent::schema::{Message, ToolCall, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::{Outcome, SessionState};
use agentq_store::store::Store;
use agentq_types::model::{Claim, Lease, ListFilter, NewSession, SessionStatus, Woken};
use agentq_types::protocol::{ChildOutcome, InboxPayload, SteerMessage, Strategy};

use super::TTL;

/// A steering message as the API delivers it.
pub fn steer(text: &str) -> InboxPayload {
    InboxPayload::Steer(SteerMessage {
        content: text.into(),
        strategy: Strategy::Inject,
    })
}

/// A finished child's outcome, as its parent is told it.
pub fn child(result: &str) -> InboxPayload {
    InboxPayload::Child(ChildOutcome {
        child_id: format!("child-of-{result}"),
        label: String::new(),
        tool_call_id: String::new(),
        status: SessionStatus::Completed,
        finish_reason: None,
        result: Some(result.into()),
        error: None,
    })
}

pub fn new_session(prompt: &str) -> NewSession {
    NewSession::root(SessionSpec::new(prompt), "default")
}

pub async fn create(store: &dyn Store, prompt: &str) -> String {
    let (row, created) = store.create_session(&new_session(prompt)).await.unwrap();
    assert!(created);
    row.id
}

pub async fn acquire(
    store: &dyn Store,
    id: &str,
    owner: &str,
    ttl: Duration,
) -> (Lease, SessionState) {
    match store.claim(id, owner, ttl, 10).await.unwrap() {
        Claim::Acquired { lease, state, row } => {
            assert_eq!(row.status, SessionStatus::Running);
            assert_eq!(row.lease_owner.as_deref(), Some(owner));
            assert_eq!(row.lease_epoch, lease.epoch);
            (lease, *state)
        }
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// One iteration the way the driver does it: the assistant response (committed before its
/// tool runs), then the tool's result; a checkpoint after each.
pub async fn iterate(
    store: &dyn Store,
    lease: &Lease,
    state: &mut SessionState,
    persisted: &mut usize,
    i: usize,
) {
    let mut reply = Message::assistant(format!("step {i:05}: reading the file"));
    reply.tool_calls = vec![ToolCall {
        id: format!("call_{i:05}"),
        name: "read_file".into(),
        arguments: json!({ "path": "notes.txt" }).into(),
    }];
    reply.usage = Some(Usage {
        input_tokens: 100,
        output_tokens: 20,
        cache_read_tokens: 7,
        cache_write_tokens: 3,
        reasoning_tokens: 5,
        web_search_requests: 1,
    });
    reply.model = Some("test-model".into());
    state.push_assistant(reply);
    store.checkpoint(lease, state, *persisted).await.unwrap();
    *persisted = state.messages.len();
    state.messages.push(Message::tool_result(
        format!("call_{i:05}"),
        "read_file",
        format!("contents of notes.txt at step {i:05}"),
        false,
    ));
    store.checkpoint(lease, state, *persisted).await.unwrap();
    *persisted = state.messages.len();
}

pub async fn count_all(store: &dyn Store) -> usize {
    store
        .list(&ListFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .len()
}

pub fn default_queue(id: &str) -> Vec<(String, String)> {
    vec![(id.to_string(), "default".to_string())]
}

/// What a waker answers for one session of the default queue that is not capped.
/// Two sweeps, the first limited to 1, then one for the rest: on one store exactly
/// `want_first` then `want_rest`; on `shards` > 1, where the limit holds per shard, the
/// first takes at most one per shard and the two take the same sessions in all.
pub fn two_sweeps(
    shards: usize,
    (first, rest): (Vec<Woken>, Vec<Woken>),
    want_first: Vec<Woken>,
    want_rest: Vec<Woken>,
) {
    if shards == 1 {
        assert_eq!(first, want_first);
        assert_eq!(rest, want_rest);
        return;
    }
    assert!(!first.is_empty() && first.len() <= shards, "{first:?}");
    let by_id = |mut v: Vec<Woken>| {
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    };
    assert_eq!(
        by_id([first, rest].concat()),
        by_id([want_first, want_rest].concat())
    );
}

pub fn woken(id: &str) -> Vec<Woken> {
    vec![Woken {
        id: id.to_string(),
        queue: "default".to_string(),
        held: false,
    }]
}

/// The session's `wake_seq` now (what a claim at this moment would have seen).
pub async fn wake_seq(store: &dyn Store, id: &str) -> i64 {
    store.get(id).await.unwrap().unwrap().wake_seq
}

/// Claim and return the lease plus the row's `wake_seq` at the claim.
pub async fn acquire_seen(store: &dyn Store, id: &str, owner: &str) -> (Lease, SessionState, i64) {
    match store.claim(id, owner, TTL, 10).await.unwrap() {
        Claim::Acquired { lease, state, row } => (lease, *state, row.wake_seq),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// Claim `id` as `owner` and give it up to wait as `status` (nothing arrived meanwhile).
pub async fn suspended(store: &dyn Store, id: &str, owner: &str, status: SessionStatus) {
    let (lease, _, seen) = acquire_seen(store, id, owner).await;
    store.suspend(&lease, status, seen, None).await.unwrap();
}

/// What the sweeper would enqueue now: every session without an entry, however new.
pub async fn unenqueued_now(store: &dyn Store) -> Vec<(String, String)> {
    store.unenqueued(Duration::ZERO, 100).await.unwrap()
}

/// Run a session to a final checkpoint with `answer`; returns its final state.
pub async fn finish(store: &dyn Store, id: &str, answer: &str) -> SessionState {
    let (lease, mut state) = acquire(store, id, "finisher", TTL).await;
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant(answer));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some(answer.into()),
        error: None,
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert_eq!(
        store.get(id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );
    state
}

pub fn call(id: &str, tool: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: tool.into(),
        arguments: arguments.into(),
    }
}
