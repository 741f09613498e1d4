//! What the sweeper and the dispatcher ask: queue entries to add, reset and forget, and
//! held (and capped) sessions.

use std::time::Duration;

use agentq_agent::schema::Message;
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Outcome;
use agentq_store::RetryResult;
use agentq_store::store::Store;
use agentq_types::model::{ApprovalRecorded, SessionStatus, Woken};
use agentq_types::protocol::InboxKind;
use agentq_types::scheduling::Placement;
use agentq_types::wait::WaitReason;

use crate::common::{
    Backend, SHORT_TTL, TTL, acquire, acquire_seen, contract_tests, create, default_queue, finish,
    new_session, steer, suspended, unenqueued_now,
};

contract_tests!(
    contract_unenqueued,
    contract_reset_enqueued,
    contract_forget_expired_entries,
    contract_held_sessions,
    contract_capped_sessions_are_held_whenever_woken,
);

async fn contract_unenqueued(store: &dyn Backend) {
    let ids = [
        create(store, "1").await,
        create(store, "2").await,
        create(store, "3").await,
    ];
    store.pass(Duration::from_millis(20)).await;
    let mut found = unenqueued_now(store).await;
    found.sort();
    let mut want: Vec<(String, String)> = ids
        .iter()
        .map(|i| (i.clone(), "default".to_string()))
        .collect();
    want.sort();
    assert_eq!(found, want);
    assert!(
        store
            .unenqueued(Duration::from_secs(3600), 100)
            .await
            .unwrap()
            .is_empty()
    );
    // Oldest first, limited.
    assert_eq!(
        store.unenqueued(Duration::ZERO, 2).await.unwrap(),
        want[..2].to_vec()
    );

    store.mark_enqueued(&ids[..2]).await.unwrap();
    store.mark_enqueued(&ids[..1]).await.unwrap();
    store.mark_enqueued(&[]).await.unwrap();
    store.mark_enqueued(&["missing".to_string()]).await.unwrap();
    let found = unenqueued_now(store).await;
    assert_eq!(found, vec![(ids[2].clone(), "default".to_string())]);

    // A running row without an entry (its queue lost its data) is the sweeper's too;
    // once marked it is left alone.
    let _ = acquire(store, &ids[2], "w", TTL).await;
    assert_eq!(
        unenqueued_now(store).await,
        vec![(ids[2].clone(), "default".to_string())]
    );
    store.mark_enqueued(&ids[2..]).await.unwrap();
    assert!(unenqueued_now(store).await.is_empty());
}

/// After the queue lost its data, every queued or running session of that queue is the
/// sweeper's again; other queues and finished sessions are left alone.
async fn contract_reset_enqueued(store: &dyn Backend) {
    let queued = create(store, "queued").await;
    let running = create(store, "running").await;
    let finished = create(store, "finished").await;
    let mut other = new_session("elsewhere");
    other.queue = "other".to_string();
    let (other, _) = store.create_session(&other).await.unwrap();
    let all = [
        queued.clone(),
        running.clone(),
        finished.clone(),
        other.id.clone(),
    ];
    store.mark_enqueued(&all).await.unwrap();
    let _ = acquire(store, &running, "w", TTL).await;
    finish(store, &finished, "done").await;
    store.pass(Duration::from_millis(20)).await;
    assert!(unenqueued_now(store).await.is_empty());

    assert_eq!(store.reset_enqueued("default").await.unwrap(), 2);
    let mut found = unenqueued_now(store).await;
    found.sort();
    let mut want = vec![
        (queued.clone(), "default".to_string()),
        (running.clone(), "default".to_string()),
    ];
    want.sort();
    assert_eq!(found, want);
    // Nothing left to reset; a queue without sessions has none.
    assert_eq!(store.reset_enqueued("default").await.unwrap(), 0);
    assert_eq!(store.reset_enqueued("nothing-here").await.unwrap(), 0);
    store.mark_enqueued(&[queued, running]).await.unwrap();
    assert!(unenqueued_now(store).await.is_empty());
}

