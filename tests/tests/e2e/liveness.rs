//! The store is the truth for liveness: entries are acked when their claim commits, so
//! two long sessions pin nothing in the stream, which a flood of short ones pushes past
//! the cap and the trim cuts back while they run; their worker is SIGKILLed, and a
//! second worker, told by the store alone, finishes both.

use std::sync::Arc;
use std::time::Duration;

use agentq_core::{Queue, SessionStatus, Store};
use agentq_scheduler::QueueRegistry;
use agentq_scheduler::sweeper::{SweepSettings, run_sweeper};
use tokio_util::sync::CancellationToken;

use crate::common::{Cluster, Script, Turn, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(90);
/// `XPENDING <stream> <group>`: count, first and last id, entries per consumer.
type PendingSummary = (
    i64,
    Option<String>,
    Option<String>,
    Option<Vec<(String, String)>>,
);
/// The stream cap of this test: far below the flood, so an `XADD … MAXLEN` would drop the
/// long sessions' entries.
const STREAM_MAX_LEN: u64 = 10;
/// More entries than one node of a Redis stream holds (100 by default): an approximate
/// trim to the cap removes the first node, which holds the long sessions' entries.
const FLOOD: usize = 150;

/// A session whose one answer streams for minutes (until its worker dies) the first time
/// it is asked for, and at once when asked again.
fn long_script() -> Script {
    let mut s = Script::new(vec![Turn::text("The slow answer.")]);
    s.slow_once.insert(0, Duration::from_secs(100));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_session_survives_trimming_and_a_killed_worker() {
    let mut c = Cluster::start().await;
    // The scheduler's sweeper, with short timings and the small cap.
    let store: Arc<dyn Store> = c.open_store(4).await;
    let queue: Arc<dyn Queue> = Arc::new(c.open_queue().await);
    let stop = CancellationToken::new();
    let sweeper = tokio::spawn(run_sweeper(
        store,
        queue,
        QueueRegistry::new(vec!["default".into()]),
        SweepSettings {
            interval: Duration::from_millis(300),
            age: Duration::from_secs(1),
            stream_max_len: STREAM_MAX_LEN,
            event_ttl: Duration::from_secs(3600),
        },
        stop.clone(),
    ));

    let a = c.spawn_ready_worker(&WorkerOpts::default()).await;
    // A quick session first: its answer tells the worker's limiter that the model's key
    // needs no waiting. Else the long sessions' first calls are its probes of the key,
    // which do not end, and every other call would wait 5 s behind them.
    let warm = c.submit(Script::new(vec![Turn::text("ok")])).await;
    c.wait_all_terminal(std::slice::from_ref(&warm.id), T).await;
    let trimmed = c.submit(long_script()).await;
    let lost = c.submit(long_script()).await;
    eventually(
        "both long sessions are streaming their answer",
        T,
        async || c.llm_requests_all(&trimmed) == 1 && c.llm_requests_all(&lost) == 1,
    )
    .await;

    // The flood: many short sessions, each its own stream entry, in batches that the
    // worker takes as they come (so every short entry is delivered and acked).
    for _ in 0..FLOOD / 25 {
        let flood = c
            .submit_many(
                (0..25)
                    .map(|_| Script::new(vec![Turn::text("ok")]))
                    .collect(),
            )
            .await;
        let ids: Vec<String> = flood.iter().map(|s| s.id.clone()).collect();
        for row in c.wait_all_terminal(&ids, T).await {
            assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        }
    }
    // Every entry was acked at its claim, the long sessions' too: nothing is pending
    // while they run, so a trim as the sweeper makes at each tick (it runs meanwhile
    // too) takes the whole history down to the cap, and only the store still says the
    // long sessions run.
    agentq_scheduler::sweeper::trim_queues(
        &c.queue,
        &QueueRegistry::new(vec!["default".into()]),
        STREAM_MAX_LEN,
    )
    .await;
    // Each partition's stream on a cluster, the one stream on one server.
    let streams = c.queue.stream_keys("default");
    let mut conn = c.redis_conn().await;
    for stream in &streams {
        let pending: PendingSummary = redis::cmd("XPENDING")
            .arg(stream)
            .arg(agentq_core::queue::GROUP)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            pending.0, 0,
            "entries pending in {stream} while sessions run: {pending:?}"
        );
    }
    eventually(
        "the streams are trimmed while the long sessions run",
        T,
        async || {
            for stream in &streams {
                if c.stream_entries(stream).await.len() as u64 > STREAM_MAX_LEN {
                    return false;
                }
            }
            true
        },
    )
    .await;
    assert_eq!(c.row(&trimmed.id).await.status, SessionStatus::Running);
    assert_eq!(c.row(&lost.id).await.status, SessionStatus::Running);

    c.kill_worker(a);
    c.spawn_worker(&WorkerOpts::default());
    let rows = c
        .wait_all_terminal(&[trimmed.id.clone(), lost.id.clone()], T)
        .await;
    for row in rows {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert!(row.lease_epoch >= 2, "resumed by a second claim: {row:?}");
    }
    assert_eq!(c.llm_requests_all(&trimmed), 2);
    assert_eq!(c.llm_requests_all(&lost), 2);
    stop.cancel();
    sweeper.await.unwrap();
}

/// A worker SIGKILLed after a session's end is committed and before its completion is
/// published: Redis is paused for writes once the session's call is under way, so the
/// commit goes through (it needs only Postgres) and the publish waits. The end is still
/// unannounced in the store, and the sweeper publishes it, once; nothing runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_between_the_end_commit_and_the_publish() {
    let mut c = Cluster::start().await;
    let a = c.spawn_ready_worker(&WorkerOpts::default()).await;
    // As above: the key is known before the measured session, so its call needs no Redis.
    let warm = c.submit(Script::new(vec![Turn::text("ok")])).await;
    c.wait_all_terminal(std::slice::from_ref(&warm.id), T).await;
    // The session's one call fails until healed: the gate that lets the test pause Redis
    // while the call is under way.
    let mut script = Script::new(vec![Turn::text("The answer.")]);
    script.fail_from_turn = Some(0);
    let sub = c.submit(script).await;
    eventually("the session's call is under way", T, async || {
        c.llm_requests_all(&sub) >= 1
    })
    .await;
    c.pause_writes(Some(600_000)).await;
    c.heal(&sub.token);
    eventually("the session's end is committed", T, async || {
        c.row(&sub.id).await.status == SessionStatus::Completed
    })
    .await;
    c.kill_worker(a);
    c.pause_writes(None).await;
    assert_eq!(
        c.completion_entries().await.get(&sub.id),
        None,
        "published before the kill"
    );

    let store = c.open_store(2).await;
    let queue = c.open_queue().await;
    let announced = agentq_scheduler::sweeper::settle_unannounced(
        &*store,
        &queue,
        Duration::ZERO,
        Duration::from_secs(3600),
    )
    .await;
    assert_eq!(announced, 1, "the sweeper found the end unannounced");
    // Announced once, and not again by a later sweep.
    assert_eq!(
        agentq_scheduler::sweeper::settle_unannounced(
            &*store,
            &queue,
            Duration::ZERO,
            Duration::from_secs(3600)
        )
        .await,
        0
    );
    assert_eq!(c.completion_entries().await.get(&sub.id), Some(&1));
    let row = c.row(&sub.id).await;
    assert_eq!(row.status, SessionStatus::Completed);
    assert_eq!(row.lease_epoch, 1, "never claimed again: {row:?}");
    let answered = c.llm_requests_all(&sub);
    // A second worker finds nothing of it to run.
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    let after = c.submit(Script::new(vec![Turn::text("ok")])).await;
    c.wait_all_terminal(std::slice::from_ref(&after.id), T)
        .await;
    assert_eq!(c.llm_requests_all(&sub), answered);
    assert_eq!(c.lease_holder(&sub.id).await, None);
}
