//! Forks in the `Store` contract, on every backend (`pg::<case>`, `sqlite::<case>`): a fork
//! reads its origin's prefix instead of a copy (one stored row for the fork's message,
//! however long the prefix), starts at zero usage from iteration k, never changes its
//! origin (running or finished), chains (a fork of a fork, flattened inside the prefix),
//! refuses a step past the end or unfinished, another tenant's or a sub-agent origin, and
//! starts from the tree's files as of the step (earlier versions kept from the collector).

use std::time::Duration;

use agentq_agent::schema::{Message, Role};
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;
use agentq_types::fork::{ForkRefusal, ForkResult, NewFork};
use agentq_types::model::{NewSession, SessionRow, SessionStatus};

use crate::common::files::{bytes, create_with_files, input, parent_and_child, paths, put, step};
use crate::common::{Backend, TTL, acquire, contract_tests, create, finish, iterate};

contract_tests!(
    a_fork_shares_the_prefix_and_starts_at_zero,
    a_fork_never_changes_a_running_origin,
    forks_of_forks_chain_and_flatten,
    bad_fork_points_are_refused,
    a_fork_starts_from_the_files_as_of_its_step,
);

fn fork_of(origin: &str, k: u32, message: Option<&str>, tenant: &str) -> NewFork {
    let spec = SessionSpec::new("ignored: the origin's prompt is the history's first message");
    NewFork {
        new: NewSession::root(spec, "default").with_tenant(tenant),
        origin: origin.to_string(),
        at_iteration: k,
        message: message.map(str::to_string),
    }
}

async fn fork(store: &dyn Backend, origin: &str, k: u32, message: Option<&str>) -> SessionRow {
    match store
        .fork_session(&fork_of(origin, k, message, "default"))
        .await
        .unwrap()
    {
        ForkResult::Forked(row) => *row,
        other => panic!("expected a fork, got {other:?}"),
    }
}

async fn refused(store: &dyn Backend, f: NewFork) -> ForkResult {
    store.fork_session(&f).await.unwrap()
}

/// A session created with `prompt`, run `n` iterations (a call and its result each); its
/// lease, state and how much of it is stored.
async fn run(store: &dyn Backend, prompt: &str, n: usize) -> (String, SessionState) {
    let id = create(store, prompt).await;
    let (lease, mut state) = acquire(store, &id, "w1", TTL).await;
    let mut persisted = state.messages.len();
    for i in 0..n {
        iterate(store, &lease, &mut state, &mut persisted, i).await;
    }
    store.release(&lease).await.unwrap();
    (id, state)
}

/// Everything a reader sees of a session: its row and its history.
async fn seen(store: &dyn Backend, id: &str) -> (String, Vec<Message>) {
    let row = store.get(id).await.unwrap().unwrap();
    (
        serde_json::to_string(&row).unwrap(),
        store.messages(id).await.unwrap(),
    )
}

async fn a_fork_shares_the_prefix_and_starts_at_zero(store: &dyn Backend) {
    let (origin, _) = run(store, "the task", 3).await;
    finish(store, &origin, "done").await;
    let full = store.messages(&origin).await.unwrap();
    let before = seen(store, &origin).await;
    let stored = store.rows("messages").await;

    let f = fork(store, &origin, 2, Some("try the other file")).await;
    assert_eq!(f.status, SessionStatus::Queued);
    assert_eq!(f.forked_from.as_deref(), Some(origin.as_str()));
    // prompt, then (call, result) twice.
    assert_eq!(f.fork_at, Some(5));
    assert_eq!(f.iteration, 2);
    assert_eq!(f.usage, Default::default());
    assert_eq!(f.root_id, f.id);
    // One row stored: the fork's message. The prefix is read from the origin.
    assert_eq!(store.rows("messages").await, stored + 1);

    let mut expected = full[..5].to_vec();
    expected.push(Message::user("try the other file"));
    assert_eq!(store.messages(&f.id).await.unwrap(), expected);

    // A worker resumes it with that history, at iteration 2, at zero usage.
    let (lease, mut state) = acquire(store, &f.id, "w2", TTL).await;
    assert_eq!(state.messages, expected);
    assert_eq!(state.iteration, 2);
    assert_eq!(state.usage, Default::default());
    let mut persisted = state.messages.len();
    iterate(store, &lease, &mut state, &mut persisted, 7).await;
    store.release(&lease).await.unwrap();
    let (_, again) = acquire(store, &f.id, "w3", TTL).await;
    assert_eq!(again.messages, state.messages);
    assert_eq!(again.iteration, 3);
    assert_eq!(store.messages(&f.id).await.unwrap(), state.messages);

    // The origin, byte for byte.
    assert_eq!(seen(store, &origin).await, before);

    // Without a message, and at 0: the prompt alone.
    let bare = fork(store, &origin, 0, None).await;
    assert_eq!(bare.fork_at, Some(1));
    assert_eq!(store.messages(&bare.id).await.unwrap(), full[..1].to_vec());
    let (_, s) = acquire(store, &bare.id, "w4", TTL).await;
    assert_eq!(s.messages, full[..1].to_vec());
    assert_eq!(s.iteration, 0);
}

