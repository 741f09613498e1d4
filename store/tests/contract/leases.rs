//! The lease protocol: claims, resumption from a checkpoint, fencing, final and retried
//! checkpoints, heartbeats, exhaustion, release, the group commit and the group claim.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{SubsecRound, Utc};
use serde_json::json;

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::spec::{ExitReason, Mode, SessionSpec};
use agentq_agent::state::{Outcome, Phase, SessionState};
use agentq_error::Error;
use agentq_store::Checkpoint;
use agentq_store::store::Store;
use agentq_types::model::{CancelResult, Claim, Lease, NewSession, SessionStatus};

use crate::common::{
    Backend, SHORT_TTL, TTL, acquire, contract_tests, create, finish, iterate, new_session,
    suspended,
};

contract_tests!(
    contract_crashed_worker_resumes_from_checkpoint,
    contract_fencing,
    contract_terminal_checkpoint,
    contract_retried_checkpoint,
    contract_heartbeat_and_cancel_flag,
    contract_exhausted_then_fail,
    contract_release,
    contract_concurrent_claims_and_checkpoints,
    contract_checkpoint_cursors,
    contract_group_commit,
    contract_group_commit_with_heartbeats,
    contract_group_claim,
    contract_racing_group_claims,
);

async fn contract_crashed_worker_resumes_from_checkpoint(store: &dyn Backend) {
    let mut spec = SessionSpec::new("plan then act");
    spec.mode = Mode::PlanAct;
    let (row, _) = store
        .create_session(&NewSession::root(spec.clone(), "default"))
        .await
        .unwrap();
    let id = row.id;

    let (lease, mut state) = acquire(store, &id, "worker-a", SHORT_TTL).await;
    assert_eq!(lease.epoch, 1);
    assert_eq!(state, SessionState::new(id.clone(), spec.clone()));
    assert_eq!(state.phase, Phase::Plan);

    // Both backends keep microseconds.
    state.started_at = Some(Utc::now().trunc_subsecs(6));
    let mut persisted = state.messages.len();
    for i in 0..3 {
        iterate(store, &lease, &mut state, &mut persisted, i).await;
    }
    state.phase = Phase::Act;
    state.drain_rounds = 2;
    state.free_iteration = true;
    state.turn_base = 1;
    state.not_started = vec!["call_00002".into()];
    state
        .messages
        .push(Message::user("The plan above is accepted."));
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    let checkpointed = state.clone();
    // The worker dies here: no release, no further write.
    drop(state);

    // Its lease is still live: nobody else may take the session.
    assert_eq!(
        store.claim(&id, "worker-b", TTL, 10).await.unwrap(),
        Claim::Busy
    );
    store.pass(SHORT_TTL * 2).await;

    let (lease_b, resumed) = acquire(store, &id, "worker-b", TTL).await;
    assert_eq!(lease_b.epoch, 2);
    assert_eq!(resumed, checkpointed);
    assert_eq!(resumed.iteration, 3);
    assert_eq!(resumed.usage.input_tokens, 300);
    assert_eq!(resumed.usage.reasoning_tokens, 15);
    assert_eq!(resumed.usage.web_search_requests, 3);
    assert_eq!(resumed.messages.len(), 8);
    assert_eq!(resumed.turn_base, 1);
    assert_eq!(resumed.not_started, ["call_00002"]);

    let row = store.get(&id).await.unwrap().unwrap();
    // A's checkpoints saved progress, which resets the crash count; B's claim is the
    // first claim since.
    assert_eq!(row.attempts, 1);
    assert_eq!(row.iteration, 3);
    assert_eq!(row.usage, checkpointed.usage);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-b"));
    assert!(row.lease_expires_at.unwrap() > Utc::now() + chrono::Duration::seconds(20));
    assert_eq!(store.messages(&id).await.unwrap(), checkpointed.messages);

    // The owner's own re-claim (a redelivered entry) takes it again with a new epoch.
    let (lease_b2, again) = acquire(store, &id, "worker-b", TTL).await;
    assert_eq!(lease_b2.epoch, 3);
    assert_eq!(again, checkpointed);
    assert!(matches!(
        store
            .checkpoint(&lease_b, &again, again.messages.len())
            .await,
        Err(Error::LeaseLost(_))
    ));
}

