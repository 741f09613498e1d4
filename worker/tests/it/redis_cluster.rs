//! The scheduler and its workers on a 3-master Redis Cluster (`[redis] cluster`, each
//! queue in 8 partitions): sessions on two queues, served by workers reading both, with
//! sub-agents, end exactly once each; a session's live events reach a client through the
//! scheduler; and no node refused or failed a command (`INFO commandstats`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;

use agentq_core::SessionStatus;
use agentq_testkit::RedisCluster;

use crate::common::{Cluster, Redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_on_two_queues_end_once_each_on_a_redis_cluster() {
    let script = json!({
        "turns": [{"text": "plain answer"}],
        "variants": [
            {"when_prompt_contains": "ROOT", "turns": [
                {"tool_calls": [{"name": "spawn_agent", "arguments":
                    {"prompt": "CHILD: answer", "label": "c", "wait": true}}]},
                {"text": "root got: {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "CHILD", "turns": [{"text": "child answer"}]}
        ]
    });
    let redis = Redis::Cluster(RedisCluster::start(3).unwrap());
    let queues = ["default", "batch"];
    let c = Cluster::start_on(redis, &queues, script, 2, 4, |cfg| {
        cfg.queues = queues.iter().map(|q| q.to_string()).collect();
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..12 {
        let queue = queues[i % 2];
        let prompt = if i % 4 == 0 {
            format!("ROOT {i}")
        } else {
            format!("task {i}")
        };
        ids.push(c.submit_to(queue, &prompt, &["spawn_agent"], |_| {}).await);
    }
    let rows = c.wait_terminal(&ids, Duration::from_secs(60)).await;
    for r in &rows {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
    }
    // Each ran once: one model call per plain session, two per root (before and after
    // its child), and one lease taken each time it started.
    for (i, id) in ids.iter().enumerate() {
        let r = c.row(id).await;
        let want = if i % 4 == 0 { 2 } else { 1 };
        assert_eq!(r.iteration, want, "{r:?}");
        if i % 4 == 0 {
            let result = r.result.unwrap_or_default();
            assert!(result.contains("child answer"), "{result}");
        }
    }
    // A finished session's events replay through the scheduler (its relay reads many
    // sessions' streams, each a slot of its own).
    let events = c
        .events_until(&ids[1], |seen| {
            seen.iter().any(|(e, _)| e == "session_completed")
        })
        .await;
    assert!(
        events.iter().any(|(e, _)| e == "session_completed"),
        "{events:?}"
    );
    let Redis::Cluster(cluster) = &c.redis else {
        unreachable!()
    };
    assert_eq!(cluster.command_errors().unwrap(), Vec::<String>::new());
    c.shutdown().await;
}
