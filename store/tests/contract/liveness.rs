//! Liveness in the store: a worker's heartbeat renews one row, which holds the lease of
//! every session it owns; a session is taken over once that row (and the claim's own
//! expiry) is behind, at once after the worker retires; the sessions of a dead worker are
//! handed back to the queue once, to one caller; fencing is untouched.

use std::time::Duration;

use agentq_error::Error;
use agentq_types::model::{CancelResult, Claim, SessionRow, SessionStatus};

use crate::common::{Backend, SHORT_TTL, TTL, acquire, contract_tests, create, finish};

contract_tests!(
    contract_worker_row_holds_its_sessions,
    contract_retired_worker_is_taken_over_at_once,
    contract_dead_workers_sessions_requeued_once,
    contract_finished_sessions_wait_to_be_announced,
);

/// Heartbeats of the worker's row alone keep its sessions, long past their claim's own
/// expiry; once the row expires, another worker takes them, and the old owner's writes
/// and heartbeats find the lease lost.
async fn contract_worker_row_holds_its_sessions(store: &dyn Backend) {
    let a = create(store, "a").await;
    let (lease, _) = acquire(store, &a, "w1", SHORT_TTL).await;
    for _ in 0..4 {
        store.pass(SHORT_TTL / 2).await;
        // A beat with no lease listed still holds every session the worker owns.
        assert!(
            store
                .heartbeat("w1", &[], SHORT_TTL)
                .await
                .unwrap()
                .is_empty()
        );
    }
    assert_eq!(store.claim(&a, "w2", TTL, 10).await.unwrap(), Claim::Busy);
    let owned = store.leases_of("w1").await.unwrap();
    assert_eq!(owned, vec![(lease.clone(), "default".to_string())]);
    assert!(store.leases_of("w2").await.unwrap().is_empty());

    store.pass(SHORT_TTL + Duration::from_millis(100)).await;
    let (taken, _) = acquire(store, &a, "w2", TTL).await;
    assert_eq!(taken.epoch, lease.epoch + 1);
    let hb = store
        .heartbeat("w1", std::slice::from_ref(&lease), SHORT_TTL)
        .await
        .unwrap();
    assert!(!hb[0].held && hb[0].lost, "{hb:?}");
    // Its row is live again, but the session is the new owner's.
    assert!(matches!(
        store.release(&lease).await,
        Err(Error::LeaseLost(_))
    ));
    assert_eq!(store.claim(&a, "w1", TTL, 10).await.unwrap(), Claim::Busy);
    assert!(store.leases_of("w1").await.unwrap().is_empty());
}

/// A worker that retires (a clean stop) gives up its row: whatever it still owns is
/// claimable at once, before the row's or the claim's expiry.
async fn contract_retired_worker_is_taken_over_at_once(store: &dyn Backend) {
    let a = create(store, "a").await;
    let (lease, _) = acquire(store, &a, "w1", Duration::ZERO).await;
    store
        .heartbeat("w1", std::slice::from_ref(&lease), TTL)
        .await
        .unwrap();
    assert_eq!(store.claim(&a, "w2", TTL, 10).await.unwrap(), Claim::Busy);
    store.retire_worker("w1").await.unwrap();
    store.pass(Duration::from_millis(10)).await;
    let (taken, _) = acquire(store, &a, "w2", TTL).await;
    assert!(taken.epoch > lease.epoch);
    // Retiring twice, or a worker never seen, is harmless.
    store.retire_worker("w1").await.unwrap();
    store.retire_worker("never-seen").await.unwrap();
}