async fn contract_fencing(store: &dyn Backend) {
    let id = create(store, "fence me").await;
    let (lease_a, mut state_a) = acquire(store, &id, "worker-a", SHORT_TTL).await;
    let mut persisted_a = state_a.messages.len();
    iterate(store, &lease_a, &mut state_a, &mut persisted_a, 0).await;

    // A stalls past its lease; B takes over.
    store.pass(SHORT_TTL * 2).await;
    let (lease_b, state_b) = acquire(store, &id, "worker-b", TTL).await;
    assert!(lease_b.epoch > lease_a.epoch);
    assert_eq!(state_b, state_a);
    let row_before = store.get(&id).await.unwrap().unwrap();
    let msgs_before = store.messages(&id).await.unwrap();

    // A wakes up: every write it attempts is refused and changes nothing.
    let mut stale = state_a.clone();
    stale.push_assistant(Message::assistant("stale answer"));
    let err = store
        .checkpoint(&lease_a, &stale, persisted_a)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::LeaseLost(ref s) if s == &id),
        "{err:?}"
    );
    stale.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("stale answer".into()),
        error: None,
    });
    let err = store
        .checkpoint(&lease_a, &stale, persisted_a)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    let hb = store
        .heartbeat(&lease_a.owner, std::slice::from_ref(&lease_a), TTL)
        .await
        .unwrap();
    assert_eq!(hb.len(), 1);
    assert!(!hb[0].held && hb[0].lost);
    let err = store.release(&lease_a).await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost(_)), "{err:?}");
    // A lease with the right epoch but another owner is no better.
    let forged = Lease {
        owner: "worker-a".into(),
        ..lease_b.clone()
    };
    assert!(matches!(
        store.checkpoint(&forged, &stale, persisted_a).await,
        Err(Error::LeaseLost(_))
    ));
    let hb = store.heartbeat("worker-a", &[forged], TTL).await.unwrap();
    assert!(!hb[0].held && hb[0].lost);

    assert_eq!(store.get(&id).await.unwrap().unwrap(), row_before);
    assert_eq!(store.messages(&id).await.unwrap(), msgs_before);

    // B still owns it and can write.
    let mut state_b = state_b;
    let mut persisted_b = state_b.messages.len();
    iterate(store, &lease_b, &mut state_b, &mut persisted_b, 1).await;
    assert_eq!(store.messages(&id).await.unwrap().len(), 5);
}

async fn contract_terminal_checkpoint(store: &dyn Store) {
    // Completed.
    let id = create(store, "answer me").await;
    let (lease, mut state) = acquire(store, &id, "w", TTL).await;
    // A step's commit has no row to give back.
    let step = Checkpoint::new(&lease, &state, state.messages.len()).unwrap();
    assert!(matches!(
        store.checkpoint_batch(&[&step]).await.unwrap().as_slice(),
        [Ok(None)]
    ));
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant("42"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("42".into()),
        error: None,
    });
    // The final commit may bring the finished row back (Postgres does, `pg_store.rs`):
    // exactly as a read after it finds it.
    let cp = Checkpoint::new(&lease, &state, persisted).unwrap();
    let committed = store.checkpoint_batch(&[&cp]).await.unwrap().pop().unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert!(committed.unwrap().is_none_or(|r| *r == row));
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(row.finish_reason, Some(ExitReason::Stop));
    assert_eq!(row.result.as_deref(), Some("42"));
    assert!(row.error.is_none());
    assert!(row.finished_at.is_some());
    assert!(row.lease_owner.is_none() && row.lease_expires_at.is_none());
    assert_eq!(row.iteration, 1);

    // A heartbeat that raced the final checkpoint: not extended, but not lost either
    // (the holder gave it up itself).
    let hb = store
        .heartbeat(&lease.owner, std::slice::from_ref(&lease), TTL)
        .await
        .unwrap();
    assert!(!hb[0].held && !hb[0].lost, "{hb:?}");

    // The same final checkpoint again (its answer was lost): harmless.
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        SessionStatus::Completed
    );
    // But a non-final write under the given-up lease is fenced.
    let mut later = state.clone();
    later.outcome = None;
    assert!(matches!(
        store.checkpoint(&lease, &later, persisted).await,
        Err(Error::LeaseLost(_))
    ));

    // A finished session is not run again: settled again while it is not announced, only
    // acked once it is (a duplicate entry must not publish its completion twice).
    match store.claim(&id, "w2", TTL, 10).await.unwrap() {
        Claim::Terminal(r) => assert_eq!(r.status, SessionStatus::Completed),
        other => panic!("expected Terminal, got {other:?}"),
    }
    store.mark_announced(&id).await.unwrap();
    assert_eq!(
        store.claim(&id, "w2", TTL, 10).await.unwrap(),
        Claim::Settled
    );
    assert!(matches!(
        store.request_cancel(&id).await.unwrap(),
        CancelResult::AlreadyFinished(_)
    ));
    // Nor failed from outside.
    let after_fail = store.fail(&id, "dead letter").await.unwrap().unwrap();
    assert_eq!(after_fail.status, SessionStatus::Completed);

    // Failed with the reason; cancelled by an interrupt.
    for (reason, status) in [
        (ExitReason::MaxIterations, SessionStatus::Failed),
        (ExitReason::Error, SessionStatus::Failed),
        (ExitReason::Timeout, SessionStatus::Failed),
        (ExitReason::BudgetExhausted, SessionStatus::Failed),
        (ExitReason::Interrupted, SessionStatus::Cancelled),
        (ExitReason::Yielded, SessionStatus::Completed),
    ] {
        let id = create(store, "limit").await;
        let (lease, mut state) = acquire(store, &id, "w", TTL).await;
        state.outcome = Some(Outcome {
            reason,
            result: None,
            error: Some(format!("ended: {reason}")),
        });
        store
            .checkpoint(&lease, &state, state.messages.len())
            .await
            .unwrap();
        let row = store.get(&id).await.unwrap().unwrap();
        assert_eq!(row.status, status, "{reason}");
        assert_eq!(row.finish_reason, Some(reason));
        assert_eq!(row.error, Some(format!("ended: {reason}")));
        assert!(row.result.is_none());
    }
}