async fn a_fork_never_changes_a_running_origin(store: &dyn Backend) {
    let id = create(store, "long task").await;
    let (lease, mut state) = acquire(store, &id, "w1", TTL).await;
    let mut persisted = state.messages.len();
    for i in 0..2 {
        iterate(store, &lease, &mut state, &mut persisted, i).await;
    }
    let before = seen(store, &id).await;
    let f = fork(store, &id, 2, None).await;
    assert_eq!(seen(store, &id).await, before);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        SessionStatus::Running
    );
    // The origin goes on; the fork keeps the prefix it was made from.
    iterate(store, &lease, &mut state, &mut persisted, 2).await;
    assert_eq!(state.messages.len(), 7);
    assert_eq!(
        store.messages(&f.id).await.unwrap(),
        state.messages[..5].to_vec()
    );
    // The origin's latest iteration, still waiting for its tool result, is no step yet.
    state.push_assistant({
        let mut m = Message::assistant("one more");
        m.tool_calls = vec![crate::common::call(
            "c9",
            "read_file",
            serde_json::json!({}),
        )];
        m
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert!(matches!(
        refused(store, fork_of(&id, 4, None, "default")).await,
        ForkResult::Refused(r) if r == ForkRefusal::Unfinished { at: 4 }
    ));
    assert!(matches!(
        refused(store, fork_of(&id, 3, None, "default")).await,
        ForkResult::Forked(_)
    ));
}

async fn forks_of_forks_chain_and_flatten(store: &dyn Backend) {
    let (a, _) = run(store, "a", 3).await;
    let a_msgs = store.messages(&a).await.unwrap();
    let b = fork(store, &a, 2, Some("b")).await;
    let (lease, mut state) = acquire(store, &b.id, "w", TTL).await;
    let mut persisted = state.messages.len();
    for i in 10..12 {
        iterate(store, &lease, &mut state, &mut persisted, i).await;
    }
    store.release(&lease).await.unwrap();
    let b_msgs = store.messages(&b.id).await.unwrap();
    assert_eq!(b_msgs.len(), 10);
    assert_eq!(b_msgs[..5], a_msgs[..5]);

    // Past B's fork point: a chain of two.
    let c = fork(store, &b.id, 3, None).await;
    assert_eq!(c.forked_from.as_deref(), Some(b.id.as_str()));
    assert_eq!(c.fork_at, Some(8));
    assert_eq!(store.messages(&c.id).await.unwrap(), b_msgs[..8].to_vec());
    let (_, s) = acquire(store, &c.id, "w", TTL).await;
    assert_eq!(s.messages, b_msgs[..8].to_vec());

    // Inside A's prefix: points at A itself.
    let d = fork(store, &b.id, 1, None).await;
    assert_eq!(d.forked_from.as_deref(), Some(a.as_str()));
    assert_eq!(store.messages(&d.id).await.unwrap(), a_msgs[..3].to_vec());
    // And a fork of C inside B's own part points at B.
    let e = fork(store, &c.id, 3, Some("e")).await;
    assert_eq!(e.forked_from.as_deref(), Some(b.id.as_str()));
    let mut expected = b_msgs[..8].to_vec();
    expected.push(Message::user("e"));
    assert_eq!(store.messages(&e.id).await.unwrap(), expected);
    assert_eq!(expected[0].role, Role::User);
}

async fn bad_fork_points_are_refused(store: &dyn Backend) {
    let (origin, _) = run(store, "x", 2).await;
    assert!(matches!(
        refused(store, fork_of(&origin, 3, None, "default")).await,
        ForkResult::Refused(r) if r == ForkRefusal::PastEnd { iterations: 2 }
    ));
    assert!(matches!(
        refused(store, fork_of(&origin, 2, None, "other")).await,
        ForkResult::NotFound
    ));
    assert!(matches!(
        refused(store, fork_of("no-such-session", 0, None, "default")).await,
        ForkResult::NotFound
    ));
    let (_parent, child) = parent_and_child(store).await;
    assert!(matches!(
        refused(store, fork_of(&child.id, 0, None, "default")).await,
        ForkResult::Refused(r) if r == ForkRefusal::NotRoot
    ));
    // Nothing was created by any of them.
    let n = store.rows("sessions").await;
    let _ = refused(store, fork_of(&origin, 9, None, "default")).await;
    assert_eq!(store.rows("sessions").await, n);
}

async fn a_fork_starts_from_the_files_as_of_its_step(store: &dyn Backend) {
    let root = create_with_files(store, "files", vec![input("in.txt", b"input")]).await;
    let (lease, mut state) = acquire(store, &root.id, "w", TTL).await;
    // Iteration 1: a.txt v1; 2: a.txt v2 and b.txt; 3: b.txt deleted.
    let a1 = put(store, "a.txt", b"version one").await;
    step(store, &lease, &mut state, vec![a1]).await.unwrap();
    let a2 = put(store, "a.txt", b"version two").await;
    let b = put(store, "b.txt", b"bee").await;
    step(store, &lease, &mut state, vec![a2, b]).await.unwrap();
    step(
        store,
        &lease,
        &mut state,
        vec![crate::common::files::delete("b.txt")],
    )
    .await
    .unwrap();
    store.release(&lease).await.unwrap();

    let at2 = fork(store, &root.id, 2, None).await;
    let names = |v: Vec<(String, u64, i64)>| v.into_iter().map(|f| f.0).collect::<Vec<_>>();
    assert_eq!(
        names(paths(store, &at2.id).await),
        ["a.txt", "b.txt", "in.txt"]
    );
    assert_eq!(
        bytes(store, &at2.id, "a.txt").await.unwrap(),
        b"version two"
    );
    // Iteration 1's version was overwritten since: kept for the fork, never collected.
    store.collect_blobs(Duration::ZERO, 1000).await.unwrap();
    let at1 = fork(store, &root.id, 1, None).await;
    assert_eq!(names(paths(store, &at1.id).await), ["a.txt", "in.txt"]);
    assert_eq!(
        bytes(store, &at1.id, "a.txt").await.unwrap(),
        b"version one"
    );
    let at0 = fork(store, &root.id, 0, None).await;
    assert_eq!(names(paths(store, &at0.id).await), ["in.txt"]);

    // Separate trees from here: the fork's write is not the origin's, nor the reverse.
    let (fl, mut fs) = acquire(store, &at2.id, "w", TTL).await;
    let c = put(store, "c.txt", b"fork's").await;
    step(store, &fl, &mut fs, vec![c]).await.unwrap();
    let (ol, mut os) = acquire(store, &root.id, "w", TTL).await;
    let d = put(store, "d.txt", b"origin's").await;
    step(store, &ol, &mut os, vec![d]).await.unwrap();
    assert_eq!(
        names(paths(store, &at2.id).await),
        ["a.txt", "b.txt", "c.txt", "in.txt"]
    );
    assert_eq!(
        names(paths(store, &root.id).await),
        ["a.txt", "d.txt", "in.txt"]
    );
    // A fork of the fork past its fork point finds the fork's own files.
    let fs_len = fs.messages.len();
    drop(fs);
    store.release(&fl).await.unwrap();
    let again = fork(store, &at2.id, 3, None).await;
    assert_eq!(fs_len, 4);
    assert_eq!(
        names(paths(store, &again.id).await),
        ["a.txt", "b.txt", "c.txt", "in.txt"]
    );
}
