//! Session trees under worker crashes: the worker running a parent, or a child, is
//! SIGKILLed; the tree completes and every child's result reaches the parent's history
//! exactly once.

use std::time::Duration;

use serde_json::Value;

use crate::common::*;

const LIMIT: Duration = Duration::from_secs(90);

fn user_texts(t: &[Value]) -> Vec<String> {
    t.iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_the_parents_worker_while_a_background_child_runs() {
    parents_worker_killed_while_a_background_child_runs(ClusterOpts::default()).await;
}

/// The same on the scale-out layout: the tree on one of two Postgres shards (the child on
/// its root's), its entries and events on a Redis Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_the_parents_worker_on_a_redis_cluster_and_two_shards() {
    parents_worker_killed_while_a_background_child_runs(ClusterOpts::scaled_out()).await;
}

async fn parents_worker_killed_while_a_background_child_runs(opts: ClusterOpts) {
    let mut c = Cluster::start_with(opts).await;
    let w0 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let _w1 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    // The child streams slowly, so it is still running while the parent streams its own
    // (slow) next turn — that is when the parent's worker dies.
    let mut child = Script::new(vec![Turn::text("the background work is done")]);
    child.chunk_delay = Duration::from_millis(700);
    let child_token = c.register(child);
    let mut parent = Script::new(vec![
        Turn {
            text: "Starting a helper.".into(),
            tools: vec![ToolUse::spawn(&child_token, "helper", false)],
        },
        Turn::text("Meanwhile, the main work is done."),
        Turn::text("Everything is done, including the helper's part."),
    ]);
    parent.slow_once.insert(1, Duration::from_millis(800));
    let root = c.submit_spawner(parent).await;

    // Observe: the parent is streaming turn 1 while its child runs.
    eventually(
        "parent on turn 1 with its child running",
        LIMIT,
        async || {
            let kids = c.children(&root.id).await;
            c.llm_requests(&root, 1) >= 1
                && kids.len() == 1
                && kids[0].status == agentq_core::SessionStatus::Running
        },
    )
    .await;
    let holder = c
        .lease_holder(&root.id)
        .await
        .expect("the parent is leased");
    c.kill_worker(holder);
    let _w2 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let _ = w0;

    let rows = c
        .wait_all_terminal(std::slice::from_ref(&root.id), LIMIT)
        .await;
    assert_eq!(
        rows[0].status,
        agentq_core::SessionStatus::Completed,
        "{rows:?}"
    );
    let kids = c.children(&root.id).await;
    assert_eq!(kids.len(), 1, "the spawn was not repeated: one child");
    assert_eq!(kids[0].status, agentq_core::SessionStatus::Completed);
    let shard = |id: &str| {
        agentq_core::shard::partition_of(id)
            .map_or(0, |p| agentq_core::shard::shard_of(p, c.shards.len()))
    };
    assert_eq!(
        shard(&kids[0].id),
        shard(&root.id),
        "the child on its root's shard"
    );
    let t = c.transcript(&root).await;
    let delivered: Vec<String> = user_texts(&t)
        .into_iter()
        .filter(|u| u.starts_with("[Background agent"))
        .collect();
    assert_eq!(
        delivered,
        vec![format!(
            "[Background agent \"helper\" ({}) completed] the background work is done",
            kids[0].id
        )],
        "the child's result is delivered exactly once"
    );
    // The committed turn 0 (the spawn) was never asked again.
    assert_eq!(c.llm_requests(&root, 0), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_a_childs_worker_mid_stream() {
    let mut c = Cluster::start().await;
    let _w0 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let _w1 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let mut child = Script::new(vec![
        Turn::gets("Looking it up.", &["lookup"]),
        Turn::text("the answer is 42"),
    ]);
    child.slow_once.insert(1, Duration::from_millis(900));
    let child_token = c.register(child);
    let parent = Script::new(vec![
        Turn {
            text: "Asking a helper.".into(),
            tools: vec![ToolUse::spawn(&child_token, "asker", true)],
        },
        Turn::text("The helper says 42."),
    ]);
    let root = c.submit_spawner(parent).await;

    // Observe: the child streams its final turn (its tool result is committed).
    let child_sub = Sub {
        id: String::new(),
        token: child_token.clone(),
    };
    eventually("the child streaming turn 1", LIMIT, async || {
        c.llm_requests(&child_sub, 1) >= 1
    })
    .await;
    let kid = c.children(&root.id).await.remove(0);
    let holder = c.lease_holder(&kid.id).await.expect("the child is leased");
    c.kill_worker(holder);
    let _w2 = c.spawn_ready_worker(&WorkerOpts::default()).await;

    let rows = c
        .wait_all_terminal(std::slice::from_ref(&root.id), LIMIT)
        .await;
    assert_eq!(
        rows[0].status,
        agentq_core::SessionStatus::Completed,
        "{rows:?}"
    );
    let t = c.transcript(&root).await;
    let results: Vec<&Value> = t.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(results.len(), 1, "{t:#?}");
    assert_eq!(results[0]["content"], "the answer is 42");
    let kids = c.children(&root.id).await;
    assert_eq!(kids.len(), 1);
    // The child's committed work was not redone: its tool ran once, its turn 0 was
    // asked once; only the turn that was streaming when its worker died was asked again.
    assert_eq!(c.tool_hits(&child_sub, "lookup"), 1);
    assert_eq!(c.llm_requests(&child_sub, 0), 1);
    assert_eq!(c.llm_requests(&child_sub, 1), 2);
    assert_eq!(c.llm_requests(&root, 0), 1);
}
