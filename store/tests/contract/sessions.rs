//! Session rows: creation and its idempotency, batches, reads and listings, the counts, and
//! the changes made from outside a run (cancel, retry), with text Postgres cannot hold.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::spec::{ExitReason, Mode, SessionSpec};
use agentq_agent::state::{Outcome, Phase, SessionState};
use agentq_error::Error;
use agentq_store::RetryResult;
use agentq_store::store::Store;
use agentq_types::model::{CancelResult, Claim, ListFilter, NewSession, SessionStatus};
use agentq_types::protocol::InboxKind;
use agentq_types::wait::WaitReason;

use crate::common::{
    Backend, SHORT_TTL, TTL, acquire, acquire_seen, contract_tests, count_all, create,
    default_queue, iterate, new_session, steer, suspended,
};

contract_tests!(
    contract_create_and_idempotency,
    contract_batch,
    contract_messages_of_a_missing_session,
    contract_list_paging,
    contract_list_filters,
    contract_count_unfinished,
    contract_request_cancel,
    contract_retry,
    contract_text_postgres_cannot_hold_reads_back_exactly,
);

async fn contract_create_and_idempotency(store: &dyn Backend) {
    store.check_schema().await.unwrap();
    store.ping().await.unwrap();

    let first = new_session("summarise the repo").with_idempotency_key("req-1");
    let (row, created) = store.create_session(&first).await.unwrap();
    assert!(created);
    assert_eq!(row.id, first.id);
    assert_eq!(row.root_id, first.id);
    assert_eq!(row.queue, "default");
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.spec, first.spec);
    assert_eq!((row.lease_epoch, row.attempts, row.iteration), (0, 0, 0));
    assert_eq!(row.idempotency_key.as_deref(), Some("req-1"));
    assert!(row.lease_owner.is_none() && row.finished_at.is_none());
    assert!(!row.cancel_requested);
    assert!((Utc::now() - row.created_at).num_seconds().abs() < 60);
    assert_eq!(store.get(&row.id).await.unwrap().unwrap(), row);

    // The same request again (a client retry): a new id, the same key.
    let again = new_session("summarise the repo").with_idempotency_key("req-1");
    let (row2, created2) = store.create_session(&again).await.unwrap();
    assert!(!created2);
    assert_eq!(row2, row);
    assert!(store.get(&again.id).await.unwrap().is_none());

    // Re-sending the very same item (same id) is also a repeat.
    let (row3, created3) = store.create_session(&first).await.unwrap();
    assert!(!created3);
    assert_eq!(row3.id, row.id);
    // So is the same id without the key.
    let mut same_id = first.clone();
    same_id.idempotency_key = None;
    let (row4, created4) = store.create_session(&same_id).await.unwrap();
    assert!(!created4);
    assert_eq!(row4.id, row.id);

    // The history starts with the prompt, as a fresh state does.
    let msgs = store.messages(&row.id).await.unwrap();
    assert_eq!(msgs, vec![Message::user("summarise the repo")]);
    assert!(matches!(
        store.messages("nope").await,
        Err(Error::NotFound(_))
    ));
    assert!(store.get("nope").await.unwrap().is_none());

    // What the stores rely on to keep message 0 only in the spec: in every mode, a fresh
    // history is the prompt alone.
    for mode in [Mode::Act, Mode::Think, Mode::Plan, Mode::PlanAct] {
        let mut spec = SessionSpec::new("p");
        spec.mode = mode;
        assert_eq!(
            SessionState::new("x", spec).messages,
            vec![Message::user("p")]
        );
    }

    // A plan-act session starts in the plan phase; a claim returns exactly a fresh state.
    let mut spec = SessionSpec::new("plan first");
    spec.mode = Mode::PlanAct;
    let (planned, _) = store
        .create_session(&NewSession::root(spec.clone(), "other"))
        .await
        .unwrap();
    assert_eq!(planned.queue, "other");
    let (_, state) = acquire(store, &planned.id, "w", TTL).await;
    assert_eq!(state.phase, Phase::Plan);
    assert_eq!(state, SessionState::new(planned.id.clone(), spec));
    assert_eq!(state.messages, vec![Message::user("plan first")]);

    // A child session keeps its parent, root and depth.
    let mut child = new_session("child");
    child.parent_id = Some(row.id.clone());
    child.root_id = row.id.clone();
    child.depth = 1;
    let (c, created) = store.create_session(&child).await.unwrap();
    assert!(created);
    assert_eq!(c.parent_id.as_deref(), Some(row.id.as_str()));
    assert_eq!((c.root_id.as_str(), c.depth), (row.id.as_str(), 1));
    assert_eq!(
        store.messages(&c.id).await.unwrap(),
        [Message::user("child")]
    );

    // Within one batch, a duplicate key maps to the first item's row.
    let a = new_session("a").with_idempotency_key("k-a");
    let b = new_session("b").with_idempotency_key("k-a");
    let c = new_session("c");
    let out = store
        .create_sessions(&[a.clone(), b, c.clone()])
        .await
        .unwrap();
    assert_eq!(out.len(), 3);
    assert!(out[0].1 && !out[1].1 && out[2].1);
    assert_eq!(out[0].0.id, a.id);
    assert_eq!(out[1].0.id, a.id);
    assert_eq!(out[2].0.id, c.id);
    assert!(store.create_sessions(&[]).await.unwrap().is_empty());
    assert_eq!(count_all(store).await, 5);
    assert_eq!(store.rows("sessions").await, 5);
}