async fn contract_retried_checkpoint(store: &dyn Backend) {
    let id = create(store, "retry").await;
    let (lease, mut state) = acquire(store, &id, "w", TTL).await;
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant("one"));
    state
        .messages
        .push(Message::tool_result("c1", "t", "r", false));
    for _ in 0..3 {
        store.checkpoint(&lease, &state, persisted).await.unwrap();
    }
    // The two new messages, once each (message 0, the prompt, is in the spec).
    assert_eq!(store.rows("messages").await, 2);
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    // An overlapping window (from an earlier index) is harmless too: nothing is stored
    // twice, and message 0 stays in the spec.
    store.checkpoint(&lease, &state, 0).await.unwrap();
    store.checkpoint(&lease, &state, 1).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    assert_eq!(store.rows("messages").await, 2);
    // Nothing new: only the row is written.
    store
        .checkpoint(&lease, &state, state.messages.len())
        .await
        .unwrap();
    assert_eq!(store.rows("messages").await, 2);
    // A window past the end writes only the scalars.
    state.iteration = 7;
    store.checkpoint(&lease, &state, 99).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    assert_eq!(store.get(&id).await.unwrap().unwrap().iteration, 7);
    // A large step (more messages than one insert statement carries) in one checkpoint.
    let from = state.messages.len();
    for i in 0..2500 {
        state
            .messages
            .push(Message::tool_result(format!("b{i}"), "t", "x", false));
    }
    store.checkpoint(&lease, &state, from).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
}

