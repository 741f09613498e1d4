//! Two hundred sessions over three worker processes: each runs once, each completion is
//! published once; a duplicate entry of a finished session is acked, neither published
//! nor run again.

use std::time::Duration;

use agentq_core::queue::QueueHealth;
use agentq_core::{EnqueueReason, SessionStatus, WorkQueue};

use crate::common::{Cluster, Script, WorkerOpts, eventually};

const SESSIONS: usize = 200;
const WORKERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sessions_three_workers() {
    let mut c = Cluster::start().await;
    let done = c.count_done_messages().await;
    let subs = c
        .submit_many((0..SESSIONS).map(|_| Script::two_turns()).collect())
        .await;
    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    let started = std::time::Instant::now();
    let workers: Vec<usize> = (0..WORKERS)
        .map(|_| c.spawn_worker(&WorkerOpts::default()))
        .collect();
    let rows = c.wait_all_terminal(&ids, Duration::from_secs(240)).await;
    eprintln!(
        "{SESSIONS} sessions on {WORKERS} workers in {:?}",
        started.elapsed()
    );
    for w in &workers {
        eprintln!(
            "worker {w} finished {} sessions",
            c.worker_log(*w).matches("session finished").count()
        );
    }

    let expected = c.transcript(&subs[0]).await;
    assert_eq!(expected.len(), 4, "{expected:#?}");
    for (sub, row) in subs.iter().zip(&rows) {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(row.iteration, 2);
        assert_eq!(c.transcript(sub).await, expected, "{}", sub.id);
        // No worker died: every turn and every tool ran exactly once.
        assert_eq!(c.llm_requests(sub, 0), 1, "{}", sub.id);
        assert_eq!(c.llm_requests(sub, 1), 1, "{}", sub.id);
        assert_eq!(c.tool_hits(sub, "page"), 1, "{}", sub.id);
    }

    // Each completion exactly once, on the channel and in the stream.
    eventually(
        "every completion on agentq:done",
        Duration::from_secs(10),
        async || done.lock().unwrap().len() == SESSIONS,
    )
    .await;
    let completions = c.completion_entries().await;
    assert_eq!(completions.len(), SESSIONS);
    {
        let done = done.lock().unwrap();
        for id in &ids {
            assert_eq!(done.get(id).copied(), Some(1), "agentq:done for {id}");
            assert_eq!(
                completions.get(id).copied(),
                Some(1),
                "agentq:completions for {id}"
            );
        }
    }

    // A duplicate entry of a finished, announced session: acked, neither run nor
    // published again (a completion is published before its entry is acked, so one would
    // be in the stream by the time the entry is).
    let victim = &subs[7];
    let before = c.row(&victim.id).await;
    let before_transcript = c.transcript(victim).await;
    let before_llm = c.llm_requests_all(victim);
    c.queue
        .enqueue("default", &victim.id, EnqueueReason::Retry)
        .await
        .unwrap();
    eventually(
        "the duplicate entry delivered and acked",
        Duration::from_secs(20),
        async || c.queue.stats("default").await.unwrap().waiting() == 0,
    )
    .await;
    assert_eq!(c.completion_entries().await.get(&victim.id), Some(&1));
    assert_eq!(done.lock().unwrap().get(&victim.id), Some(&1));
    let after = c.row(&victim.id).await;
    assert_eq!(c.transcript(victim).await, before_transcript);
    assert_eq!(after.iteration, before.iteration);
    assert_eq!(after.updated_at, before.updated_at, "the row was written");
    assert_eq!(after.lease_epoch, before.lease_epoch, "it was claimed");
    assert_eq!(c.llm_requests_all(victim), before_llm);
    assert_eq!(c.tool_hits(victim, "page"), 1);
    // No session was published again.
    let completions = c.completion_entries().await;
    assert_eq!(completions.values().sum::<usize>(), SESSIONS);
}