async fn contract_batch(store: &dyn Backend) {
    let batch: Vec<NewSession> = (0..1000)
        .map(|i| new_session(&format!("task {i}")).with_idempotency_key(format!("batch-{i}")))
        .collect();
    let out = store.create_sessions(&batch).await.unwrap();
    assert_eq!(out.len(), 1000);
    for (s, (row, created)) in batch.iter().zip(&out) {
        assert!(created);
        assert_eq!(row.id, s.id);
        assert_eq!(row.spec.prompt, s.spec.prompt);
    }
    assert_eq!(count_all(store).await, 1000);
    assert_eq!(store.rows("sessions").await, 1000);
    // A fresh history is the prompt alone, which the spec holds: no message row.
    assert_eq!(store.rows("messages").await, 0);
    assert_eq!(
        store.messages(&batch[999].id).await.unwrap(),
        [Message::user("task 999")]
    );
    for (s, (row, _)) in batch.iter().zip(&out).step_by(97) {
        assert_eq!(
            store.messages(&row.id).await.unwrap(),
            vec![Message::user(s.spec.prompt.clone())]
        );
    }

    // The whole batch again: nothing new, every item answered with its row.
    let again = store.create_sessions(&batch).await.unwrap();
    assert!(again.iter().all(|(_, created)| !created));
    assert!(again.iter().zip(&out).all(|(a, b)| a.0 == b.0));

    let big: Vec<NewSession> = (0..10_000)
        .map(|i| new_session(&format!("big {i}")))
        .collect();
    // Its time is the batch scale test's and the bench's to measure, not this one's.
    let out = store.create_sessions(&big).await.unwrap();
    assert_eq!(out.len(), 10_000);
    assert!(out.iter().all(|(_, c)| *c));
    // Counted in the table: a listing stops at 10,000.
    assert_eq!(store.rows("sessions").await, 11_000);
}

/// A missing session has no history (an error), a fresh one has its prompt.
async fn contract_messages_of_a_missing_session(store: &dyn Store) {
    assert!(matches!(
        store.messages("no-such-session").await,
        Err(Error::NotFound(id)) if id == "no-such-session"
    ));
    let id = create(store, "only the prompt").await;
    assert_eq!(
        store.messages(&id).await.unwrap(),
        vec![Message::user("only the prompt")]
    );
}

