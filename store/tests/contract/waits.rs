//! Suspension and waking: children, approvals past their deadline, rate limits, spent
//! budgets, and follow-ups on finished sessions.

use std::time::Duration;

use chrono::Utc;

use agentq_agent::schema::Message;
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Outcome;
use agentq_error::Error;
use agentq_store::store::Store;
use agentq_types::model::{CancelResult, Claim, Lease, SessionStatus};
use agentq_types::protocol::InboxKind;
use agentq_types::wait::WaitReason;

use crate::common::{
    Backend, SHORT_TTL, TTL, acquire, acquire_seen, child, contract_tests, create, default_queue,
    new_session, steer, two_sweeps, wake_seq, woken,
};

contract_tests!(
    contract_suspend,
    contract_wake_expired_approvals,
    contract_rate_limit_waits,
    contract_budget_waits,
    contract_follow_up,
);

async fn contract_suspend(store: &dyn Store) {
    let id = create(store, "wait for a child").await;
    store
        .mark_enqueued(std::slice::from_ref(&id))
        .await
        .unwrap();
    let (lease, _, seen) = acquire_seen(store, &id, "w1").await;
    assert_eq!(seen, 0);
    assert_eq!(store.get(&id).await.unwrap().unwrap().attempts, 1);

    // Fenced: a lease that is not the current one (older epoch, or another owner)
    // changes nothing.
    let before = store.get(&id).await.unwrap().unwrap();
    for stale in [
        Lease {
            epoch: lease.epoch - 1,
            ..lease.clone()
        },
        Lease {
            owner: "w-other".into(),
            ..lease.clone()
        },
    ] {
        let err = store
            .suspend(&stale, SessionStatus::Waiting, seen, None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::LeaseLost(ref s) if s == &id),
            "{err:?}"
        );
    }
    assert_eq!(store.get(&id).await.unwrap().unwrap(), before);

    // Nothing arrived since the claim: it sleeps, holding no lease.
    let row = store
        .suspend(&lease, SessionStatus::Waiting, seen, None)
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Waiting);
    assert!(row.lease_owner.is_none() && row.lease_expires_at.is_none());
    assert_eq!(row.attempts, 0);
    assert_eq!(row.lease_epoch, lease.epoch);
    assert!(row.finish_reason.is_none() && row.finished_at.is_none());
    assert_eq!(store.get(&id).await.unwrap().unwrap(), row);
    assert_eq!(
        store.claim(&id, "w2", TTL, 10).await.unwrap(),
        Claim::NotRunnable(SessionStatus::Waiting)
    );
    // Suspended twice (a retry): the lease is gone.
    assert!(matches!(
        store
            .suspend(&lease, SessionStatus::Waiting, seen, None)
            .await,
        Err(Error::LeaseLost(_))
    ));
    assert!(
        store
            .unenqueued(Duration::ZERO, 100)
            .await
            .unwrap()
            .is_empty()
    );

    // A child's result wakes it: queued, and its queue entry must be added again.
    let d = store
        .deliver(
            &id,
            InboxKind::ChildDone,
            "child-1",
            &child("c1"),
            &[SessionStatus::Waiting],
        )
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted && d.woken);
    assert_eq!(d.status, SessionStatus::Waiting);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().status,
        SessionStatus::Queued
    );
    assert_eq!(
        store.unenqueued(Duration::ZERO, 100).await.unwrap(),
        default_queue(&id)
    );
    store
        .mark_enqueued(std::slice::from_ref(&id))
        .await
        .unwrap();

    // A later claim works and sees the bump.
    let (lease2, _, seen2) = acquire_seen(store, &id, "w2").await;
    assert!(lease2.epoch > lease.epoch);
    assert_eq!(seen2, 1);
    assert!(
        store
            .unenqueued(Duration::ZERO, 100)
            .await
            .unwrap()
            .is_empty(),
        "running and enqueued"
    );

    // Something arrives while it runs (it does not wake a running session) ...
    let d = store
        .deliver(
            &id,
            InboxKind::ChildDone,
            "child-2",
            &child("c2"),
            &[SessionStatus::Waiting],
        )
        .await
        .unwrap()
        .unwrap();
    assert!(d.inserted && !d.woken);
    assert_eq!(d.status, SessionStatus::Running);
    assert_eq!(wake_seq(store, &id).await, 2);
    // ... so the suspension that follows, having seen only 1, goes back to the queue
    // instead of sleeping through it, with its (consumed) entry forgotten.
    let row = store
        .suspend(&lease2, SessionStatus::Waiting, seen2, None)
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert!(row.lease_owner.is_none() && row.lease_expires_at.is_none());
    assert_eq!(row.attempts, 0);
    assert_eq!(
        store.unenqueued(Duration::ZERO, 100).await.unwrap(),
        default_queue(&id)
    );
    let (lease3, _, seen3) = acquire_seen(store, &id, "w3").await;
    assert_eq!(seen3, 2);
    assert_eq!(store.get(&id).await.unwrap().unwrap().attempts, 1);

    // A cancel requested while it ran: suspending cancels it instead.
    assert!(matches!(
        store.request_cancel(&id).await.unwrap(),
        CancelResult::Requested(_)
    ));
    let row = store
        .suspend(&lease3, SessionStatus::AwaitingApproval, seen3, None)
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Cancelled);
    assert_eq!(row.finish_reason, Some(ExitReason::Interrupted));
    assert!(row.finished_at.is_some());
    assert!(row.lease_owner.is_none());
    assert!(matches!(
        store.claim(&id, "w4", TTL, 10).await.unwrap(),
        Claim::Terminal(_)
    ));
    // A cancel wins over a wake that arrived too.
    let other = create(store, "cancel wins").await;
    let (lease, _, seen) = acquire_seen(store, &other, "w1").await;
    store
        .deliver(&other, InboxKind::Message, "m", &steer("hi"), &[])
        .await
        .unwrap()
        .unwrap();
    store.request_cancel(&other).await.unwrap();
    let row = store
        .suspend(&lease, SessionStatus::Waiting, seen, None)
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Cancelled);
}