async fn contract_heartbeat_and_cancel_flag(store: &dyn Backend) {
    let a = create(store, "a").await;
    let b = create(store, "b").await;
    let (lease_a, _) = acquire(store, &a, "w", Duration::from_secs(5)).await;
    let (lease_b, _) = acquire(store, &b, "w", Duration::from_secs(5)).await;
    let before = store
        .get(&a)
        .await
        .unwrap()
        .unwrap()
        .lease_expires_at
        .unwrap();

    let hb = store
        .heartbeat("w", &[lease_a.clone(), lease_b.clone()], TTL)
        .await
        .unwrap();
    assert_eq!(hb.len(), 2);
    assert_eq!(hb[0].session_id, a);
    assert_eq!(hb[1].session_id, b);
    assert!(hb.iter().all(|s| s.held && !s.cancel_requested));
    // The worker's row carries the leases on: the sessions' rows are not written.
    let after = store
        .get(&a)
        .await
        .unwrap()
        .unwrap()
        .lease_expires_at
        .unwrap();
    assert_eq!(after, before);
    let w = store.workers(10).await.unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!((w[0].worker.as_str(), w[0].sessions), ("w", 2));
    assert!(w[0].first_expiry.unwrap() - before > chrono::Duration::seconds(20));

    match store.request_cancel(&b).await.unwrap() {
        CancelResult::Requested(row) => {
            assert_eq!(row.status, SessionStatus::Running);
            assert!(row.cancel_requested);
        }
        other => panic!("expected Requested, got {other:?}"),
    }
    // Asking again is still a request (the owner has not acted yet).
    assert!(matches!(
        store.request_cancel(&b).await.unwrap(),
        CancelResult::Requested(_)
    ));
    let stale = Lease {
        epoch: 0,
        ..lease_a.clone()
    };
    let hb = store
        .heartbeat("w", &[lease_b.clone(), stale, lease_a.clone()], TTL)
        .await
        .unwrap();
    assert_eq!(hb.len(), 3);
    assert!(hb[0].held && hb[0].cancel_requested && hb[0].session_id == b);
    assert!(!hb[1].held && !hb[1].cancel_requested && hb[1].session_id == a);
    assert!(hb[2].held && !hb[2].cancel_requested && hb[2].session_id == a);
    assert!(store.heartbeat("w", &[], TTL).await.unwrap().is_empty());

    // A lease kept alive by heartbeats is not taken; one left to expire is.
    let (lease_c, _) = acquire(store, &a, "w", SHORT_TTL).await;
    for _ in 0..4 {
        store.pass(SHORT_TTL / 2).await;
        assert!(
            store
                .heartbeat(&lease_c.owner, std::slice::from_ref(&lease_c), SHORT_TTL)
                .await
                .unwrap()[0]
                .held
        );
    }
    assert_eq!(
        store.claim(&a, "other", TTL, 10).await.unwrap(),
        Claim::Busy
    );
    store.pass(SHORT_TTL * 2).await;
    let (lease_d, _) = acquire(store, &a, "other", TTL).await;
    assert!(lease_d.epoch > lease_c.epoch);
    assert!(
        !store
            .heartbeat(&lease_c.owner, std::slice::from_ref(&lease_c), TTL)
            .await
            .unwrap()[0]
            .held
    );
}

async fn contract_exhausted_then_fail(store: &dyn Backend) {
    let id = create(store, "poison").await;
    for attempt in 1..=2 {
        let (lease, _) = acquire(store, &id, &format!("w{attempt}"), SHORT_TTL).await;
        assert_eq!(lease.epoch, attempt);
        store.pass(SHORT_TTL * 2).await;
    }
    // A claim given back does not count; the two that died before it still do.
    let (lease, _) = acquire(store, &id, "w2b", TTL).await;
    store.release(&lease).await.unwrap();
    assert_eq!(store.get(&id).await.unwrap().unwrap().attempts, 2);
    let row = match store.claim(&id, "w3", TTL, 2).await.unwrap() {
        Claim::Exhausted(row) => *row,
        other => panic!("expected Exhausted, got {other:?}"),
    };
    assert_eq!(row.attempts, 3);

    let failed = store
        .fail(&id, "delivered 3 times without finishing")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.status, SessionStatus::Failed);
    assert_eq!(failed.finish_reason, Some(ExitReason::Error));
    assert_eq!(
        failed.error.as_deref(),
        Some("delivered 3 times without finishing")
    );
    assert!(failed.lease_owner.is_none() && failed.finished_at.is_some());
    // Failing again leaves the first reason.
    let again = store.fail(&id, "other").await.unwrap().unwrap();
    assert_eq!(
        again.error.as_deref(),
        Some("delivered 3 times without finishing")
    );
    assert!(store.fail("missing", "x").await.unwrap().is_none());
    assert!(matches!(
        store.claim(&id, "w4", TTL, 10).await.unwrap(),
        Claim::Terminal(_)
    ));

    // A queued session can be failed from outside too.
    let queued = create(store, "never ran").await;
    let failed = store.fail(&queued, "bad entry").await.unwrap().unwrap();
    assert_eq!(failed.status, SessionStatus::Failed);
}