async fn contract_list_paging(store: &dyn Store) {
    let mut all = Vec::new();
    for i in 0..25 {
        all.push(create(store, &format!("s{i}")).await);
    }
    let root = all[0].clone();
    let mut children = Vec::new();
    for i in 0..3 {
        let mut child = NewSession::root(SessionSpec::new(format!("child {i}")), "default");
        child.parent_id = Some(root.clone());
        child.root_id = root.clone();
        child.depth = 1;
        let (row, _) = store.create_session(&child).await.unwrap();
        assert_eq!((row.root_id.as_str(), row.depth), (root.as_str(), 1));
        children.push(row.id.clone());
        all.push(row.id);
    }
    all.sort();
    all.reverse();

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list(&ListFilter {
                limit: 10,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 10);
        cursor = page.last().map(|r| r.id.clone());
        seen.extend(page.into_iter().map(|r| r.id));
    }
    assert_eq!(seen, all);

    for id in &all[..4] {
        store.request_cancel(id).await.unwrap();
    }
    let cancelled = store
        .list(&ListFilter {
            status: Some(SessionStatus::Cancelled),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        cancelled.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        all[..4].to_vec()
    );
    let queued = store
        .list(&ListFilter {
            status: Some(SessionStatus::Queued),
            cursor: Some(all[10].clone()),
            limit: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        queued.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        all[11..16].to_vec()
    );

    let mut kids: Vec<String> = store
        .list(&ListFilter {
            parent_id: Some(root.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    kids.reverse();
    children.sort();
    assert_eq!(kids, children);
    // limit 0 means the default page, not nothing.
    assert_eq!(
        store.list(&ListFilter::default()).await.unwrap().len(),
        all.len()
    );
}

async fn contract_count_unfinished(store: &dyn Store) {
    let counts = |v: Vec<(SessionStatus, u64)>| {
        let mut v = v;
        v.sort_by_key(|(s, _)| s.as_str());
        v
    };
    assert!(store.count_unfinished().await.unwrap().is_empty());
    let a = create(store, "a").await;
    let _b = create(store, "b").await;
    let c = create(store, "c").await;
    suspended(store, &a, "w1", SessionStatus::Waiting).await;
    let _ = acquire_seen(store, &c, "w1").await;
    assert_eq!(
        counts(store.count_unfinished().await.unwrap()),
        vec![
            (SessionStatus::Queued, 1),
            (SessionStatus::Running, 1),
            (SessionStatus::Waiting, 1)
        ]
    );
}

async fn contract_request_cancel(store: &dyn Backend) {
    let queued = create(store, "queued").await;
    match store.request_cancel(&queued).await.unwrap() {
        CancelResult::CancelledNow(row) => {
            assert_eq!(row.status, SessionStatus::Cancelled);
            assert_eq!(row.finish_reason, Some(ExitReason::Interrupted));
            assert!(row.finished_at.is_some());
            assert!(row.cancel_requested);
        }
        other => panic!("expected CancelledNow, got {other:?}"),
    }
    assert!(matches!(
        store.request_cancel(&queued).await.unwrap(),
        CancelResult::AlreadyFinished(_)
    ));
    // Its queue entry, when a worker reads it, is not run.
    assert!(matches!(
        store.claim(&queued, "w", TTL, 10).await.unwrap(),
        Claim::Terminal(_)
    ));

    // Suspended sessions are cancelled at once too, and not run.
    let waiting = create(store, "waiting").await;
    suspended(store, &waiting, "w", SessionStatus::AwaitingApproval).await;
    assert_eq!(
        store.claim(&waiting, "w", TTL, 10).await.unwrap(),
        Claim::NotRunnable(SessionStatus::AwaitingApproval)
    );
    assert!(matches!(
        store.request_cancel(&waiting).await.unwrap(),
        CancelResult::CancelledNow(_)
    ));

    // Running: the owner is told; if it dies first, the next claimer sees the flag.
    let running = create(store, "running").await;
    let (lease, state) = acquire(store, &running, "w1", SHORT_TTL).await;
    assert!(matches!(
        store.request_cancel(&running).await.unwrap(),
        CancelResult::Requested(_)
    ));
    let row = store.get(&running).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Running);
    assert!(row.cancel_requested);
    assert_eq!(row.lease_owner.as_deref(), Some("w1"));
    store.pass(SHORT_TTL * 2).await;
    let (lease2, state2) = match store.claim(&running, "w2", TTL, 10).await.unwrap() {
        Claim::Acquired { row, lease, state } => {
            assert!(row.cancel_requested);
            (lease, *state)
        }
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert_eq!(state2, state);
    // The old owner can no longer write; the new one finishes it as interrupted.
    assert!(matches!(
        store.checkpoint(&lease, &state, 1).await,
        Err(Error::LeaseLost(_))
    ));
    let mut state2 = state2;
    state2.outcome = Some(Outcome::new(ExitReason::Interrupted));
    store.checkpoint(&lease2, &state2, 1).await.unwrap();
    assert_eq!(
        store.get(&running).await.unwrap().unwrap().status,
        SessionStatus::Cancelled
    );

    assert_eq!(
        store.request_cancel("missing").await.unwrap(),
        CancelResult::NotFound
    );
    assert_eq!(
        store.claim("missing", "w", TTL, 10).await.unwrap(),
        Claim::NotFound
    );
}

async fn contract_retry(store: &dyn Store) {
    // A run that committed one iteration, then failed with an error.
    let id = create(store, "flaky").await;
    let (lease, mut state) = acquire(store, &id, "w1", TTL).await;
    let mut persisted = state.messages.len();
    iterate(store, &lease, &mut state, &mut persisted, 1).await;
    let committed = state.messages.clone();
    state.outcome = Some(Outcome {
        reason: ExitReason::Error,
        result: None,
        error: Some("LLM call failed after 3 attempts: HTTP 500".into()),
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    let failed = store.get(&id).await.unwrap().unwrap();
    assert_eq!(failed.status, SessionStatus::Failed);

    let row = match store.retry(&id, false).await.unwrap() {
        RetryResult::Retried(row) => *row,
        other => panic!("expected Retried, got {other:?}"),
    };
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.finish_reason, None);
    assert!(row.error.is_none() && row.result.is_none() && row.finished_at.is_none());
    assert_eq!(row.attempts, 0);
    assert_eq!((failed.retries, row.retries), (0, 1));
    assert!(row.lease_owner.is_none());
    assert!(row.lease_epoch > failed.lease_epoch, "the epoch moves on");
    assert_eq!(row.iteration, failed.iteration, "the checkpoint stays");
    // Without an entry: the caller enqueues it (or the sweeper does).
    assert_eq!(
        store.unenqueued(Duration::ZERO, 10).await.unwrap(),
        default_queue(&id)
    );

    // Idempotent: a second retry of the same failure changes nothing.
    match store.retry(&id, false).await.unwrap() {
        RetryResult::NotRetryable(r) => {
            assert_eq!(r.status, SessionStatus::Queued);
            assert_eq!(r.lease_epoch, row.lease_epoch);
        }
        other => panic!("expected NotRetryable, got {other:?}"),
    }
    // Fenced: the failed run's lease cannot write any more.
    let mut stale = state.clone();
    stale.outcome = None;
    assert!(matches!(
        store.checkpoint(&lease, &stale, persisted).await,
        Err(Error::LeaseLost(_))
    ));

    // The next claim resumes from the checkpoint with a fresh claim allowance.
    match store.claim(&id, "w2", TTL, 1).await.unwrap() {
        Claim::Acquired { state, row, .. } => {
            assert_eq!(state.messages, committed);
            assert!(state.outcome.is_none());
            assert_eq!(row.attempts, 1);
        }
        other => panic!("expected Acquired, got {other:?}"),
    }

    // A dead-lettered session can be retried; held, it waits for the dispatcher.
    let dead = create(store, "poison").await;
    store.fail(&dead, "delivered 3 times").await.unwrap();
    match store.retry(&dead, true).await.unwrap() {
        RetryResult::Retried(r) => assert_eq!(r.status, SessionStatus::Queued),
        other => panic!("expected Retried, got {other:?}"),
    }
    assert!(
        store
            .unenqueued(Duration::ZERO, 10)
            .await
            .unwrap()
            .iter()
            .all(|(i, _)| i != &dead),
        "a held session is the dispatcher's, not the sweeper's"
    );
    assert_eq!(
        store.held("default", 10, 10).await.unwrap().len(),
        1,
        "held for the dispatcher"
    );

    // Not failed with an error: completed, cancelled, failed for another reason, queued.
    let done = create(store, "done").await;
    let (lease, mut state) = acquire(store, &done, "w", TTL).await;
    let persisted = state.messages.len();
    state.outcome = Some(Outcome {
        reason: ExitReason::MaxIterations,
        result: None,
        error: Some("too many".into()),
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert!(matches!(
        store.retry(&done, false).await.unwrap(),
        RetryResult::NotRetryable(r) if r.status == SessionStatus::Failed
    ));
    let queued = create(store, "queued").await;
    assert!(matches!(
        store.retry(&queued, false).await.unwrap(),
        RetryResult::NotRetryable(r) if r.status == SessionStatus::Queued
    ));
    assert_eq!(
        store.retry("missing", false).await.unwrap(),
        RetryResult::NotFound
    );
}

/// NUL (which Postgres' text and jsonb cannot hold) and the stores' escape character, in
/// everything a caller or a model writes: the spec (prompt, system prompt, metadata), the
/// model's answers and tool results, the outcome, inbox payloads, approval reasons and
/// follow-ups. Each is stored, reads back byte for byte (`get`, `messages`, a resuming
/// claim, the inbox), and the session's other reads keep working.
async fn contract_text_postgres_cannot_hold_reads_back_exactly(store: &dyn Store) {
    // NUL, the escape character (alone, and as the stored forms of NUL and of itself),
    // and the six characters of JSON's escape for NUL.
    let hostile = "a\0b \u{FDD0}0 \u{FDD0}\u{FDD0} \\u0000 \u{FDD0} \0";
    assert!(hostile.contains('\0') && hostile.contains('\u{FDD0}'));
    let mut spec = SessionSpec::new(format!("prompt {hostile}"));
    spec.system = Some(format!("system {hostile}"));
    spec.metadata = json!({ "note": hostile, hostile: [hostile] });
    let (row, created) = store
        .create_session(&NewSession::root(spec.clone(), "default"))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(row.spec, spec);
    let id = row.id;
    assert_eq!(store.get(&id).await.unwrap().unwrap().spec, spec);
    assert_eq!(
        store.messages(&id).await.unwrap(),
        vec![Message::user(spec.prompt.clone())]
    );

    let (lease, mut state) = acquire(store, &id, "w", TTL).await;
    assert_eq!(state.spec, spec);
    let persisted = state.messages.len();
    let mut reply = Message::assistant(format!("answer {hostile}"));
    reply.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "read_file".into(),
        arguments: json!({ "path": hostile }).into(),
    }];
    state.push_assistant(reply);
    state.messages.push(Message::tool_result(
        "call_1",
        "read_file",
        format!("contents {hostile}"),
        false,
    ));
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);
    // The pending-approvals read looks into the stored bodies.
    assert!(
        store
            .pending_approvals(&id, &["call_1".to_string()])
            .await
            .unwrap()
            .iter()
            .all(|c| c.id == "call_1")
    );

    // A resumed claim gets exactly what was written.
    let (lease, resumed) = acquire(store, &id, "w", TTL).await;
    assert_eq!(resumed.messages, state.messages);
    assert_eq!(resumed.spec, spec);

    // The inbox and approvals carry caller text too.
    let delivered = store
        .deliver(&id, InboxKind::Message, "d1", &steer(hostile), &[])
        .await
        .unwrap()
        .unwrap();
    assert!(delivered.inserted);
    let items = store.inbox(&id, &[InboxKind::Message], 0).await.unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].payload, steer(hostile).to_value().unwrap());
    store
        .decide_approval(&id, "call_1", false, Some(hostile), None)
        .await
        .unwrap();
    assert_eq!(
        store.approval(&id, "call_1").await.unwrap(),
        Some((false, Some(hostile.to_string()), None))
    );

    // The final answer and the error are text columns.
    let mut state = resumed;
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant(format!("final {hostile}")));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some(format!("result {hostile}")),
        error: Some(format!("error {hostile}")),
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    let done = store.get(&id).await.unwrap().unwrap();
    assert_eq!(done.status, SessionStatus::Completed);
    assert_eq!(done.result, Some(format!("result {hostile}")));
    assert_eq!(done.error, Some(format!("error {hostile}")));
    assert_eq!(store.messages(&id).await.unwrap(), state.messages);

    // A follow-up turn's text, and a failure's reason.
    store
        .follow_up(&id, &format!("more {hostile}"), None)
        .await
        .unwrap()
        .unwrap();
    let history = store.messages(&id).await.unwrap();
    assert_eq!(
        history.last().unwrap(),
        &Message::user(format!("more {hostile}"))
    );
    let failed = store
        .fail(&id, &format!("reason {hostile}"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.error, Some(format!("reason {hostile}")));
    assert_eq!(store.get(&id).await.unwrap().unwrap(), failed);
}

/// Every filter of a listing, alone and together, newest first and oldest first, with the
/// cursor: exactly the rows asked for, on both backends.
async fn contract_list_filters(store: &dyn Backend) {
    let ids = |rows: Vec<agentq_types::model::SessionRow>| -> Vec<String> {
        rows.into_iter().map(|r| r.id).collect()
    };
    let list = |f: ListFilter| async move { ids(store.list(&f).await.unwrap()) };
    let early = create(store, "early").await;
    // An hour passes for the store: a time half an hour ago splits the sessions.
    store.pass(Duration::from_secs(3600)).await;
    let mid = Utc::now() - chrono::TimeDelta::minutes(30);
    let mut other_queue = new_session("other queue");
    other_queue.queue = "bulk".into();
    other_queue.sched.batch_id = Some("b1".into());
    let other_queue = store.create_session(&other_queue).await.unwrap().0.id;
    let failed = create(store, "failed").await;
    store.fail(&failed, "boom").await.unwrap();
    let approval = create(store, "approval").await;
    suspended(store, &approval, "o", SessionStatus::AwaitingApproval).await;
    let children = create(store, "children").await;
    suspended(store, &children, "o", SessionStatus::Waiting).await;

    let by = |f: ListFilter| ListFilter { limit: 100, ..f };
    assert_eq!(
        list(by(ListFilter {
            finish_reason: Some(ExitReason::Error),
            ..Default::default()
        }))
        .await,
        std::slice::from_ref(&failed)
    );
    assert_eq!(
        list(by(ListFilter {
            wait_reason: Some(WaitReason::Approval),
            ..Default::default()
        }))
        .await,
        std::slice::from_ref(&approval)
    );
    assert_eq!(
        list(by(ListFilter {
            wait_reason: Some(WaitReason::Children),
            ..Default::default()
        }))
        .await,
        std::slice::from_ref(&children)
    );
    assert!(
        list(by(ListFilter {
            wait_reason: Some(WaitReason::RateLimit),
            ..Default::default()
        }))
        .await
        .is_empty()
    );
    assert_eq!(
        list(by(ListFilter {
            queue: Some("bulk".into()),
            batch_id: Some("b1".into()),
            ..Default::default()
        }))
        .await,
        std::slice::from_ref(&other_queue)
    );
    assert_eq!(
        list(by(ListFilter {
            created_before: Some(mid),
            ..Default::default()
        }))
        .await,
        std::slice::from_ref(&early)
    );
    let after = vec![
        children.clone(),
        approval.clone(),
        failed.clone(),
        other_queue.clone(),
    ];
    assert_eq!(
        list(by(ListFilter {
            created_after: Some(mid),
            ..Default::default()
        }))
        .await,
        after
    );
    // Oldest first, a page at a time past the cursor, with a filter.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = list(ListFilter {
            created_after: Some(mid),
            oldest_first: true,
            limit: 2,
            cursor: cursor.clone(),
            ..Default::default()
        })
        .await;
        if page.is_empty() {
            break;
        }
        cursor = page.last().cloned();
        seen.extend(page);
    }
    let mut oldest = after.clone();
    oldest.reverse();
    assert_eq!(seen, oldest);
    // Filters together: nothing matches both a queue and another one's reason.
    assert!(
        list(by(ListFilter {
            queue: Some("bulk".into()),
            finish_reason: Some(ExitReason::Error),
            ..Default::default()
        }))
        .await
        .is_empty()
    );
}
