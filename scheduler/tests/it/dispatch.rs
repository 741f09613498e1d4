//! The dispatcher in the embedded mode (`agentq dev`: the SQLite store and the in-process
//! queue, as `agentq_scheduler::run` serves it): held sessions enter the buffer by fair
//! share across tenants, the buffer's depth and a tenant's cap hold, and the submit path
//! holds new sessions once sessions wait.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::time::Duration;

use agentq_agent::spec::SessionSpec;
use agentq_core::config::{SchedulingSection, TenantScheduling};
use agentq_core::mem_queue::MemQueue;
use agentq_core::scheduling::Placement;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{Claim, LeaseStore, NewSession, SessionStore, SweepStore, WorkQueue};

use agentq_scheduler::QueueRegistry;
use agentq_scheduler::dispatch::{Dispatch, dispatch_once};

use common::wait_until;

fn held(tenant: &str, n: usize) -> Vec<NewSession> {
    (0..n)
        .map(|i| {
            let mut s = NewSession::root(SessionSpec::new(format!("{tenant} {i}")), "default")
                .with_tenant(tenant);
            s.sched = Placement {
                held: true,
                ..Placement::default()
            };
            s
        })
        .collect()
}

/// The tenants of the entries the queue delivers now, and their sessions.
async fn read_tenants(
    store: &SqliteStore,
    queue: &MemQueue,
    n: usize,
) -> (Vec<String>, Vec<String>) {
    let got = queue
        .read(&["default".into()], "w", n, Duration::from_millis(10))
        .await
        .unwrap();
    let mut tenants = Vec::new();
    let mut ids = Vec::new();
    for d in got {
        tenants.push(store.get(&d.session_id).await.unwrap().unwrap().tenant);
        ids.push(d.session_id);
    }
    (tenants, ids)
}

