//! SIGTERM: the worker lets running turns reach their checkpoint, hands the sessions back
//! and exits; another worker resumes them at once.

use std::time::{Duration, Instant};

use agentq_core::SessionStatus;

use crate::common::{Cluster, Script, WorkerOpts, eventually};

const SESSIONS: usize = 4;
const DRAIN_SECS: f64 = 20.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_sessions_to_another_worker() {
    let mut c = Cluster::start().await;
    let a = c
        .spawn_ready_worker(&WorkerOpts {
            drain_timeout_secs: DRAIN_SECS,
            ..WorkerOpts::default()
        })
        .await;

    let reference = c.submit(Script::three_turns()).await;
    c.wait_all_terminal(std::slice::from_ref(&reference.id), Duration::from_secs(60))
        .await;
    let expected = c.transcript(&reference).await;
    assert_eq!(expected.len(), 7);

    let scripts = (0..SESSIONS)
        .map(|_| {
            let mut s = Script::three_turns();
            // ~9 chunks at 400 ms: turn 1 streams for ~3.6 s on A.
            s.slow_once.insert(1, Duration::from_millis(400));
            s
        })
        .collect();
    let subs = c.submit_many(scripts).await;
    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    eventually(
        "every session streaming turn 1 on A",
        Duration::from_secs(60),
        async || subs.iter().all(|s| c.llm_requests(s, 1) == 1),
    )
    .await;

    // B can only get these sessions from A's hand-back: its reclaimer would wait an hour
    // for A's entries to go idle.
    let b = c
        .spawn_ready_worker(&WorkerOpts {
            reclaim_min_idle_secs: 3600.0,
            ..WorkerOpts::default()
        })
        .await;

    let t0 = Instant::now();
    c.term_worker(a);
    let status = c
        .wait_exit(a, Duration::from_secs_f64(DRAIN_SECS + 10.0))
        .await
        .expect("A exited after SIGTERM");
    let drained_in = t0.elapsed();
    assert!(status.success(), "A exited with {status}");
    assert!(
        drained_in < Duration::from_secs_f64(DRAIN_SECS + 3.0),
        "A took {drained_in:?} to drain (bound {DRAIN_SECS} s)"
    );

    let rows = c.wait_all_terminal(&ids, Duration::from_secs(20)).await;
    let resumed_in = t0.elapsed();
    eprintln!("A drained in {drained_in:?}; all resumed and finished {resumed_in:?} after SIGTERM");
    for (sub, row) in subs.iter().zip(&rows) {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(c.transcript(sub).await, expected);
        // A let the streaming answer finish and committed it: nobody asked again.
        for turn in 0..3 {
            assert_eq!(c.llm_requests(sub, turn), 1, "turn {turn} of {}", sub.id);
        }
        for tool in ["t0a", "fast", "slow"] {
            assert_eq!(c.tool_hits(sub, tool), 1, "tool {tool} of {}", sub.id);
        }
    }
    let a_log = c.worker_log(a);
    assert_eq!(
        a_log.matches("handing the session back").count(),
        SESSIONS,
        "A's log:\n{a_log}"
    );
    // One reference session finished on A before the drain; the rest only on B (which
    // logs each just after its final commit, hence the wait).
    assert_eq!(
        a_log.matches("session finished").count(),
        1,
        "A's log:\n{a_log}"
    );
    eventually(
        "B logged every finish",
        Duration::from_secs(10),
        async || c.worker_log(b).matches("session finished").count() == SESSIONS,
    )
    .await;
}