async fn contract_release(store: &dyn Store) {
    let id = create(store, "hand over").await;
    let (lease, mut state) = acquire(store, &id, "w1", TTL).await;
    let mut persisted = state.messages.len();
    iterate(store, &lease, &mut state, &mut persisted, 0).await;
    store.release(&lease).await.unwrap();
    // A retried release is harmless.
    store.release(&lease).await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.attempts, 0);
    assert!(row.lease_owner.is_none() && row.lease_expires_at.is_none());

    // Another worker resumes at once (no ttl to wait for), from the same state.
    let (lease2, state2) = acquire(store, &id, "w2", TTL).await;
    assert_eq!(state2, state);
    assert_eq!(store.get(&id).await.unwrap().unwrap().attempts, 1);
    // The released lease is dead.
    assert!(matches!(
        store.checkpoint(&lease, &state, persisted).await,
        Err(Error::LeaseLost(_))
    ));
    assert!(matches!(
        store.release(&lease).await,
        Err(Error::LeaseLost(_))
    ));
    store.release(&lease2).await.unwrap();
}

/// Many tasks at once: one claim wins per session, and concurrent checkpoints of many
/// sessions all land (SQLite: writes queue for the one writer instead of failing busy).
async fn contract_concurrent_claims_and_checkpoints(store: &dyn Store) {
    let ids = created(store, 20, "c").await;

    // Race 8 claimers for each session.
    let results = futures::future::join_all(ids.iter().flat_map(|id| {
        (0..8).map(move |w| async move {
            (
                id.clone(),
                store.claim(id, &format!("w{w}"), TTL, 10).await.unwrap(),
            )
        })
    }))
    .await;
    let mut leases = Vec::new();
    for id in &ids {
        let won: Vec<&Claim> = results
            .iter()
            .filter(|(i, c)| i == id && matches!(c, Claim::Acquired { .. }))
            .map(|(_, c)| c)
            .collect();
        assert_eq!(won.len(), 1, "{id}: {won:?}");
        assert!(
            results
                .iter()
                .filter(|(i, _)| i == id)
                .all(|(_, c)| matches!(c, Claim::Acquired { .. } | Claim::Busy))
        );
        if let Claim::Acquired { lease, state, .. } = won[0] {
            leases.push((lease.clone(), (**state).clone()));
        }
    }

    // Every session checkpoints 10 iterations, all sessions at once.
    let shared: Arc<Vec<(Lease, SessionState)>> = Arc::new(leases);
    let t = Instant::now();
    futures::future::join_all(shared.iter().map(|(lease, state)| async move {
        let mut state = state.clone();
        let mut persisted = state.messages.len();
        for i in 0..10 {
            iterate(store, lease, &mut state, &mut persisted, i).await;
        }
    }))
    .await;
    eprintln!("400 concurrent checkpoints took {:?}", t.elapsed());
    for (lease, _) in shared.iter() {
        let row = store.get(&lease.session_id).await.unwrap().unwrap();
        assert_eq!(row.iteration, 10);
        assert_eq!(store.messages(&lease.session_id).await.unwrap().len(), 21);
    }
}

async fn contract_checkpoint_cursors(store: &dyn Store) {
    let id = create(store, "cursors").await;
    let (lease, mut state) = acquire(store, &id, "w", TTL).await;
    assert_eq!((state.bg_cursor, state.msg_cursor), (0, 0));
    let mut persisted = state.messages.len();
    iterate(store, &lease, &mut state, &mut persisted, 0).await;
    state.bg_cursor = 3;
    state.msg_cursor = 5;
    state
        .messages
        .push(Message::user("injected steering message"));
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    // A checkpoint without new messages writes them too.
    state.bg_cursor = 4;
    store
        .checkpoint(&lease, &state, state.messages.len())
        .await
        .unwrap();

    let (_, resumed) = acquire(store, &id, "w", TTL).await;
    assert_eq!((resumed.bg_cursor, resumed.msg_cursor), (4, 5));
    assert_eq!(resumed, state);
    // A fenced-off checkpoint does not move them.
    let mut stale = state.clone();
    stale.msg_cursor = 99;
    assert!(matches!(
        store.checkpoint(&lease, &stale, stale.messages.len()).await,
        Err(Error::LeaseLost(_))
    ));
    let (_, again) = acquire(store, &id, "w", TTL).await;
    assert_eq!(again.msg_cursor, 5);
}

