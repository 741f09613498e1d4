//! Inboxes: deliveries and their positions, approval decisions, the calls held for one, and
//! call ids Postgres cannot hold.

use std::time::Duration;

use chrono::{SubsecRound, Utc};
use serde_json::json;

use agentq_agent::schema::Message;
use agentq_store::store::Store;
use agentq_types::model::{ApprovalRecorded, Claim, Delivered, SessionStatus};
use agentq_types::protocol::InboxKind;

use crate::common::{
    TTL, acquire_seen, call, child, contract_tests, create, default_queue, finish, iterate, steer,
    wake_seq,
};

contract_tests!(
    contract_deliver_and_inbox,
    contract_approvals,
    contract_approval_with_edited_arguments,
    contract_pending_approvals,
    contract_approvals_of_call_ids_postgres_cannot_hold,
);

async fn contract_deliver_and_inbox(store: &dyn Store) {
    let id = create(store, "inbox").await;
    assert!(
        store
            .inbox(&id, &[InboxKind::Message], 0)
            .await
            .unwrap()
            .is_empty()
    );
    let wake = [SessionStatus::Waiting];

    // Positions increase; a queued session is not "woken" (it is queued already).
    let items = [
        (InboxKind::Message, "m1", steer("first")),
        (InboxKind::Followup, "f1", steer("later")),
        (InboxKind::ChildResult, "c1", child("42")),
        (InboxKind::Message, "m2", steer("second")),
    ];
    for (i, (kind, dedupe, payload)) in items.iter().enumerate() {
        let d = store
            .deliver(&id, *kind, dedupe, payload, &wake)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            d,
            Delivered {
                inserted: true,
                seq: i as u64 + 1,
                woken: false,
                held: false,
                queue: "default".into(),
                status: SessionStatus::Queued,
            }
        );
    }
    assert_eq!(wake_seq(store, &id).await, 4);

    // A repeat (a redelivered notification) is a no-op: no new item, no bump.
    let d = store
        .deliver(&id, InboxKind::Message, "m1", &steer("dup"), &wake)
        .await
        .unwrap()
        .unwrap();
    assert!(!d.inserted && !d.woken);
    assert_eq!(d.seq, 0);
    assert_eq!(wake_seq(store, &id).await, 4);

    // Filtered by kinds and position, in order, with the payload as delivered.
    let messages = store.inbox(&id, &[InboxKind::Message], 0).await.unwrap();
    assert_eq!(
        messages.iter().map(|i| i.seq).collect::<Vec<_>>(),
        vec![1, 4]
    );
    assert_eq!(messages[0].kind(), Some(InboxKind::Message));
    assert_eq!(messages[0].steer_message().unwrap().content, "first");
    assert!((Utc::now() - messages[0].created_at).num_seconds().abs() < 60);
    let after = store.inbox(&id, &[InboxKind::Message], 1).await.unwrap();
    assert_eq!(after.iter().map(|i| i.seq).collect::<Vec<_>>(), vec![4]);
    let all = store
        .inbox(
            &id,
            &[
                InboxKind::Message,
                InboxKind::Followup,
                InboxKind::ChildResult,
            ],
            0,
        )
        .await
        .unwrap();
    assert_eq!(
        all.iter()
            .map(|i| (i.seq, i.kind(), i.payload.clone()))
            .collect::<Vec<_>>(),
        items
            .iter()
            .enumerate()
            .map(|(n, (k, _, p))| (n as u64 + 1, Some(*k), p.to_value().unwrap()))
            .collect::<Vec<_>>()
    );
    assert!(
        store
            .inbox(&id, &[InboxKind::ChildResult], 3)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.inbox(&id, &[], 0).await.unwrap().is_empty());
    assert!(
        store
            .inbox("missing", &[InboxKind::Message], 0)
            .await
            .unwrap()
            .is_empty()
    );
    // Another session's inbox is its own (the same dedupe key is independent).
    let other = create(store, "other inbox").await;
    let d = store
        .deliver(&other, InboxKind::Message, "m1", &steer("x"), &wake)
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted);
    assert_eq!(d.seq, 1);

    // Only the listed statuses wake: running stays running ...
    let (lease, _, seen) = acquire_seen(store, &id, "w").await;
    let d = store
        .deliver(&id, InboxKind::Message, "m3", &steer("run"), &wake)
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted && !d.woken);
    assert_eq!(d.seq, 5);
    assert_eq!(d.status, SessionStatus::Running);
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Running);
    assert_eq!(row.lease_owner.as_deref(), Some("w"));

    // ... awaiting an approval is not woken by a message (the suspension saw m3) ...
    let row = store
        .suspend(&lease, SessionStatus::AwaitingApproval, seen + 1, None)
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::AwaitingApproval);
    let d = store
        .deliver(&id, InboxKind::Message, "m4", &steer("held"), &wake)
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted && !d.woken);
    assert_eq!(d.status, SessionStatus::AwaitingApproval);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        SessionStatus::AwaitingApproval
    );
    assert_eq!(wake_seq(store, &id).await, 6);

    // ... but is when its status is listed: queued, to be enqueued.
    let d = store
        .deliver(
            &id,
            InboxKind::Message,
            "m5",
            &steer("wake up"),
            &[SessionStatus::Waiting, SessionStatus::AwaitingApproval],
        )
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted && d.woken);
    assert_eq!(d.seq, 7);
    assert_eq!(d.status, SessionStatus::AwaitingApproval);
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.wake_seq, 7);

    // A waiting session with `Waiting` listed.
    let (lease, _, seen) = acquire_seen(store, &id, "w").await;
    store
        .suspend(&lease, SessionStatus::Waiting, seen, None)
        .await
        .unwrap();
    let d = store
        .deliver(&id, InboxKind::ChildResult, "c2", &steer("done"), &wake)
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted && d.woken);
    assert_eq!(d.status, SessionStatus::Waiting);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );

    assert!(
        store
            .deliver("missing", InboxKind::Message, "x", &steer("1"), &wake)
            .await
            .unwrap()
            .is_none()
    );
}