async fn contract_wake_expired_approvals(store: &dyn Backend) {
    let now = Utc::now();
    // (status, deadline) per session.
    let cases = [
        (
            SessionStatus::AwaitingApproval,
            Some(now - chrono::Duration::seconds(60)),
        ),
        (
            SessionStatus::AwaitingApproval,
            Some(now - chrono::Duration::seconds(30)),
        ),
        (
            SessionStatus::AwaitingApproval,
            Some(now + chrono::Duration::hours(1)),
        ),
        (SessionStatus::AwaitingApproval, None),
        (
            SessionStatus::Waiting,
            Some(now - chrono::Duration::seconds(60)),
        ),
    ];
    let mut ids = Vec::new();
    for (i, (status, deadline)) in cases.iter().enumerate() {
        let id = create(store, &format!("approval {i}")).await;
        let (lease, _, seen) = acquire_seen(store, &id, "w").await;
        let row = store
            .suspend(&lease, *status, seen, *deadline)
            .await
            .unwrap();
        assert_eq!(row.status, *status);
        ids.push(id);
    }
    assert!(store.wake_expired_approvals(0).await.unwrap().is_empty());
    // Earliest deadline first, limited.
    let first = store.wake_expired_approvals(1).await.unwrap();
    let rest = store.wake_expired_approvals(100).await.unwrap();
    two_sweeps(
        store.shards(),
        (first, rest),
        woken(&ids[0]),
        woken(&ids[1]),
    );
    assert!(store.wake_expired_approvals(100).await.unwrap().is_empty());
    for (i, want) in [
        SessionStatus::Queued,
        SessionStatus::Queued,
        SessionStatus::AwaitingApproval,
        SessionStatus::AwaitingApproval,
        SessionStatus::Waiting,
    ]
    .into_iter()
    .enumerate()
    {
        let row = store.get(&ids[i]).await.unwrap().unwrap();
        assert_eq!(row.status, want, "session {i}");
        // Woken ones got a wake bump (a suspension racing the sweeper re-queues).
        assert_eq!(row.wake_seq, i64::from(i < 2), "session {i}");
    }
    let mut unenqueued = store.unenqueued(Duration::ZERO, 100).await.unwrap();
    unenqueued.sort();
    let mut want = [default_queue(&ids[0]), default_queue(&ids[1])].concat();
    want.sort();
    assert_eq!(unenqueued, want);
    // The woken session runs again.
    let _ = acquire(store, &ids[0], "w2", TTL).await;
}

