//! Rate limits, against a fake endpoint that enforces them per key over a sliding window
//! as real providers do (429 with `retry-after`, true `x-ratelimit-*` headers): with
//! nothing configured, a batch on three workers finishes without a failed session and
//! with few refused requests; and sessions held long by a rate limit give their slot up
//! (`waiting`, reason `rate_limit`) so that a session on an unlimited model still runs on
//! a worker with one slot.

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::spec::SessionSpec;
use agentq_core::{EventStreams, Queue, SessionStatus, Store, WaitReason};
use agentq_scheduler::QueueRegistry;
use agentq_scheduler::sweeper::{SweepSettings, run_sweeper};
use agentq_testkit::rate_limited::list_dir_turns;
use agentq_testkit::{Limits, RateLimitedConfig, RateLimitedLlm};
use tokio_util::sync::CancellationToken;

use crate::common::{Cluster, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(300);

/// The scheduler's sweeper beside the workers, ticking fast: it wakes sessions whose
/// rate-limit wait is over.
async fn sweeper(c: &Cluster) -> CancellationToken {
    let store: Arc<dyn Store> = c.open_store(4).await;
    let queue: Arc<dyn Queue> = Arc::new(c.open_queue().await);
    let stop = CancellationToken::new();
    tokio::spawn(run_sweeper(
        store,
        queue,
        QueueRegistry::new(vec!["default".into()]),
        SweepSettings {
            interval: Duration::from_millis(200),
            age: Duration::from_secs(1),
            stream_max_len: 10_000,
            event_ttl: Duration::from_secs(3600),
        },
        stop.clone(),
    ));
    stop
}

fn spec(i: usize, model: &str) -> SessionSpec {
    let mut spec = SessionSpec::new(format!("Session {i}: look around, then report."));
    spec.model = Some(model.into());
    spec.tools = Some(vec!["list_dir".into()]);
    spec
}

fn opts(llm: &RateLimitedLlm, concurrency: u32) -> WorkerOpts {
    WorkerOpts {
        concurrency,
        llm_url: Some(llm.url.clone()),
        ..WorkerOpts::default()
    }
}

/// Nothing configured: the limiter learns the key's limits from the answers' headers and
/// its 429s, and every worker holds the key until the window frees up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limited_batch_on_three_workers_finishes_without_errors() {
    let window = Duration::from_secs(10);
    let llm = RateLimitedLlm::start(
        RateLimitedConfig::new(window, Limits::requests(40), list_dir_turns(3))
            .latency(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let mut c = Cluster::start().await;
    let stop = sweeper(&c).await;
    for _ in 0..3 {
        c.spawn_ready_worker(&opts(&llm, 64)).await;
    }
    let ids = c
        .submit_specs((0..60).map(|i| spec(i, "gpt-test")).collect())
        .await;
    let rows = c.wait_all_terminal(&ids, T).await;
    stop.cancel();
    let failed: Vec<_> = rows
        .iter()
        .filter(|r| r.status != SessionStatus::Completed)
        .map(|r| (r.id.as_str(), r.status, r.error.as_deref()))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 60 sessions did not complete: {failed:?}",
        failed.len()
    );
    for r in &rows {
        assert_eq!(r.iteration, 3, "three turns each: {r:?}");
    }
    let stats = llm.stats();
    assert_eq!(stats.accepted, 180, "each turn answered once: {stats:?}");
    assert!(stats.max_requests_in_window <= 40, "{stats:?}");
    assert!(
        stats.refused_share() <= 0.10,
        "refused {} of {} requests ({:.1}%); per window: {:?}",
        stats.refused,
        stats.accepted + stats.refused,
        stats.refused_share() * 100.0,
        llm.per_window()
    );
}

/// One slot: sessions on a model whose key is held for long give the slot up instead of
/// sleeping in it, and a session on another, unlimited model runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unlimited_model_runs_while_rate_limited_sessions_wait() {
    // Long enough that a wait for it gives the slot up (past 2 s, below) and that the
    // unlimited session ends well before it frees up.
    let window = Duration::from_secs(10);
    let llm = RateLimitedLlm::start(
        RateLimitedConfig::new(window, Limits::requests(3), list_dir_turns(2))
            .model("gpt-free", Limits::unlimited()),
    )
    .await
    .unwrap();
    let mut c = Cluster::start().await;
    let stop = sweeper(&c).await;
    // A wait longer than 2 s gives the slot up (the window frees up only after 10 s).
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[worker]\nrate_limit_suspend_secs = 2\n").unwrap();
    let mut one_slot = opts(&llm, 1);
    one_slot
        .env
        .push(("AGENTQ_CONFIG".into(), config.path().display().to_string()));
    c.spawn_ready_worker(&one_slot).await;
    let limited = c
        .submit_specs((0..3).map(|i| spec(i, "gpt-limited")).collect())
        .await;
    // The key is used up within its window: the others suspend for the rate limit.
    let mut waiting = None;
    eventually(
        "a limited session waits for the rate limit",
        Duration::from_secs(120),
        async || {
            for id in &limited {
                let row = c.row(id).await;
                if row.status == SessionStatus::Waiting
                    && row.wait_reason == Some(WaitReason::RateLimit)
                {
                    assert!(row.lease_owner.is_none(), "no lease while waiting: {row:?}");
                    assert!(row.wake_at.is_some(), "a wake time: {row:?}");
                    waiting = Some(row.id);
                    return true;
                }
            }
            false
        },
    )
    .await;
    let free = c.submit_specs(vec![spec(99, "gpt-free")]).await;
    let done = c.wait_all_terminal(&free, T).await;
    assert_eq!(done[0].status, SessionStatus::Completed, "{:?}", done[0]);
    // It finished while the limited ones still waited: they held no slot.
    let mut still = 0;
    for id in &limited {
        if !c.row(id).await.status.is_terminal() {
            still += 1;
        }
    }
    assert!(still > 0, "the unlimited session ran only after the others");

    // The wait shows on the session's event stream.
    let waiting = waiting.unwrap();
    // Read as the API reads it, from the stream the queue keeps it in on either layout.
    let events = c
        .queue
        .read_events(&waiting, "0", 10_000, None)
        .await
        .unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.data.contains("\"session_waiting\"")),
        "no session_waiting event: {events:?}"
    );

    // The sweeper wakes them when their window frees up; none fails for the limit.
    let rows = c.wait_all_terminal(&limited, T).await;
    stop.cancel();
    for r in &rows {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
        assert_eq!((r.wait_reason, r.wake_at), (None, None), "{r:?}");
    }
    let stats = llm.model_stats("gpt-limited");
    assert_eq!(stats.accepted, 6, "{stats:?}");
    assert!(stats.max_requests_in_window <= 3, "{stats:?}");
}
