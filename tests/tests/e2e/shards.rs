//! Two Postgres shards (`database_url` naming both) under the real scheduler-less stack:
//! workers run sessions spread over both shards, trees stay whole on their root's shard,
//! and one shard stopped and restarted mid-run stops only its own sessions; nothing is
//! lost and no history holds anything twice.

use std::time::Duration;

use agentq_core::sharded::ShardedStore;
use agentq_core::{ListFilter, SessionStatus, SessionStore};

use crate::common::*;

const LIMIT: Duration = Duration::from_secs(120);

fn two_shards(private_shard: bool) -> ClusterOpts {
    ClusterOpts {
        extra_shards: 1,
        private_shard,
        ..ClusterOpts::default()
    }
}

/// The shard of a session id among `shards`, as the store routes it.
fn shard_of(id: &str, shards: usize) -> usize {
    agentq_core::shard::partition_of(id).map_or(0, |p| agentq_core::shard::shard_of(p, shards))
}

/// How many sessions shard `i`'s own database holds.
async fn rows_on(c: &Cluster, i: usize) -> usize {
    let all = ListFilter {
        limit: 1000,
        ..ListFilter::default()
    };
    c.shards[i].list(&all).await.unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_and_trees_run_over_two_shards() {
    let mut c = Cluster::start_with(two_shards(false)).await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    let child_token = c.register(Script::new(vec![Turn::text("the helper's part")]));
    let root = c
        .submit_spawner(Script::new(vec![
            Turn {
                text: "Starting a helper.".into(),
                tools: vec![ToolUse::spawn(&child_token, "helper", true)],
            },
            Turn::text("Done, with the helper's part."),
        ]))
        .await;
    let subs = c
        .submit_many((0..20).map(|_| Script::two_turns()).collect())
        .await;
    let mut ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    ids.push(root.id.clone());
    let rows = c.wait_all_terminal(&ids, LIMIT).await;
    for row in &rows {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    }
    let expected = c.transcript(&subs[0]).await;
    for sub in &subs {
        assert_eq!(c.transcript(sub).await, expected, "{}", sub.id);
        assert_eq!(c.llm_requests(sub, 0), 1, "{}", sub.id);
        assert_eq!(c.llm_requests(sub, 1), 1, "{}", sub.id);
    }
    // Both shards were used, and the child lives beside its root.
    let on: Vec<usize> = ids.iter().map(|id| shard_of(id, 2)).collect();
    assert!(on.contains(&0) && on.contains(&1), "{on:?}");
    let kids = c.children(&root.id).await;
    assert_eq!(kids.len(), 1);
    assert_eq!(shard_of(&kids[0].id, 2), shard_of(&root.id, 2));
    assert_eq!(kids[0].status, SessionStatus::Completed);
    assert_eq!(rows_on(&c, 0).await + rows_on(&c, 1).await, 22);
    let routed = ShardedStore::new(c.shards.clone()).unwrap();
    for id in &ids {
        assert_eq!(routed.index(id), shard_of(id, 2));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_shard_stopped_and_restarted_while_the_other_goes_on() {
    const SESSIONS: usize = 16;
    let mut c = Cluster::start_with(two_shards(true)).await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    let mut script = Script::three_turns();
    // Each answer streams for about a second: sessions are mid-run when the shard stops.
    script.chunk_delay = Duration::from_millis(120);
    let reference = c.submit(script.clone()).await;
    c.wait_all_terminal(std::slice::from_ref(&reference.id), LIMIT)
        .await;
    let expected = c.transcript(&reference).await;

    let subs = c
        .submit_many((0..SESSIONS).map(|_| script.clone()).collect())
        .await;
    let (kept, stopped): (Vec<&Sub>, Vec<&Sub>) =
        subs.iter().partition(|s| shard_of(&s.id, 2) == 0);
    assert!(
        !kept.is_empty() && !stopped.is_empty(),
        "both shards hold sessions"
    );
    eventually("sessions mid-run", LIMIT, async || {
        stopped.iter().map(|s| c.llm_requests_all(s)).sum::<usize>() >= stopped.len()
    })
    .await;
    let pg = c.shard_pg.as_mut().expect("the private shard");
    tokio::task::block_in_place(|| pg.kill());

    // The other shard's sessions finish while this one is down.
    let kept_ids: Vec<String> = kept.iter().map(|s| s.id.clone()).collect();
    let rows = c.wait_all_terminal(&kept_ids, LIMIT).await;
    for (sub, row) in kept.iter().zip(&rows) {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(c.transcript(sub).await, expected, "{}", sub.id);
    }
    let pg = c.shard_pg.as_mut().expect("the private shard");
    assert!(
        !pg.is_running(),
        "the shard came back before the others finished"
    );
    tokio::task::block_in_place(|| pg.restart()).expect("restarting the shard");

    // The stopped shard's sessions resume: every one completes, its history whole and
    // nothing in it twice.
    let stopped_ids: Vec<String> = stopped.iter().map(|s| s.id.clone()).collect();
    let rows = c.wait_all_terminal(&stopped_ids, LIMIT).await;
    for (sub, row) in stopped.iter().zip(&rows) {
        assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
        assert_eq!(c.transcript(sub).await, expected, "{}", sub.id);
    }
}
