//! A fork run by real workers: forked from a finished session at iteration 1, it asks the
//! model only for the iterations after it (none of the shared prefix again, no tool of it
//! again), at zero usage for the prefix; SIGKILLed between two tool results of its own
//! iteration, another worker resumes it from its history (the origin's prefix and its own
//! steps) and it ends exactly as the origin did. The origin is never changed.

use std::time::Duration;

use agentq_core::fork::{ForkResult, NewFork};
use agentq_core::{EnqueueReason, NewSession, SessionStatus, WorkQueue};

use crate::common::{Cluster, Script, Sub, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_resumes_after_sigkill_and_never_reruns_its_prefix() {
    let mut c = Cluster::start().await;
    let a = c.spawn_ready_worker(&WorkerOpts::default()).await;

    // The origin: turn 0 GETs t0a; turn 1 GETs fast and slow; turn 2 answers.
    let origin = c.submit(Script::three_turns()).await;
    let row = c
        .wait_all_terminal(std::slice::from_ref(&origin.id), T)
        .await
        .remove(0);
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    let expected = c.transcript(&origin).await;
    assert_eq!(expected.len(), 7, "{expected:#?}");
    let before = serde_json::to_string(&c.row(&origin.id).await).unwrap();
    let origin_messages = c.store.messages(&origin.id).await.unwrap();

    // Fork at iteration 1 (prompt, turn 0's answer and result): the fork asks for turn 1
    // next. Its `slow` blocks, so it can be killed between its two results.
    let f = NewFork {
        new: NewSession::root(row.spec.clone(), "default"),
        origin: origin.id.clone(),
        at_iteration: 1,
        message: None,
    };
    let fork = match c.store.fork_session(&f).await.unwrap() {
        ForkResult::Forked(r) => r,
        other => panic!("{other:?}"),
    };
    let fork = Sub {
        id: fork.id.clone(),
        token: origin.token.clone(),
    };
    c.block_tool_once(&fork, "slow");
    c.queue
        .enqueue("default", &fork.id, EnqueueReason::New)
        .await
        .unwrap();

    eventually(
        "the fork's fast committed while its slow is in flight",
        T,
        async || c.tool_hits(&origin, "slow") == 2 && c.message_count(&fork.id).await == 5,
    )
    .await;
    c.kill_worker(a);
    c.spawn_worker(&WorkerOpts::default());
    let done = c
        .wait_all_terminal(std::slice::from_ref(&fork.id), T)
        .await
        .remove(0);
    assert_eq!(done.status, SessionStatus::Completed, "{done:?}");
    assert_eq!(done.takeovers, 1, "{done:?}");
    assert_eq!(done.forked_from.as_deref(), Some(origin.id.as_str()));

    // The same history as the origin's, its prefix read from the origin.
    assert_eq!(c.transcript(&fork).await, expected);
    assert_eq!(
        c.store.messages(&fork.id).await.unwrap()[..3],
        origin_messages[..3]
    );
    // Turn 0 and its tool were never asked again; turns 1 and 2 once each for the fork.
    assert_eq!(c.llm_requests(&origin, 0), 1, "{:#?}", c.hits());
    assert_eq!(c.llm_requests(&origin, 1), 2, "{:#?}", c.hits());
    assert_eq!(c.llm_requests(&origin, 2), 2, "{:#?}", c.hits());
    assert_eq!(c.tool_hits(&origin, "t0a"), 1);
    assert_eq!(c.tool_hits(&origin, "fast"), 2);
    // The fork paid for turns 1 and 2 only (the fake bills 100 + turn in, 10 out).
    assert_eq!(done.iteration, 3);
    assert_eq!(done.usage.input_tokens, 101 + 102);
    assert_eq!(done.usage.output_tokens, 20);
    assert_eq!(row.usage.input_tokens, 100 + 101 + 102);

    // The origin, byte for byte.
    assert_eq!(
        serde_json::to_string(&c.row(&origin.id).await).unwrap(),
        before
    );
    assert_eq!(c.store.messages(&origin.id).await.unwrap(), origin_messages);
}