/// Group commit: one batch, each checkpoint fenced and answered on its own.
async fn contract_group_commit(store: &dyn Backend) {
    assert!(store.checkpoint_batch(&[]).await.unwrap().is_empty());

    // a: two new messages; b: its final answer; c: scalars only; d: fenced off.
    let [a, b, c, d] = [
        create(store, "a").await,
        create(store, "b").await,
        create(store, "c").await,
        create(store, "d").await,
    ];
    let (lease_a, mut state_a) = acquire(store, &a, "w", TTL).await;
    let (lease_b, mut state_b) = acquire(store, &b, "w", TTL).await;
    let (lease_c, mut state_c) = acquire(store, &c, "w", TTL).await;
    let (lease_d, mut state_d) = acquire(store, &d, "w", SHORT_TTL).await;
    store.pass(SHORT_TTL * 2).await;
    let (_lease_d2, _) = acquire(store, &d, "w2", TTL).await;
    let row_d = store.get(&d).await.unwrap().unwrap();

    let from_a = state_a.messages.len();
    let mut reply = Message::assistant("reading");
    reply.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "read_file".into(),
        arguments: json!({ "path": "x" }).into(),
    }];
    state_a.push_assistant(reply);
    state_a.messages.push(Message::tool_result(
        "call_1",
        "read_file",
        "x's contents",
        false,
    ));
    let from_b = state_b.messages.len();
    state_b.push_assistant(Message::assistant("done"));
    state_b.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("done".into()),
        error: None,
    });
    let from_c = state_c.messages.len();
    state_c.iteration = 3;
    state_c.msg_cursor = 7;
    let from_d = state_d.messages.len();
    state_d.push_assistant(Message::assistant("stale"));

    let cps = [
        Checkpoint::new(&lease_a, &state_a, from_a).unwrap(),
        Checkpoint::new(&lease_b, &state_b, from_b).unwrap(),
        Checkpoint::new(&lease_c, &state_c, from_c).unwrap(),
        Checkpoint::new(&lease_d, &state_d, from_d).unwrap(),
    ];
    let refs: Vec<&Checkpoint> = cps.iter().collect();
    let out = store.checkpoint_batch(&refs).await.unwrap();
    assert_eq!(out.len(), 4);
    assert!(
        out[0].is_ok() && out[1].is_ok() && out[2].is_ok(),
        "{out:?}"
    );
    assert!(
        matches!(&out[3], Err(Error::LeaseLost(s)) if s == &d),
        "{out:?}"
    );

    assert_eq!(store.messages(&a).await.unwrap(), state_a.messages);
    let row_a = store.get(&a).await.unwrap().unwrap();
    assert_eq!(row_a.status, SessionStatus::Running);
    assert_eq!(row_a.iteration, 1);
    let row_b = store.get(&b).await.unwrap().unwrap();
    assert_eq!(row_b.status, SessionStatus::Completed);
    assert_eq!(row_b.result.as_deref(), Some("done"));
    assert!(row_b.lease_owner.is_none());
    assert_eq!(store.messages(&b).await.unwrap(), state_b.messages);
    assert_eq!(store.get(&c).await.unwrap().unwrap().iteration, 3);
    let resumed_c = match store.claim(&c, "w2", TTL, 10).await.unwrap() {
        Claim::Busy => None,
        other => Some(other),
    };
    assert!(resumed_c.is_none(), "c is still leased: {resumed_c:?}");
    // The fenced-off one wrote nothing.
    assert_eq!(store.get(&d).await.unwrap().unwrap(), row_d);
    assert_eq!(store.messages(&d).await.unwrap().len(), from_d);

    // The same batch again (its answer was lost): harmless, nothing doubled.
    let out = store.checkpoint_batch(&refs[..3]).await.unwrap();
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    assert_eq!(store.messages(&a).await.unwrap(), state_a.messages);
    assert_eq!(store.messages(&b).await.unwrap(), state_b.messages);
}