async fn contract_approvals(store: &dyn Store) {
    let id = create(store, "needs approval").await;
    let (lease, _, seen) = acquire_seen(store, &id, "w").await;
    let deadline = (Utc::now() + chrono::Duration::hours(1)).trunc_subsecs(6);
    let row = store
        .suspend(
            &lease,
            SessionStatus::AwaitingApproval,
            seen,
            Some(deadline),
        )
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::AwaitingApproval);
    assert_eq!(row.approval_deadline, Some(deadline));
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().approval_deadline,
        Some(deadline)
    );
    assert_eq!(
        store.claim(&id, "w", TTL, 10).await.unwrap(),
        Claim::NotRunnable(SessionStatus::AwaitingApproval)
    );
    assert!(store.approval(&id, "call_1").await.unwrap().is_none());

    // The first decision is recorded and wakes the session.
    assert_eq!(
        store
            .decide_approval(&id, "call_1", true, None, None)
            .await
            .unwrap(),
        ApprovalRecorded::Recorded {
            woken: true,
            held: false,
            queue: "default".into()
        }
    );
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.wake_seq, seen + 1);
    assert_eq!(
        store.unenqueued(Duration::ZERO, 100).await.unwrap(),
        default_queue(&id)
    );
    // A second one (another reviewer, a retry) changes nothing.
    assert_eq!(
        store
            .decide_approval(&id, "call_1", false, Some("changed my mind"), None)
            .await
            .unwrap(),
        ApprovalRecorded::AlreadyDecided
    );
    assert_eq!(wake_seq(store, &id).await, seen + 1);
    assert_eq!(
        store.approval(&id, "call_1").await.unwrap(),
        Some((true, None, None))
    );

    // A decision while it runs is recorded and bumps the wake counter, without a wake-up.
    let (lease, _, seen) = acquire_seen(store, &id, "w").await;
    assert_eq!(
        store
            .decide_approval(&id, "call_2", false, Some("too risky"), None)
            .await
            .unwrap(),
        ApprovalRecorded::Recorded {
            woken: false,
            held: false,
            queue: "default".into()
        }
    );
    assert_eq!(
        store.approval(&id, "call_2").await.unwrap(),
        Some((false, Some("too risky".into()), None))
    );
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Running);
    assert_eq!(row.wake_seq, seen + 1);
    // So its suspension goes straight back to the queue.
    let row = store
        .suspend(
            &lease,
            SessionStatus::AwaitingApproval,
            seen,
            Some(deadline),
        )
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert!(store.approval(&id, "call_3").await.unwrap().is_none());

    // Finished and unknown sessions.
    let done = create(store, "done").await;
    finish(store, &done, "ok").await;
    assert_eq!(
        store
            .decide_approval(&done, "call_1", true, None, None)
            .await
            .unwrap(),
        ApprovalRecorded::Finished(SessionStatus::Completed)
    );
    assert!(store.approval(&done, "call_1").await.unwrap().is_none());
    assert_eq!(
        store
            .decide_approval("missing", "call_1", true, None, None)
            .await
            .unwrap(),
        ApprovalRecorded::NotFound
    );
    assert!(store.approval("missing", "call_1").await.unwrap().is_none());
}