/// The lease is the truth for liveness: a running session whose lease ran out (past the
/// grace) is the sweeper's again whatever became of its entry, once per expiry; a live
/// lease, a queued or a finished session is left alone.
async fn contract_forget_expired_entries(store: &dyn Backend) {
    let dead = create(store, "dead worker").await;
    let live = create(store, "live worker").await;
    let queued = create(store, "queued").await;
    let finished = create(store, "finished").await;
    let all = [dead.clone(), live.clone(), queued.clone(), finished.clone()];
    store.mark_enqueued(&all).await.unwrap();
    finish(store, &finished, "done").await;
    let _ = acquire(store, &dead, "w1", SHORT_TTL).await;
    let _ = acquire(store, &live, "w2", TTL).await;

    // Expired, but not past the grace: nothing.
    store.pass(SHORT_TTL + Duration::from_millis(100)).await;
    assert_eq!(
        store
            .forget_expired_entries(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    assert!(unenqueued_now(store).await.is_empty());

    // Expired: only the dead worker's session, which the sweep then re-adds.
    assert_eq!(
        store
            .forget_expired_entries(Duration::ZERO, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        unenqueued_now(store).await,
        vec![(dead.clone(), "default".to_string())]
    );
    store
        .mark_enqueued(std::slice::from_ref(&dead))
        .await
        .unwrap();
    // Re-added after the expiry: left alone until a newer lease expires.
    assert_eq!(
        store
            .forget_expired_entries(Duration::ZERO, 100)
            .await
            .unwrap(),
        0
    );
    let _ = acquire(store, &dead, "w3", SHORT_TTL).await;
    store.pass(SHORT_TTL + Duration::from_millis(100)).await;
    assert_eq!(
        store
            .forget_expired_entries(Duration::ZERO, 100)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        unenqueued_now(store).await,
        vec![(dead.clone(), "default".to_string())]
    );
}

async fn contract_held_sessions(store: &dyn Store) {
    let placed = |tenant: &str, batch: Option<&str>, priority: u8, held: bool| {
        let mut n = new_session("work").with_tenant(tenant);
        n.sched = Placement {
            priority,
            batch_id: batch.map(Into::into),
            batch_max_running: batch.map(|_| 2),
            held,
            capped: false,
        };
        n
    };
    assert!(!store.any_held(None).await.unwrap(), "nothing is held yet");
    let mut new = Vec::new();
    for i in 0..5u8 {
        new.push(placed("a", Some("b1"), i, true));
    }
    new.push(placed("b", None, 5, true));
    new.push(placed("b", None, 9, true));
    new.push(placed("c", None, 5, false));
    let rows = store.create_sessions(&new).await.unwrap();
    assert_eq!(rows[6].0.priority, 9);
    assert_eq!(rows[0].0.batch_id.as_deref(), Some("b1"));
    let ids: Vec<String> = rows.iter().map(|(r, _)| r.id.clone()).collect();

    // Held ones are the dispatcher's: the sweeper leaves them alone.
    assert_eq!(unenqueued_now(store).await, default_queue(&ids[7]));
    // Each group's best first, at most `per_group` of each.
    let held = store.held("default", 2, 100).await.unwrap();
    let got: Vec<(&str, u8, u32)> = held
        .iter()
        .map(|c| (c.tenant.as_str(), c.priority, c.rank))
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(
        got.contains(&("a", 4, 1)) && got.contains(&("a", 3, 2)),
        "{got:?}"
    );
    assert!(
        got.contains(&("b", 9, 1)) && got.contains(&("b", 5, 2)),
        "{got:?}"
    );
    assert!(
        held.iter()
            .filter(|c| c.tenant == "a")
            .all(|c| c.batch_max_running == Some(2))
    );
    assert_eq!(store.held("default", 10, 3).await.unwrap().len(), 3);
    assert!(store.held("other", 10, 10).await.unwrap().is_empty());
    assert!(store.any_held(Some("default")).await.unwrap());
    assert!(!store.any_held(Some("other")).await.unwrap());
    assert!(store.any_held(None).await.unwrap());

    // Load: only what is running or buffered (queued, not held).
    let load = store.dispatch_load().await.unwrap();
    assert_eq!(load.len(), 1, "{load:?}");
    assert_eq!(
        (load[0].tenant.as_str(), load[0].running, load[0].buffered),
        ("c", 0, 1)
    );

    // Release: once, only still-held rows; a second caller gets nothing.
    let released = store.release_held(&ids[5..7]).await.unwrap();
    assert_eq!(released.len(), 2);
    assert!(store.release_held(&ids[5..7]).await.unwrap().is_empty());
    assert!(
        store.release_held(&ids[7..8]).await.unwrap().is_empty(),
        "never held"
    );
    assert!(store.release_held(&[]).await.unwrap().is_empty());
    let (_lease, _) = acquire(store, &ids[5], "w", TTL).await;
    let mut load = store.dispatch_load().await.unwrap();
    load.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    assert_eq!(load.len(), 2, "{load:?}");
    assert_eq!(
        (load[0].tenant.as_str(), load[0].running, load[0].buffered),
        ("b", 1, 1)
    );
    // A cancelled held session is no longer a candidate.
    store.request_cancel(&ids[0]).await.unwrap();
    let held = store.held("default", 10, 100).await.unwrap();
    assert_eq!(held.len(), 4);
    assert!(held.iter().all(|c| c.id != ids[0]));
}

/// A capped session (its tenant or batch has a cap on running sessions) goes back to the
/// queue held for the dispatcher whatever wakes it: a child's result, the end of a
/// rate-limit wait, a decision, a follow-up, a retry. Nothing is left for the waker to
/// enqueue, and the sweeper leaves it alone. An uncapped one is woken as before.
async fn contract_capped_sessions_are_held_whenever_woken(store: &dyn Backend) {
    let mut n = new_session("capped").with_tenant("acme");
    n.sched = Placement {
        held: false,
        capped: true,
        ..Placement::default()
    };
    let (row, _) = store.create_session(&n).await.unwrap();
    let id = row.id.clone();
    assert!(row.capped && !row.held);
    let (plain, _) = store
        .create_session(&new_session("plain").with_tenant("acme"))
        .await
        .unwrap();
    let is_held = async |id: &str| {
        let r = store.get(id).await.unwrap().unwrap();
        assert_eq!(r.status, SessionStatus::Queued);
        assert!(
            unenqueued_now(store).await.iter().all(|(u, _)| u != id),
            "the sweeper must leave a held session to the dispatcher"
        );
        r.held
    };
    let release = async |id: &str| {
        store.release_held(&[id.to_string()]).await.unwrap();
        store.mark_enqueued(&[id.to_string()]).await.unwrap();
    };

    // Waiting for a child, woken by its result.
    for sid in [&id, &plain.id] {
        suspended(store, sid, "w", SessionStatus::Waiting).await;
    }
    let payload = steer("news");
    let d = store
        .deliver(
            &id,
            InboxKind::Message,
            "d1",
            &payload,
            &[SessionStatus::Waiting],
        )
        .await
        .unwrap()
        .unwrap();
    assert!(d.held && !d.woken, "{d:?}");
    assert!(is_held(&id).await);
    let d = store
        .deliver(
            &plain.id,
            InboxKind::Message,
            "d1",
            &payload,
            &[SessionStatus::Waiting],
        )
        .await
        .unwrap()
        .unwrap();
    assert!(d.woken && !d.held, "{d:?}");
    assert!(!store.get(&plain.id).await.unwrap().unwrap().held);
    release(&id).await;

    // A rate-limit wait that ends.
    let (lease, _, seen) = acquire_seen(store, &id, "w").await;
    store
        .suspend_for(
            &lease,
            seen,
            WaitReason::RateLimit,
            Some(chrono::Utc::now()),
        )
        .await
        .unwrap();
    store.pass(Duration::from_millis(5)).await;
    assert_eq!(
        store.wake_due(100).await.unwrap(),
        vec![Woken {
            id: id.clone(),
            queue: "default".into(),
            held: true
        }]
    );
    assert!(is_held(&id).await);
    release(&id).await;

    // A decision on a held call.
    suspended(store, &id, "w", SessionStatus::AwaitingApproval).await;
    assert_eq!(
        store
            .decide_approval(&id, "call_1", true, None, None)
            .await
            .unwrap(),
        ApprovalRecorded::Recorded {
            woken: false,
            held: true,
            queue: "default".into()
        }
    );
    assert!(is_held(&id).await);
    release(&id).await;

    // A follow-up on the finished session.
    finish(store, &id, "done").await;
    let reopened = store.follow_up(&id, "more", None).await.unwrap().unwrap();
    assert!(reopened.held && reopened.capped);
    assert!(is_held(&id).await);
    release(&id).await;

    // A retry after a failure, even when the caller would not hold it.
    let (lease, mut state) = acquire(store, &id, "w", TTL).await;
    let from = state.messages.len();
    state.push_assistant(Message::assistant("boom"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Error,
        result: None,
        error: Some("failed".into()),
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
    match store.retry(&id, false).await.unwrap() {
        RetryResult::Retried(r) => assert!(r.held),
        other => panic!("{other:?}"),
    }
    assert!(is_held(&id).await);
}