/// Batches and heartbeats over the same sessions, at once and in opposite orders: no lock
/// cycle between them (Postgres would abort one as a deadlock), every write lands.
async fn contract_group_commit_with_heartbeats(store: &dyn Store) {
    // Enough other rows that Postgres looks the sessions up by index, in the order given,
    // rather than in the table's order (which would hide a lock-order cycle).
    let others: Vec<NewSession> = (0..2000)
        .map(|i| new_session(&format!("other {i}")))
        .collect();
    store.create_sessions(&others).await.unwrap();
    let mut sessions = Vec::new();
    for i in 0..24 {
        let id = create(store, &format!("s{i}")).await;
        let (lease, state) = acquire(store, &id, "w", TTL).await;
        sessions.push((lease, state));
    }
    let leases: Vec<Lease> = sessions.iter().map(|(l, _)| l.clone()).collect();
    for round in 0..15 {
        let mut cps = Vec::new();
        for (lease, state) in sessions.iter_mut() {
            let from = state.messages.len();
            state.messages.push(Message::user(format!("round {round}")));
            cps.push(Checkpoint::new(lease, state, from).unwrap());
        }
        let forward: Vec<&Checkpoint> = cps.iter().collect();
        let (first, second) = forward.split_at(12);
        let mut backward: Vec<&Checkpoint> = second.to_vec();
        backward.reverse();
        let mut reversed_leases = leases.clone();
        reversed_leases.reverse();
        let (r1, r2, h1, h2) = tokio::join!(
            store.checkpoint_batch(first),
            store.checkpoint_batch(&backward),
            store.heartbeat(&leases[0].owner, &leases, TTL),
            store.heartbeat(&leases[0].owner, &reversed_leases, TTL),
        );
        for r in r1.unwrap().into_iter().chain(r2.unwrap()) {
            r.unwrap();
        }
        assert!(h1.unwrap().iter().all(|h| h.held && !h.lost));
        assert!(h2.unwrap().iter().all(|h| h.held));
    }
    for (lease, state) in &sessions {
        assert_eq!(
            store.messages(&lease.session_id).await.unwrap(),
            state.messages
        );
    }
}

/// One group claim answers each session as a claim of it alone would: fresh, resumed (its
/// stored history back), taken over from a dead lease (counted), our own lease again, a
/// live lease of another worker, exhausted, finished (settled or not), suspended, unknown,
/// and the same id twice.
async fn contract_group_claim(store: &dyn Backend) {
    // The leases that must be dead by the batch first, then one pass of the clock.
    let exhausted = create(store, "exhausted").await;
    for owner in ["x1", "x2", "x3"] {
        acquire(store, &exhausted, owner, SHORT_TTL).await;
        if owner != "x3" {
            store.pass(SHORT_TTL * 2).await;
        }
    }
    let dead = create(store, "dead lease").await;
    acquire(store, &dead, "crashed", SHORT_TTL).await;
    store.pass(SHORT_TTL * 2).await;
    let fresh = create(store, "fresh").await;
    let resumed = create(store, "resumed").await;
    let (lease, mut state) = acquire(store, &resumed, "w1", TTL).await;
    let mut persisted = state.messages.len();
    iterate(store, &lease, &mut state, &mut persisted, 0).await;
    store.release(&lease).await.unwrap();
    let resumed_state = state;
    let ours = create(store, "our own").await;
    let (our_lease, _) = acquire(store, &ours, "w", TTL).await;
    let busy = create(store, "busy").await;
    acquire(store, &busy, "other", TTL).await;
    let finished = create(store, "finished").await;
    finish(store, &finished, "done").await;
    let settled = create(store, "settled").await;
    finish(store, &settled, "done").await;
    store.mark_announced(&settled).await.unwrap();
    let waiting = create(store, "waiting").await;
    suspended(store, &waiting, "w2", SessionStatus::Waiting).await;

    let ids = [
        fresh.as_str(),
        resumed.as_str(),
        dead.as_str(),
        ours.as_str(),
        busy.as_str(),
        exhausted.as_str(),
        finished.as_str(),
        settled.as_str(),
        waiting.as_str(),
        "no-such-session",
        fresh.as_str(),
    ];
    let answers = store.claim_batch(&ids, "w", TTL, 3).await.unwrap();
    assert_eq!(answers.len(), ids.len());
    let mut answers = answers.into_iter().map(|a| a.unwrap());
    let mut next = || answers.next().unwrap();
    let acquired = |c: Claim, epoch: i64| match c {
        Claim::Acquired { lease, state, row } => {
            assert_eq!(lease.owner, "w");
            assert_eq!(lease.epoch, epoch);
            assert_eq!(row.status, SessionStatus::Running);
            assert_eq!(row.lease_owner.as_deref(), Some("w"));
            assert_eq!(row.lease_epoch, epoch);
            (*state, *row)
        }
        other => panic!("expected Acquired at epoch {epoch}, got {other:?}"),
    };
    let (state, row) = acquired(next(), 1);
    assert_eq!(
        (state.messages.len(), row.attempts, row.takeovers),
        (1, 1, 0)
    );
    let (state, _) = acquired(next(), 2);
    assert_eq!(state, resumed_state);
    let (_, row) = acquired(next(), 2);
    assert_eq!((row.attempts, row.takeovers), (2, 1));
    let (_, row) = acquired(next(), our_lease.epoch + 1);
    assert_eq!((row.attempts, row.takeovers), (2, 0));
    assert!(matches!(next(), Claim::Busy));
    match next() {
        Claim::Exhausted(row) => assert_eq!(row.attempts, 4),
        other => panic!("expected Exhausted, got {other:?}"),
    }
    match next() {
        Claim::Terminal(row) => assert_eq!(row.status, SessionStatus::Completed),
        other => panic!("expected Terminal, got {other:?}"),
    }
    assert!(matches!(next(), Claim::Settled));
    assert!(matches!(next(), Claim::NotRunnable(SessionStatus::Waiting)));
    assert!(matches!(next(), Claim::NotFound));
    assert!(matches!(next(), Claim::Busy));

    // What was refused is unchanged; the busy session is still the other worker's.
    let row = store.get(&busy).await.unwrap().unwrap();
    assert_eq!(
        (row.lease_owner.as_deref(), row.lease_epoch),
        (Some("other"), 1)
    );
    assert_eq!(
        store.get(&waiting).await.unwrap().unwrap().status,
        SessionStatus::Waiting
    );
    // Our first lease of `ours` is fenced off by the second.
    let stale = store.get(&ours).await.unwrap().unwrap();
    assert_eq!(stale.lease_epoch, our_lease.epoch + 1);
    // An empty batch claims nothing.
    assert!(
        store
            .claim_batch(&[], "w", TTL, 3)
            .await
            .unwrap()
            .is_empty()
    );
}

