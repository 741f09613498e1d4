//! Redis or Postgres dies (SIGKILL) and comes back while two workers are mid-run on two
//! dozen sessions: every session still completes, with the full history.

use std::time::Duration;

use agentq_core::SessionStatus;

use crate::common::{Cluster, ClusterOpts, Script, WorkerOpts, eventually};

const SESSIONS: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Redis,
    Postgres,
}

fn script() -> Script {
    let mut s = Script::three_turns();
    // ~9 chunks at 120 ms: each LLM answer takes ~1 s, so sessions are mid-run for seconds.
    s.chunk_delay = Duration::from_millis(120);
    s
}

async fn restarted_mid_run(service: Service) {
    let mut c = Cluster::start_with(ClusterOpts {
        persistent_redis: service == Service::Redis,
        private_postgres: service == Service::Postgres,
        ..ClusterOpts::default()
    })
    .await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;

    let reference = c.submit(script()).await;
    c.wait_all_terminal(std::slice::from_ref(&reference.id), Duration::from_secs(60))
        .await;
    let expected = c.transcript(&reference).await;
    assert_eq!(expected.len(), 7);

    let subs = c
        .submit_many((0..SESSIONS).map(|_| script()).collect())
        .await;
    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    // Mid-run: on average one and a half of the three LLM turns requested.
    eventually("sessions mid-run", Duration::from_secs(60), async || {
        subs.iter().map(|s| c.llm_requests_all(s)).sum::<usize>() >= SESSIONS * 3 / 2
    })
    .await;
    let mut unfinished = 0;
    for id in &ids {
        if !c.row(id).await.status.is_terminal() {
            unfinished += 1;
        }
    }
    assert!(unfinished > 0, "every session finished before the restart");
    eprintln!("{service:?} killed with {unfinished}/{SESSIONS} sessions unfinished");

    match service {
        Service::Redis => {
            c.redis.server().kill();
            tokio::time::sleep(Duration::from_secs(1)).await;
            tokio::task::block_in_place(|| c.redis.server().restart()).expect("restarting redis");
        }
        Service::Postgres => {
            let pg = c.pg.as_mut().expect("a private postgres");
            tokio::task::block_in_place(|| pg.kill());
            tokio::time::sleep(Duration::from_secs(1)).await;
            let pg = c.pg.as_mut().expect("a private postgres");
            tokio::task::block_in_place(|| pg.restart()).expect("restarting postgres");
        }
    }

    let rows = c.wait_all_terminal(&ids, Duration::from_secs(180)).await;
    for (sub, row) in subs.iter().zip(&rows) {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(
            c.transcript(sub).await,
            expected,
            "transcript of {}",
            sub.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_mid_run() {
    restarted_mid_run(Service::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_run() {
    restarted_mid_run(Service::Postgres).await;
}