async fn contract_rate_limit_waits(store: &dyn Backend) {
    let now = Utc::now();
    let ago = |s: i64| Some(now - chrono::Duration::seconds(s));
    // (reason, wake time) per session; the ones due wake earliest first.
    let cases = [
        (WaitReason::RateLimit, ago(30)),
        (WaitReason::RateLimit, ago(60)),
        (
            WaitReason::RateLimit,
            Some(now + chrono::Duration::hours(1)),
        ),
        (WaitReason::Budget, None),
        (WaitReason::RateLimit, ago(10)),
    ];
    let mut ids = Vec::new();
    for (i, (reason, wake_at)) in cases.iter().enumerate() {
        let id = create(store, &format!("rate limited {i}")).await;
        let (lease, _, seen) = acquire_seen(store, &id, "w").await;
        let row = store
            .suspend_for(&lease, seen, *reason, *wake_at)
            .await
            .unwrap();
        assert_eq!(row.status, SessionStatus::Waiting);
        assert_eq!(row.wait_reason, Some(*reason));
        assert_eq!(
            row.wake_at.map(|t| t.timestamp_micros()),
            wake_at.map(|t| t.timestamp_micros())
        );
        assert_eq!(row.lease_owner, None, "no lease while it waits");
        // The stored row reads back the same.
        assert_eq!(store.get(&id).await.unwrap().unwrap(), row);
        ids.push(id);
    }
    // A session waiting for its children has no wake time: the sweeper leaves it.
    let children = create(store, "waits for children").await;
    let (lease, _, seen) = acquire_seen(store, &children, "w").await;
    let row = store
        .suspend(&lease, SessionStatus::Waiting, seen, None)
        .await
        .unwrap();
    assert_eq!(row.wait_reason, Some(WaitReason::Children));
    assert_eq!(row.wake_at, None);

    let mut counts = store.waiting_by_reason().await.unwrap();
    counts.sort_by_key(|(r, _)| r.as_str());
    assert_eq!(
        counts,
        vec![
            (WaitReason::Budget, 1),
            (WaitReason::Children, 1),
            (WaitReason::RateLimit, 4),
        ]
    );

    assert!(store.wake_due(0).await.unwrap().is_empty());
    let first = store.wake_due(1).await.unwrap();
    let rest = store.wake_due(100).await.unwrap();
    let want_rest = [woken(&ids[0]), woken(&ids[4])].concat();
    two_sweeps(store.shards(), (first, rest), woken(&ids[1]), want_rest);
    assert!(store.wake_due(100).await.unwrap().is_empty());
    for (i, want) in [
        SessionStatus::Queued,
        SessionStatus::Queued,
        SessionStatus::Waiting,
        SessionStatus::Waiting,
        SessionStatus::Queued,
    ]
    .into_iter()
    .enumerate()
    {
        let row = store.get(&ids[i]).await.unwrap().unwrap();
        assert_eq!(row.status, want, "session {i}");
        if want == SessionStatus::Queued {
            assert_eq!((row.wait_reason, row.wake_at), (None, None), "session {i}");
        }
    }
    // Woken sessions have no queue entry: the sweeper's own pass enqueues them if the
    // caller could not.
    let mut unenqueued = store.unenqueued(Duration::ZERO, 100).await.unwrap();
    unenqueued.sort();
    let mut want = [
        default_queue(&ids[0]),
        default_queue(&ids[1]),
        default_queue(&ids[4]),
    ]
    .concat();
    want.sort();
    assert_eq!(unenqueued, want);

    // A wake that arrives while the run suspends sends it back to the queue, with no
    // wake time left behind; a cancel requested meanwhile cancels it.
    let (lease, _, seen) = acquire_seen(store, &ids[0], "w2").await;
    store
        .deliver(
            &ids[0],
            InboxKind::Message,
            "m-1",
            &steer("hi"),
            &[SessionStatus::Waiting],
        )
        .await
        .unwrap();
    let later = Some(now + chrono::Duration::hours(1));
    let row = store
        .suspend_for(&lease, seen, WaitReason::RateLimit, later)
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!((row.wait_reason, row.wake_at), (None, None));
    let (lease, _, seen) = acquire_seen(store, &ids[1], "w2").await;
    store.request_cancel(&ids[1]).await.unwrap();
    let row = store
        .suspend_for(&lease, seen, WaitReason::RateLimit, ago(5))
        .await
        .unwrap();
    assert_eq!(row.status, SessionStatus::Cancelled);
    assert!(store.wake_due(100).await.unwrap().is_empty());

    // Fenced: a stale lease suspends nothing.
    let seen = wake_seq(store, &ids[4]).await;
    let (stale, _) = acquire(store, &ids[4], "w3", SHORT_TTL).await;
    store.pass(SHORT_TTL * 2).await;
    let _ = acquire(store, &ids[4], "w4", TTL).await;
    assert!(matches!(
        store
            .suspend_for(&stale, seen, WaitReason::RateLimit, ago(5))
            .await,
        Err(Error::LeaseLost(_))
    ));
}

