//! Configured rate limits (`[[limits]]`) across worker processes, against the fake
//! endpoint that enforces its own limit per key over a sliding window: the fleet keeps
//! under it (no refusal) while using nearly all of it, and a worker SIGKILLed in the
//! middle of a call leaks no concurrency slot.

use std::time::Duration;

use agentq_agent::spec::SessionSpec;
use agentq_core::SessionStatus;
use agentq_core::admission::read_state;
use agentq_testkit::rate_limited::list_dir_turns;
use agentq_testkit::{Limits, RateLimitedConfig, RateLimitedLlm};

use crate::common::{Cluster, TestConn, WorkerOpts, eventually};

const T: Duration = Duration::from_secs(300);

fn spec(i: usize) -> SessionSpec {
    let mut spec = SessionSpec::new(format!("Session {i}: look around, then report."));
    spec.model = Some("gpt-test".into());
    spec.tools = Some(vec!["list_dir".into()]);
    spec
}

/// A config file with `body`, and the worker options that use it.
fn opts_with(llm: &RateLimitedLlm, body: &str) -> (tempfile::NamedTempFile, WorkerOpts) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), body).unwrap();
    let opts = WorkerOpts {
        concurrency: 32,
        llm_url: Some(llm.url.clone()),
        env: vec![(
            "AGENTQ_CONFIG".into(),
            file.path().to_string_lossy().into_owned(),
        )],
        ..WorkerOpts::default()
    };
    (file, opts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_configured_limit_keeps_three_workers_under_the_providers() {
    // The endpoint takes 10 requests per 2 s per key; the fleet is told 8 (240 a minute
    // over a 2 s window). The endpoint counts a request when it arrives, the limiter at
    // the start it books: a call that would go later than its booking allows (its worker
    // starved of CPU, as on a loaded CI box) gives the booking back and asks again, so
    // calls booked a window apart do not arrive in one.
    let window = Duration::from_secs(2);
    let llm = RateLimitedLlm::start(
        RateLimitedConfig::new(window, Limits::requests(10), list_dir_turns(2))
            .latency(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let mut c = Cluster::start().await;
    let (_file, opts) = opts_with(
        &llm,
        "[[limits]]\nprovider = \"openai\"\nmodel = \"gpt-*\"\nrpm = 240\nwindow_secs = 2\n",
    );
    for _ in 0..3 {
        c.spawn_ready_worker(&opts).await;
    }
    let ids = c.submit_specs((0..30).map(spec).collect()).await;
    let rows = c.wait_all_terminal(&ids, T).await;
    let failed: Vec<_> = rows
        .iter()
        .filter(|r| r.status != SessionStatus::Completed)
        .map(|r| (r.id.as_str(), r.status, r.error.as_deref()))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let stats = llm.stats();
    assert_eq!(stats.accepted, 60, "each turn answered once: {stats:?}");
    assert_eq!(
        stats.refused, 0,
        "the fleet kept under the limit: {stats:?}"
    );
    assert!(stats.max_requests_in_window <= 10, "{stats:?}");
    // Near the limit: some window carried the whole allowance the fleet was given.
    assert!(stats.max_requests_in_window >= 8, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_call_leaks_no_reservation() {
    // Slow answers, so that a call is in flight when its worker dies.
    let llm = RateLimitedLlm::start(
        RateLimitedConfig::new(
            Duration::from_secs(60),
            Limits::unlimited(),
            list_dir_turns(1),
        )
        .latency(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let mut c = Cluster::start().await;
    let (_file, opts) = opts_with(
        &llm,
        "[[limits]]\nprovider = \"openai\"\nconcurrency = 1\nreservation_ttl_secs = 3\n",
    );
    let first = c.spawn_ready_worker(&opts).await;
    let ids = c.submit_specs(vec![spec(0)]).await;
    let conn = c.redis_conn().await;
    let in_flight = async |conn: &TestConn| {
        let mut conn = conn.clone();
        read_state(&mut conn)
            .await
            .ok()
            .and_then(|s| s.rules.first().map(|r| r.in_flight))
    };
    eventually("the call to reach the endpoint", T, async || {
        in_flight(&conn).await == Some(1) && !llm.served().is_empty()
    })
    .await;
    c.kill_worker(first);
    // The dead worker's slot comes back once its reservation's life is over.
    eventually("the dead worker's slot to expire", T, async || {
        in_flight(&conn).await == Some(0)
    })
    .await;
    // Another worker takes the session over, and a second session gets through the
    // one slot too.
    c.spawn_ready_worker(&opts).await;
    let more = c.submit_specs(vec![spec(1)]).await;
    let all: Vec<String> = ids.into_iter().chain(more).collect();
    let rows = c.wait_all_terminal(&all, T).await;
    assert!(
        rows.iter().all(|r| r.status == SessionStatus::Completed),
        "{rows:?}"
    );
    eventually("every slot to be given back", T, async || {
        in_flight(&conn).await == Some(0)
    })
    .await;
    // The killed call was asked again; the other session's once.
    assert_eq!(llm.stats().accepted, 3, "{:?}", llm.stats());
}