/// Group claims of the same sessions in opposite orders, beside lone claims, from several
/// workers at once: each session is taken exactly once, and none waits on another in a
/// cycle (Postgres would abort one of them as a deadlock).
async fn contract_racing_group_claims(store: &dyn Store) {
    let ids = created(store, 30, "g").await;
    let forward: Vec<&str> = ids.iter().map(String::as_str).collect();
    let backward: Vec<&str> = forward.iter().rev().copied().collect();
    let odd: Vec<&str> = forward.iter().skip(1).step_by(2).copied().collect();
    let batches = [
        ("a", forward.clone()),
        ("b", backward.clone()),
        ("c", odd),
        ("d", backward),
    ];
    let grouped = futures::future::join_all(batches.iter().map(|(owner, ids)| async move {
        let answers = store.claim_batch(ids, owner, TTL, 10).await.unwrap();
        assert_eq!(answers.len(), ids.len());
        ids.iter()
            .zip(answers)
            .map(|(id, a)| (id.to_string(), a.unwrap()))
            .collect::<Vec<_>>()
    }));
    let lone =
        futures::future::join_all(forward.iter().map(|id| async move {
            (id.to_string(), store.claim(id, "e", TTL, 10).await.unwrap())
        }));
    let (grouped, lone) = tokio::join!(grouped, lone);
    let all: Vec<(String, Claim)> = grouped.into_iter().flatten().chain(lone).collect();
    for id in &ids {
        let mine: Vec<&Claim> = all
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, c)| c)
            .collect();
        let won: Vec<&Lease> = mine
            .iter()
            .filter_map(|c| match c {
                Claim::Acquired { lease, .. } => Some(lease),
                _ => None,
            })
            .collect();
        assert_eq!(won.len(), 1, "{id}: {mine:?}");
        assert!(
            mine.iter()
                .all(|c| matches!(c, Claim::Acquired { .. } | Claim::Busy))
        );
        let row = store.get(id).await.unwrap().unwrap();
        assert_eq!(row.lease_owner.as_deref(), Some(won[0].owner.as_str()));
        assert_eq!((row.lease_epoch, row.attempts), (1, 1));
    }
}

/// `n` queued sessions created in one call, their prompts `prefix` and a number.
async fn created(store: &dyn Store, n: usize, prefix: &str) -> Vec<String> {
    let new: Vec<NewSession> = (0..n)
        .map(|i| new_session(&format!("{prefix}{i}")))
        .collect();
    let rows = store.create_sessions(&new).await.unwrap();
    rows.into_iter().map(|(r, _)| r.id).collect()
}