async fn contract_budget_waits(store: &dyn Backend) {
    let mut ids = Vec::new();
    for (i, tenant) in ["acme", "acme", "globex", "acme"].into_iter().enumerate() {
        let (row, _) = store
            .create_session(&new_session(&format!("budget {i}")).with_tenant(tenant))
            .await
            .unwrap();
        let (lease, _, seen) = acquire_seen(store, &row.id, "w").await;
        let reason = if i == 3 {
            WaitReason::RateLimit
        } else {
            WaitReason::Budget
        };
        let wake_at = (i == 3).then(|| Utc::now() + chrono::Duration::hours(1));
        store
            .suspend_for(&lease, seen, reason, wake_at)
            .await
            .unwrap();
        ids.push(row.id);
    }
    assert!(
        store
            .wake_budget_waiters("acme", 0)
            .await
            .unwrap()
            .is_empty()
    );
    let first = store.wake_budget_waiters("acme", 1).await.unwrap();
    let rest = store.wake_budget_waiters("acme", 100).await.unwrap();
    two_sweeps(
        store.shards(),
        (first, rest),
        woken(&ids[0]),
        woken(&ids[1]),
    );
    // Another tenant's parked sessions and the tenant's rate-limited one stay.
    assert!(
        store
            .wake_budget_waiters("acme", 100)
            .await
            .unwrap()
            .is_empty()
    );
    for (i, want) in [
        SessionStatus::Queued,
        SessionStatus::Queued,
        SessionStatus::Waiting,
        SessionStatus::Waiting,
    ]
    .into_iter()
    .enumerate()
    {
        let row = store.get(&ids[i]).await.unwrap().unwrap();
        assert_eq!(row.status, want, "session {i}");
    }
    // Woken ones got a wake bump (a parking run racing the wake re-queues).
    assert_eq!(store.get(&ids[0]).await.unwrap().unwrap().wake_seq, 1);
    assert_eq!(
        store.wake_budget_waiters("globex", 100).await.unwrap(),
        woken(&ids[2])
    );
}