/// A dead worker's running sessions of the queues asked for come back until their new
/// entry is recorded, then no more for that death; a live worker's, a finished one and
/// another queue's are left alone. Rows of long-stopped workers owning
/// nothing are forgotten.
async fn contract_dead_workers_sessions_requeued_once(store: &dyn Backend) {
    let dead = create(store, "dead").await;
    let live = create(store, "live").await;
    let done = create(store, "done").await;
    let unmarked = create(store, "never marked").await;
    let queues = vec!["default".to_string()];
    store
        .mark_enqueued(&[dead.clone(), live.clone(), done.clone()])
        .await
        .unwrap();
    let _ = acquire(store, &dead, "w1", SHORT_TTL).await;
    let _ = acquire(store, &unmarked, "w1", SHORT_TTL).await;
    let _ = acquire(store, &live, "w2", SHORT_TTL).await;
    finish(store, &done, "ok").await;
    store.heartbeat("w1", &[], SHORT_TTL).await.unwrap();
    store.heartbeat("w2", &[], TTL).await.unwrap();
    assert!(
        store
            .requeue_orphans(&queues, 100)
            .await
            .unwrap()
            .is_empty()
    );

    store.pass(SHORT_TTL + Duration::from_millis(100)).await;
    store.heartbeat("w2", &[], TTL).await.unwrap();
    assert!(
        store
            .requeue_orphans(&["other".to_string()], 100)
            .await
            .unwrap()
            .is_empty()
    );
    let (first, second) = tokio::join!(
        store.requeue_orphans(&queues, 100),
        store.requeue_orphans(&queues, 100)
    );
    let got: Vec<(String, String)> = first.unwrap().into_iter().chain(second.unwrap()).collect();
    // Both come back, to either caller or both (a duplicate entry is harmless: the claim
    // decides); nothing else does.
    let of = |id: &str| got.iter().filter(|(s, _)| s == id).count();
    assert!((1..=2).contains(&of(&dead)), "{got:?}");
    assert!((1..=2).contains(&of(&unmarked)), "{got:?}");
    assert_eq!(got.len(), of(&dead) + of(&unmarked), "{got:?}");
    assert!(got.iter().all(|(_, q)| q == "default"));
    // Until the caller records a new entry, they keep coming back.
    assert_eq!(store.requeue_orphans(&queues, 100).await.unwrap().len(), 2);
    // The caller added the new entries: not again for this death.
    store
        .mark_enqueued(&[dead.clone(), unmarked.clone()])
        .await
        .unwrap();
    assert!(
        store
            .requeue_orphans(&queues, 100)
            .await
            .unwrap()
            .is_empty()
    );

    // w1 still owns sessions: its row stays (the finisher's, made at its claim and
    // owning nothing now, goes); once they moved on, w1's goes too.
    // Each shard keeps a worker's row where it beat or claimed, and forgets its own: on
    // several shards a worker counts once per shard whose copy went (w1's copy on a
    // shard where it owns nothing goes too).
    let forgot = |n: u64, want: u64| {
        let most = want * store.shards() as u64 + u64::from(store.shards() > 1);
        assert!((want..=most).contains(&n), "{n} forgotten, {want} expected");
    };
    forgot(store.forget_workers(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(store.leases_of("w1").await.unwrap().len(), 2);
    let _ = acquire(store, &dead, "w3", TTL).await;
    let _ = acquire(store, &unmarked, "w3", TTL).await;
    store.pass(Duration::from_millis(10)).await;
    assert_eq!(
        store
            .forget_workers(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    forgot(store.forget_workers(Duration::ZERO).await.unwrap(), 1);
}

/// A finished session waits to be announced (its settle steps marked done) whichever
/// statement finished it: a worker's commit, a cancel of a queued session. Only past the
/// grace, oldest first, at most the limit; a mark (twice is harmless) ends the wait; a
/// session started again by a follow-up no longer waits, and waits again once it
/// finishes again. A session never finished never waits.
async fn contract_finished_sessions_wait_to_be_announced(store: &dyn Backend) {
    let grace = Duration::from_secs(5);
    let ids = |rows: Vec<SessionRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let a = create(store, "a").await;
    let b = create(store, "b").await;
    let _queued = create(store, "c").await;
    finish(store, &a, "done").await;
    store.pass(Duration::from_millis(10)).await;
    assert!(matches!(
        store.request_cancel(&b).await.unwrap(),
        CancelResult::CancelledNow(_)
    ));
    assert!(store.unannounced(grace, 10).await.unwrap().is_empty());
    store.pass(grace + Duration::from_secs(1)).await;
    assert_eq!(
        ids(store.unannounced(grace, 10).await.unwrap()),
        [a.clone(), b.clone()]
    );
    assert_eq!(
        ids(store.unannounced(grace, 1).await.unwrap()),
        std::slice::from_ref(&a)
    );

    store.mark_announced(&a).await.unwrap();
    store.mark_announced(&a).await.unwrap();
    assert_eq!(
        ids(store.unannounced(grace, 10).await.unwrap()),
        std::slice::from_ref(&b)
    );
    store.mark_announced(&b).await.unwrap();
    assert!(store.unannounced(grace, 10).await.unwrap().is_empty());

    // Finished again after a follow-up, it waits again; started again while it waits,
    // it no longer does.
    let reopened = store.follow_up(&a, "more", None).await.unwrap().unwrap();
    assert_eq!(reopened.status, SessionStatus::Queued);
    store.pass(grace + Duration::from_secs(1)).await;
    assert!(store.unannounced(grace, 10).await.unwrap().is_empty());
    finish(store, &a, "again").await;
    store.pass(grace + Duration::from_secs(1)).await;
    assert_eq!(
        ids(store.unannounced(grace, 10).await.unwrap()),
        std::slice::from_ref(&a)
    );
    let reopened = store.follow_up(&a, "more", None).await.unwrap().unwrap();
    assert_eq!(reopened.status, SessionStatus::Queued);
    store.pass(grace + Duration::from_secs(1)).await;
    assert!(store.unannounced(grace, 10).await.unwrap().is_empty());

    // Many marks at once (Postgres takes those that arrive together in one statement):
    // each is answered, and each session's wait ends, no other's.
    let mut many = Vec::new();
    for i in 0..8 {
        let id = create(store, &format!("m{i}")).await;
        finish(store, &id, "done").await;
        many.push(id);
    }
    store.pass(grace + Duration::from_secs(1)).await;
    let marks = many[..6].iter().map(|id| store.mark_announced(id));
    for r in futures::future::join_all(marks).await {
        r.unwrap();
    }
    assert_eq!(ids(store.unannounced(grace, 10).await.unwrap()), many[6..]);
}