/// The calls a session holds for a decision, as a reader finds them from its row: those
/// the latest response made that the run held, without a result or a decision yet.
async fn contract_pending_approvals(store: &dyn Store) {
    let id = create(store, "write two files").await;
    let (lease, mut state, seen) = acquire_seen(store, &id, "w").await;
    let mut persisted = state.messages.len();
    // An earlier round, answered: its call is not pending whatever a reader asks.
    iterate(store, &lease, &mut state, &mut persisted, 0).await;
    let w1 = call("w1", "write_file", json!({"path": "a.txt", "content": "A"}));
    let w2 = call("w2", "write_file", json!({"path": "b.txt", "content": "B"}));
    let r = call("r", "read_file", json!({"path": "notes.txt"}));
    let mut reply = Message::assistant("writing both");
    reply.tool_calls = vec![w1.clone(), r.clone(), w2.clone()];
    state.push_assistant(reply);
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    persisted = state.messages.len();
    // The read ran; both writes were held.
    state.push_tool_result(r.clone(), "notes".into(), false);
    state.hold_for_approval("w2");
    state.hold_for_approval("w1");
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    persisted = state.messages.len();
    let row = store
        .suspend(&lease, SessionStatus::AwaitingApproval, seen, None)
        .await
        .unwrap();
    assert_eq!(row.held_calls, ["w2", "w1"]);
    assert!(row.may_hold_calls());
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.held_calls, ["w2", "w1"]);
    // In the response's order, with their arguments.
    assert_eq!(
        store.pending_approvals(&id, &row.held_calls).await.unwrap(),
        [w1.clone(), w2.clone()]
    );
    // Only held calls count: an answered one and one of an earlier round do not.
    let asked: Vec<String> = ["r", "call_00000", "w2"].map(String::from).into();
    assert_eq!(
        store.pending_approvals(&id, &asked).await.unwrap(),
        std::slice::from_ref(&w2)
    );
    assert!(store.pending_approvals(&id, &[]).await.unwrap().is_empty());
    assert!(
        store
            .pending_approvals("missing", &row.held_calls)
            .await
            .unwrap()
            .is_empty()
    );

    // A decision takes its call off the list, even before a run acts on it.
    store
        .decide_approval(&id, "w1", true, None, None)
        .await
        .unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(
        store.pending_approvals(&id, &row.held_calls).await.unwrap(),
        std::slice::from_ref(&w2)
    );

    // The approved call ran; the other is held again.
    let (lease, mut state, seen) = acquire_seen(store, &id, "w").await;
    assert_eq!(state.not_started, ["w2", "w1"]);
    state.push_tool_result(w1.clone(), "written".into(), false);
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    let row = store
        .suspend(&lease, SessionStatus::AwaitingApproval, seen, None)
        .await
        .unwrap();
    assert_eq!(row.held_calls, ["w2"]);
    assert_eq!(
        store.pending_approvals(&id, &row.held_calls).await.unwrap(),
        std::slice::from_ref(&w2)
    );

    // Cancelled while holding: the row still records the call, the session holds nothing.
    store.request_cancel(&id).await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Cancelled);
    assert_eq!(row.held_calls, ["w2"]);
    assert!(!row.may_hold_calls());
    // A follow-up turn moves past that response: nothing is pending any more.
    let row = store
        .follow_up(&id, "never mind, just say hi", None)
        .await
        .unwrap()
        .unwrap();
    assert!(row.may_hold_calls());
    assert!(
        store
            .pending_approvals(&id, &row.held_calls)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A model names its calls as it likes: ids with NUL (which no Postgres text holds) and
/// the escape character are held, decided, read and listed like any other.
async fn contract_approvals_of_call_ids_postgres_cannot_hold(store: &dyn Store) {
    let id = create(store, "write it").await;
    let (lease, mut state, seen) = acquire_seen(store, &id, "w").await;
    let persisted = state.messages.len();
    let nul = call(
        "c\0x",
        "write_file",
        json!({"path": "a.txt", "content": "A"}),
    );
    let esc = call(
        "c\u{FDD0}0",
        "write_file",
        json!({"path": "b.txt", "content": "B"}),
    );
    let mut reply = Message::assistant("writing");
    reply.tool_calls = vec![nul.clone(), esc.clone()];
    state.push_assistant(reply);
    state.hold_for_approval(&nul.id);
    state.hold_for_approval(&esc.id);
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    store
        .suspend(&lease, SessionStatus::AwaitingApproval, seen, None)
        .await
        .unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        store.pending_approvals(&id, &row.held_calls).await.unwrap(),
        [nul.clone(), esc.clone()]
    );
    assert_eq!(store.approval(&id, &nul.id).await.unwrap(), None);
    store
        .decide_approval(&id, &esc.id, false, Some("no"), None)
        .await
        .unwrap();
    assert_eq!(
        store.approval(&id, &esc.id).await.unwrap(),
        Some((false, Some("no".to_string()), None))
    );
    // `ESC 0` is not NUL: the two ids stay apart.
    assert_eq!(store.approval(&id, "c\0").await.unwrap(), None);
    assert_eq!(
        store.pending_approvals(&id, &row.held_calls).await.unwrap(),
        std::slice::from_ref(&nul)
    );
    store
        .decide_approval(&id, &nul.id, true, None, None)
        .await
        .unwrap();
    assert_eq!(
        store.approval(&id, &nul.id).await.unwrap(),
        Some((true, None, None))
    );
    assert!(
        store
            .pending_approvals(&id, &row.held_calls)
            .await
            .unwrap()
            .is_empty()
    );
}

/// An approval with edited arguments keeps them, exactly, as the first decision: a later
/// decision (with or without arguments) changes neither the decision nor the arguments.
async fn contract_approval_with_edited_arguments(store: &dyn Store) {
    let id = create(store, "edited").await;
    let edited = json!({"path": "b.txt", "content": "NUL \u{0} and \u{e9}"}).to_string();
    assert!(matches!(
        store
            .decide_approval(&id, "call_1", true, None, Some(&edited))
            .await
            .unwrap(),
        ApprovalRecorded::Recorded { .. }
    ));
    assert_eq!(
        store.approval(&id, "call_1").await.unwrap(),
        Some((true, None, Some(edited.clone())))
    );
    assert_eq!(
        store
            .decide_approval(&id, "call_1", true, None, Some("{}"))
            .await
            .unwrap(),
        ApprovalRecorded::AlreadyDecided
    );
    assert_eq!(
        store.approval(&id, "call_1").await.unwrap(),
        Some((true, None, Some(edited)))
    );
}