async fn contract_follow_up(store: &dyn Store) {
    // Only a finished session takes a follow-up.
    let queued = create(store, "still queued").await;
    assert!(
        store
            .follow_up(&queued, "more", None)
            .await
            .unwrap()
            .is_none()
    );
    let running = create(store, "running").await;
    let _ = acquire(store, &running, "w", TTL).await;
    assert!(
        store
            .follow_up(&running, "more", None)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .follow_up("missing", "more", None)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(store.messages(&queued).await.unwrap().len(), 1);
    assert_eq!(store.messages(&running).await.unwrap().len(), 1);

    // A follow-up (`enqueue`) arrives while the first turn runs, then a steering message
    // (`inject`) that the run takes into its history before it ends: the message's
    // cursor is past the follow-up, which must still run once the turn is over.
    let id = create(store, "first question").await;
    let (lease, mut first) = acquire(store, &id, "w", TTL).await;
    let f = store
        .deliver(
            &id,
            InboxKind::Followup,
            "f1",
            &steer("second question"),
            &[],
        )
        .await
        .unwrap()
        .unwrap();
    assert!(f.inserted && !f.woken);
    assert_eq!(f.status, SessionStatus::Running);
    let m = store
        .deliver(&id, InboxKind::Message, "m1", &steer("be brief"), &[])
        .await
        .unwrap()
        .unwrap();
    assert!(m.seq > f.seq);
    let persisted = first.messages.len();
    first.messages.push(Message::user("be brief"));
    first.msg_cursor = m.seq;
    first.push_assistant(Message::assistant("first answer"));
    first.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("first answer".into()),
        error: None,
    });
    store.checkpoint(&lease, &first, persisted).await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!((row.iteration, row.followup_cursor), (1, 0));

    let row = store
        .follow_up(&id, "second question", Some(f.seq))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert!(row.finish_reason.is_none() && row.result.is_none() && row.error.is_none());
    assert!(row.finished_at.is_none() && row.lease_owner.is_none());
    assert!(!row.cancel_requested);
    assert_eq!((row.attempts, row.iteration), (0, 1));
    assert_eq!(row.followup_cursor, f.seq);
    assert_eq!(store.get(&id).await.unwrap().unwrap(), row);
    assert!(
        store
            .unenqueued(Duration::ZERO, 100)
            .await
            .unwrap()
            .contains(&(id.clone(), "default".to_string()))
    );
    assert_eq!(
        store.messages(&id).await.unwrap(),
        vec![
            Message::user("first question"),
            Message::user("be brief"),
            first.messages[2].clone(),
            Message::user("second question"),
        ]
    );
    // Not finished any more: another follow-up waits for the end of this turn.
    assert!(store.follow_up(&id, "third", None).await.unwrap().is_none());

    // The new turn resumes with the full history and a fresh allowance.
    let (lease, mut state, _) = acquire_seen(store, &id, "w").await;
    assert_eq!(state.messages.len(), 4);
    assert_eq!(state.messages[3], Message::user("second question"));
    assert_eq!((state.iteration, state.turn_base), (1, 1));
    // The follow-up does not move the steering cursor.
    assert_eq!(state.msg_cursor, m.seq);
    assert!(state.outcome.is_none());
    let persisted = state.messages.len();
    state.push_assistant(Message::assistant("second answer"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("second answer".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, persisted).await.unwrap();
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(row.result.as_deref(), Some("second answer"));
    assert_eq!(row.iteration, 2);

    // The same follow-up again (a redelivered notification): it ran already.
    assert!(
        store
            .follow_up(&id, "second question", Some(f.seq))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(store.messages(&id).await.unwrap().len(), 5);
    let row = store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(row.followup_cursor, f.seq);
    // A later one runs.
    let row = store
        .follow_up(&id, "third question", Some(f.seq + 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert_eq!(row.followup_cursor, f.seq + 1);
    let msgs = store.messages(&id).await.unwrap();
    assert_eq!(msgs.len(), 6);
    assert_eq!(msgs[5], Message::user("third question"));

    // A failed or cancelled session takes one too (without an inbox position).
    let failed = create(store, "will fail").await;
    store.fail(&failed, "boom").await.unwrap();
    let row = store
        .follow_up(&failed, "try again", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert!(row.error.is_none() && row.finish_reason.is_none());
    assert_eq!(
        store.messages(&failed).await.unwrap(),
        vec![Message::user("will fail"), Message::user("try again")]
    );
    // One cancelled before it ever ran: its claim reads the whole history, not the prompt
    // alone.
    let cancelled = create(store, "cancelled").await;
    assert!(matches!(
        store.request_cancel(&cancelled).await.unwrap(),
        CancelResult::CancelledNow(_)
    ));
    let row = store
        .follow_up(&cancelled, "resume", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.status, SessionStatus::Queued);
    assert!(!row.cancel_requested);
    let want = vec![Message::user("cancelled"), Message::user("resume")];
    assert_eq!(store.messages(&cancelled).await.unwrap(), want);
    let (_, state, _) = acquire_seen(store, &cancelled, "w").await;
    assert_eq!(state.messages.last(), Some(&Message::user("resume")));
    assert_eq!(state.messages, want);
}