/// The embedded store and queue with a running dispatcher: a delivery buffer of `buffer`
/// sessions, and the tenant `capped` at `cap` running.
async fn embedded(
    buffer: u32,
    cap: u32,
) -> (
    tempfile::TempDir,
    SqliteStore,
    MemQueue,
    QueueRegistry,
    Dispatch,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let queue = MemQueue::new();
    queue.ensure_queue("default").await.unwrap();
    let registry = QueueRegistry::new(vec!["default".into()]);
    let mut settings = SchedulingSection {
        buffer,
        ..SchedulingSection::default()
    };
    settings.tenants.insert(
        "capped".into(),
        TenantScheduling {
            weight: 1,
            max_running: Some(cap),
        },
    );
    let dispatch = Dispatch::new(settings);
    dispatch.mark_running();
    (dir, store, queue, registry, dispatch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_dispatch_is_fair_bounded_and_capped() {
    let (_dir, store, queue, registry, dispatch) = embedded(4, 1).await;

    store.create_sessions(&held("flood", 100)).await.unwrap();
    store.create_sessions(&held("few", 3)).await.unwrap();
    store.create_sessions(&held("capped", 5)).await.unwrap();

    // The store counts what it holds (the scheduler's /metrics reads this).
    assert_eq!(
        store.held_by_queue().await.unwrap(),
        vec![("default".to_string(), 108)]
    );

    // The buffer fills to its depth, the three tenants taking turns; the capped one once.
    assert_eq!(
        dispatch_once(&store, &queue, &registry, &dispatch)
            .await
            .unwrap(),
        4
    );
    let (first, delivered) = read_tenants(&store, &queue, 10).await;
    assert_eq!(first.len(), 4, "{first:?}");
    assert_eq!(
        store.held_by_queue().await.unwrap(),
        vec![("default".to_string(), 104)]
    );
    assert_eq!(
        first.iter().filter(|t| *t == "capped").count(),
        1,
        "{first:?}"
    );
    assert!(
        first.iter().filter(|t| *t == "few").count() >= 1,
        "{first:?}"
    );
    // Nothing claimed them: the buffer is full, nothing more goes in, and a new session
    // waits behind the held ones.
    assert_eq!(
        dispatch_once(&store, &queue, &registry, &dispatch)
            .await
            .unwrap(),
        0
    );
    assert!(dispatch.hold("default", "few", 1, None));

    // The workers take them; the buffer refills, the capped tenant still at its one.
    for id in &delivered {
        assert!(matches!(
            store
                .claim(id, "w", Duration::from_secs(30), 5)
                .await
                .unwrap(),
            Claim::Acquired { .. }
        ));
    }
    let second_n = dispatch_once(&store, &queue, &registry, &dispatch)
        .await
        .unwrap();
    let (second, _) = read_tenants(&store, &queue, 10).await;
    assert_eq!(second.len(), second_n);
    assert!(second_n >= 2, "{second:?}");
    assert!(!second.iter().any(|t| t == "capped"), "the cap: {second:?}");
    let few_so_far = first.iter().chain(&second).filter(|t| *t == "few").count();
    assert!(few_so_far >= 2, "{first:?} {second:?}");
}

/// A tenant's cap holds for sessions coming back from a wait, not only for new ones: a
/// cap's worth suspends for a rate limit, as many more run meanwhile, and when the waits
/// end the first ones come back held and enter only as the cap allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cap_holds_for_sessions_back_from_a_wait() {
    use agentq_agent::schema::Message;
    use agentq_agent::spec::ExitReason;
    use agentq_agent::state::Outcome;
    use agentq_core::WaitReason;

    let (_dir, store, queue, registry, dispatch) = embedded(10, 2).await;
    assert!(dispatch.capped("capped", None));
    assert!(!dispatch.capped("other", None));
    let mut new = held("capped", 4);
    for n in &mut new {
        n.sched.capped = true;
    }
    store.create_sessions(&new).await.unwrap();
    let claim = async |id: &str| match store
        .claim(id, "w", Duration::from_secs(30), 5)
        .await
        .unwrap()
    {
        Claim::Acquired { lease, state, row } => (lease, *state, row.wake_seq),
        other => panic!("{other:?}"),
    };

    // Two enter, and suspend for a rate limit.
    assert_eq!(
        dispatch_once(&store, &queue, &registry, &dispatch)
            .await
            .unwrap(),
        2
    );
    let (_, first) = read_tenants(&store, &queue, 10).await;
    let wake_at = chrono::Utc::now() + chrono::Duration::milliseconds(50);
    for id in &first {
        let (lease, _, seen) = claim(id).await;
        store
            .suspend_for(&lease, seen, WaitReason::RateLimit, Some(wake_at))
            .await
            .unwrap();
    }
    // Waiting sessions do not count: the other two enter and run.
    assert_eq!(
        dispatch_once(&store, &queue, &registry, &dispatch)
            .await
            .unwrap(),
        2
    );
    let (_, second) = read_tenants(&store, &queue, 10).await;
    let mut running = Vec::new();
    for id in &second {
        running.push(claim(id).await);
    }

    // The waits end (together: one wake time): both come back held, nothing for the
    // sweeper to enqueue, and the dispatcher lets none in while two run.
    let woken = wait_until("the waits to end", Duration::from_secs(10), || async {
        let woken = store.wake_due(100).await.unwrap();
        (!woken.is_empty()).then_some(woken)
    })
    .await;
    assert_eq!(woken.len(), 2);
    assert!(woken.iter().all(|w| w.held), "{woken:?}");
    assert_eq!(
        dispatch_once(&store, &queue, &registry, &dispatch)
            .await
            .unwrap(),
        0
    );
    assert!(read_tenants(&store, &queue, 10).await.1.is_empty());

    // One of the running ones finishes: one comes back in.
    let (lease, mut state, _) = running.pop().unwrap();
    let from = state.messages.len();
    state.push_assistant(Message::assistant("done"));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("done".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, from).await.unwrap();
    assert_eq!(
        dispatch_once(&store, &queue, &registry, &dispatch)
            .await
            .unwrap(),
        1
    );
    let (_, third) = read_tenants(&store, &queue, 10).await;
    assert_eq!(third.len(), 1);
    assert!(first.contains(&third[0]), "{third:?} {first:?}");
}
