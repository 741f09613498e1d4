//! Sub-agents, suspension, approvals and steering, end to end in process: real Postgres
//! and Redis, the scheduler's HTTP API, several workers, the scripted provider playing
//! parents and children by their task.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::schema::{Message, Role};
use agentq_agent::spec::SessionSpec;
use agentq_core::protocol::{InboxKind, InboxPayload, SteerMessage, Strategy};
use agentq_core::{InboxStore, SessionStatus, SessionStore};
use agentq_worker::WorkerSettings;

use crate::common;

use common::{Cluster, TENANT, wait_until};

fn spawn_call(prompt: &str, label: &str, wait: bool) -> Value {
    json!({"name": "spawn_agent", "arguments": {"prompt": prompt, "label": label, "wait": wait}})
}

/// The transcript as clients read it: each turn's results in call order.
async fn transcript(c: &Cluster, id: &str) -> Vec<Message> {
    let mut msgs = c.store.messages(id).await.unwrap();
    agentq_agent::state::normalize_history(&mut msgs);
    msgs
}

fn tool_results(msgs: &[Message]) -> Vec<&Message> {
    msgs.iter().filter(|m| m.role == Role::Tool).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreground_and_background_children_nested_two_levels() {
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "ROOT", "turns": [
                {"tool_calls": [spawn_call("CHILD-A: ask your own helper", "a", true),
                                spawn_call("CHILD-B: slow background work", "b", false)]},
                {"text": "root: first answer"},
                {"text": "root: final answer"}
            ]},
            {"when_prompt_contains": "CHILD-A", "turns": [
                {"tool_calls": [spawn_call("GRANDCHILD: answer", "g", true)]},
                {"text": "A got: {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "GRANDCHILD", "turns": [{"text": "grandchild answer"}]},
            {"when_prompt_contains": "CHILD-B", "turns": [{"text": "B answer", "delay_ms": 1500}]}
        ]
    });
    let c = Cluster::start(script, 2, 4, |_| {}).await;
    let root = c.submit("ROOT task", &["spawn_agent"], |_| {}).await;
    let row = c
        .wait_status(
            &root,
            &[SessionStatus::Completed, SessionStatus::Failed],
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    let msgs = transcript(&c, &root).await;
    let results = tool_results(&msgs);
    // The foreground child's answer is its call's result (it in turn got its own
    // child's answer the same way).
    assert_eq!(results[0].content, "A got: grandchild answer");
    assert!(
        results[1]
            .content
            .starts_with("Started background agent \"b\"")
    );
    let children = c.children(&root).await;
    assert_eq!(children.len(), 2);
    let b = children
        .iter()
        .find(|ch| ch.spec.prompt.contains("CHILD-B"))
        .unwrap();
    let a = children
        .iter()
        .find(|ch| ch.spec.prompt.contains("CHILD-A"))
        .unwrap();
    assert_eq!(a.depth, 1);
    let grand = c.children(&a.id).await;
    assert_eq!(grand.len(), 1);
    assert_eq!(grand[0].depth, 2);
    assert_eq!(grand[0].root_id, root);
    // Children act for their root's caller: they never leave its tenant.
    assert_eq!(row.tenant, TENANT);
    for ch in children.iter().chain(&grand) {
        assert_eq!(ch.tenant, TENANT, "{ch:?}");
    }
    // The background result is injected exactly once, in the documented format.
    let want = format!("[Background agent \"b\" ({}) completed] B answer", b.id);
    let injected: Vec<&Message> = msgs
        .iter()
        .filter(|m| m.role == Role::User && m.content.contains("[Background agent"))
        .collect();
    assert_eq!(injected.len(), 1, "{msgs:#?}");
    assert_eq!(injected[0].content, want);
    // It came after the root's first answer (the root waited for it, holding no slot),
    // and the model answered again.
    assert_eq!(row.result.as_deref(), Some("root: final answer"));
    // The API lists the tree.
    let tree: Value = c
        .http
        .get(format!("{}/v1/sessions/{root}/tree", c.api))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tree["children"].as_array().unwrap().len(), 2);
    let view: Value = c
        .http
        .get(format!("{}/v1/sessions/{root}", c.api))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(view["children"].as_array().unwrap().len(), 2);
    c.shutdown().await;
}

/// Two machines (workers with their own workspace roots, one slot each): the parent runs
/// on one while its background child runs on the other and writes a file. When the
/// child's result reaches the still-running parent, the file is on the parent's disk:
/// the parent reads it without being suspended or claimed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_childs_files_reach_its_running_parent_on_another_machine() {
    let write = |path: &str, content: &str| json!({"name": "write_file", "arguments": {"path": path, "content": content}});
    let read = |path: &str| json!({"name": "read_file", "arguments": {"path": path}});
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "ROOT", "repeat_last": true, "turns": [
                {"tool_calls": [write("parent.txt", "the parent's own")]},
                {"tool_calls": [spawn_call("CHILD: write your report", "c", false)]},
                // Polls for the report (bounded by max_iterations), each turn a while.
                {"tool_calls": [read("report.txt"), read("parent.txt")], "delay_ms": 300}
            ]},
            {"when_prompt_contains": "CHILD", "turns": [
                {"tool_calls": [write("report.txt", "written on the other machine"),
                                write("parent.txt", "the child's version")]},
                {"text": "report written"}
            ]}
        ]
    });
    let disk_a = tempfile::tempdir().unwrap();
    let disk_b = tempfile::tempdir().unwrap();
    let (a, b) = (
        std::fs::canonicalize(disk_a.path()).unwrap(),
        std::fs::canonicalize(disk_b.path()).unwrap(),
    );
    let c = Cluster::start(script, 2, 1, |cfg| {
        cfg.policy = policy_with(|p| p.tools.push("write_file".into()));
        cfg.workspace_root = if cfg.consumer.starts_with("w0") {
            a.clone()
        } else {
            b.clone()
        };
    })
    .await;
    let root = c
        .submit(
            "ROOT task",
            &["spawn_agent", "read_file", "write_file"],
            |s| {
                s.max_iterations = 30;
                // It polls with the same reads until the child's result comes.
                s.max_repeated_calls = 0;
            },
        )
        .await;
    let row = c
        .wait_status(
            &root,
            &[SessionStatus::Completed, SessionStatus::Failed],
            Duration::from_secs(60),
        )
        .await;
    let msgs = transcript(&c, &root).await;
    let child = c
        .children(&root)
        .await
        .pop()
        .unwrap_or_else(|| panic!("no child: {row:?} {msgs:#?}"));
    assert_eq!(child.status, SessionStatus::Completed, "{child:?}");
    // One claim of the parent: what it read came while it ran.
    assert_eq!(row.lease_epoch, 1, "{row:?}");
    let results: Vec<&str> = tool_results(&msgs)
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    let first_seen = results
        .iter()
        .position(|r| r.contains("written on the other machine"))
        .unwrap_or_else(|| panic!("the parent never read the child's file: {results:#?}"));
    // Before the result came the file was not there; after it, every read finds it.
    assert!(
        results[..first_seen]
            .iter()
            .any(|r| r.contains("no such file")),
        "{results:#?}"
    );
    let injected = msgs
        .iter()
        .position(|m| m.role == Role::User && m.content.contains("[Background agent"))
        .unwrap();
    let first_read_after = msgs
        .iter()
        .enumerate()
        .position(|(i, m)| {
            i > injected
                && m.role == Role::Tool
                && m.content.contains("written on the other machine")
        })
        .unwrap();
    assert!(first_read_after > injected);
    // The path both wrote: the child's commit came after the parent's, and is what the
    // parent reads from then on.
    let last = results.last().unwrap();
    assert!(last.contains("the child's version"), "{results:#?}");
    // The parent held its machine's only slot throughout, so the child ran on the other:
    // both disks hold the report.
    for disk in [&a, &b] {
        assert_eq!(
            std::fs::read_to_string(disk.join(&root).join("report.txt")).unwrap(),
            "written on the other machine"
        );
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_completes_with_fewer_slots_than_sessions() {
    let sixteen: Vec<Value> = (0..16)
        .map(|i| spawn_call(&format!("CHILD {i}: split further"), &format!("c{i}"), true))
        .collect();
    let four: Vec<Value> = (0..4)
        .map(|i| spawn_call(&format!("LEAF {i}: answer"), &format!("l{i}"), true))
        .collect();
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "ROOT", "turns": [{"tool_calls": sixteen}, {"text": "root done"}]},
            {"when_prompt_contains": "CHILD", "turns": [{"tool_calls": four}, {"text": "child done"}]},
            {"when_prompt_contains": "LEAF", "turns": [{"text": "leaf", "delay_ms": 50}]}
        ]
    });
    // 4 workers × 8 slots = 32 slots for 81 sessions: only possible if waiting parents
    // hold none.
    let c = Cluster::start(script, 4, 8, |_| {}).await;
    let root = c.submit("ROOT fan out", &["spawn_agent"], |_| {}).await;
    let row = c
        .wait_status(
            &root,
            &[SessionStatus::Completed, SessionStatus::Failed],
            Duration::from_secs(180),
        )
        .await;
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    let children = c.children(&root).await;
    assert_eq!(children.len(), 16);
    let mut leaves = 0;
    for ch in &children {
        assert_eq!(ch.status, SessionStatus::Completed);
        let gs = c.children(&ch.id).await;
        assert_eq!(gs.len(), 4);
        leaves += gs
            .iter()
            .filter(|g| g.status == SessionStatus::Completed)
            .count();
        let msgs = c.store.messages(&ch.id).await.unwrap();
        let r = tool_results(&msgs);
        assert_eq!(r.len(), 4);
        assert!(r.iter().all(|m| m.content == "leaf"));
    }
    assert_eq!(leaves, 64);
    let msgs = transcript(&c, &root).await;
    let r = tool_results(&msgs);
    assert_eq!(r.len(), 16, "each child's answer delivered exactly once");
    assert!(r.iter().all(|m| m.content == "child done"));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_and_fan_out_limits_are_tool_errors() {
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "NEST", "turns": [
                {"tool_calls": [spawn_call("NEST deeper", "n", true)]},
                {"text": "nest: {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "LONG", "turns": [
                {"tool_calls": [spawn_call(&format!("LEAF {}", "x".repeat(600)), "l", true)]},
                {"text": "long: {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "WIDE", "turns": [
                {"tool_calls": [spawn_call("LEAF 1", "1", false), spawn_call("LEAF 2", "2", false), spawn_call("LEAF 3", "3", false)]},
                {"text": "wide done"}
            ]},
            {"when_prompt_contains": "LEAF", "turns": [{"text": "leaf"}]}
        ]
    });
    let c = Cluster::start(script, 1, 8, |cfg| {
        cfg.max_depth = 2;
        cfg.max_children = 2;
        cfg.max_prompt_bytes = 500;
    })
    .await;
    let nest = c.submit("NEST top", &["spawn_agent"], |_| {}).await;
    let row = c
        .wait_status(&nest, &[SessionStatus::Completed], Duration::from_secs(60))
        .await;
    // Depth 0 → 1 → 2; the session at depth 2 may not spawn: its tool error travels up.
    assert!(
        row.result
            .as_deref()
            .unwrap()
            .contains("nest 2 levels deep"),
        "{row:?}"
    );
    let wide = c.submit("WIDE top", &["spawn_agent"], |_| {}).await;
    c.wait_status(&wide, &[SessionStatus::Completed], Duration::from_secs(60))
        .await;
    let msgs = c.store.messages(&wide).await.unwrap();
    let r = tool_results(&msgs);
    assert_eq!(r.iter().filter(|m| m.is_error).count(), 1);
    assert!(
        r.iter()
            .any(|m| m.content.contains("already started 2 sub-agents"))
    );
    assert_eq!(c.children(&wide).await.len(), 2);
    // A prompt longer than a request's may be is refused before any child is stored.
    let long = c.submit("LONG top", &["spawn_agent"], |_| {}).await;
    let row = c
        .wait_status(&long, &[SessionStatus::Completed], Duration::from_secs(60))
        .await;
    assert!(
        row.result
            .as_deref()
            .unwrap()
            .contains("a sub-agent's prompt is at most 500 bytes"),
        "{row:?}"
    );
    assert!(c.children(&long).await.is_empty());
    c.shutdown().await;
}

/// The worker's policy: the default `[policy]` changed by `tweak`.
fn policy_with(
    tweak: impl FnOnce(&mut agentq_core::config::PolicySection),
) -> Arc<agentq_core::policy::Policy> {
    let mut section = agentq_core::config::PolicySection::default();
    tweak(&mut section);
    Arc::new(agentq_core::policy::Policy::from_section(&section).unwrap())
}

/// The tenant's policy bounds sub-agents below the worker's own limits (the lower one
/// applies), and a sub-agent cannot be given a tool the policy does not allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenants_policy_bounds_sub_agents() {
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "NEST", "turns": [
                {"tool_calls": [spawn_call("NEST deeper", "n", true)]},
                {"text": "nest: {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "WIDE", "turns": [
                {"tool_calls": [spawn_call("LEAF 1", "1", false), spawn_call("LEAF 2", "2", false), spawn_call("LEAF 3", "3", false)]},
                {"text": "wide done"}
            ]},
            {"when_prompt_contains": "GREEDY", "turns": [
                {"tool_calls": [{"name": "spawn_agent", "arguments": {"prompt": "LEAF w", "tools": ["write_file"]}}]},
                {"text": "greedy: {{last_tool_result}}"}
            ]},
            {"when_prompt_contains": "LEAF", "turns": [{"text": "leaf"}]}
        ]
    });
    let c = Cluster::start(script, 1, 8, |cfg| {
        // The worker would allow 3 levels and 16 children; the policy allows 1 and 2.
        cfg.max_depth = 3;
        cfg.max_children = 16;
        cfg.policy = policy_with(|p| {
            p.max_depth = Some(1);
            p.max_children = Some(2);
        });
    })
    .await;
    let nest = c.submit("NEST top", &["spawn_agent"], |_| {}).await;
    let row = c
        .wait_status(&nest, &[SessionStatus::Completed], Duration::from_secs(60))
        .await;
    // Depth 0 → 1; the session at depth 1 may not spawn: its tool error travels up.
    assert!(
        row.result
            .as_deref()
            .unwrap()
            .contains("nest 1 levels deep"),
        "{row:?}"
    );
    let child = c.children(&nest).await.remove(0);
    assert!(c.children(&child.id).await.is_empty());

    let wide = c.submit("WIDE top", &["spawn_agent"], |_| {}).await;
    c.wait_status(&wide, &[SessionStatus::Completed], Duration::from_secs(60))
        .await;
    let msgs = c.store.messages(&wide).await.unwrap();
    let r = tool_results(&msgs);
    assert_eq!(r.iter().filter(|m| m.is_error).count(), 1);
    assert!(
        r.iter()
            .any(|m| m.content.contains("already started 2 sub-agents"))
    );
    assert_eq!(c.children(&wide).await.len(), 2);

    // write_file is not the parent's, nor allowed by the policy: a tool error the model
    // sees, and no child.
    let greedy = c.submit("GREEDY top", &["spawn_agent"], |_| {}).await;
    let row = c
        .wait_status(
            &greedy,
            &[SessionStatus::Completed],
            Duration::from_secs(60),
        )
        .await;
    assert!(
        row.result.as_deref().unwrap().contains("write_file"),
        "{row:?}"
    );
    assert!(c.children(&greedy).await.is_empty());
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parent_cancels_its_subtree() {
    let script = json!({
        "turns": [],
        "variants": [
            {"when_prompt_contains": "ROOT", "turns": [
                {"tool_calls": [spawn_call("MID: go on", "m", true)]}, {"text": "never"}]},
            {"when_prompt_contains": "MID", "turns": [
                {"tool_calls": [spawn_call("SLOW: take long", "s", true)]}, {"text": "never"}]},
            {"when_prompt_contains": "SLOW", "turns": [{"text": "slow", "delay_ms": 60000}]}
        ]
    });
    let c = Cluster::start(script, 1, 8, |_| {}).await;
    let root = c.submit("ROOT cancel me", &["spawn_agent"], |_| {}).await;
    // Wait for the grandchild to be running (the parents wait, holding no slot).
    let grand = wait_until("the grandchild to run", Duration::from_secs(30), || async {
        let kids = c.children(&root).await;
        if let Some(mid) = kids.first() {
            let g = c.children(&mid.id).await;
            if let Some(g) = g.first()
                && g.status == SessionStatus::Running
            {
                return Ok(g.id.clone());
            }
        }
        Err(kids)
    })
    .await;
    // The root suspends after its spawn is committed, so on a loaded machine the grandchild
    // may be running before the root's wait is: wait for the root's own step.
    c.wait_status(&root, &[SessionStatus::Waiting], Duration::from_secs(20))
        .await;
    let (status, _) = c
        .post(&format!("/v1/sessions/{root}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
    let g = c
        .wait_status(&grand, &[SessionStatus::Cancelled], Duration::from_secs(20))
        .await;
    assert_eq!(g.finish_reason.map(|r| r.as_str()), Some("interrupted"));
    let mid = c.children(&root).await.remove(0);
    assert_eq!(mid.status, SessionStatus::Cancelled);
    assert_eq!(c.row(&root).await.status, SessionStatus::Cancelled);
    c.shutdown().await;
}

fn sensitive_script() -> Value {
    json!({"turns": [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "hello"}}]},
        {"text": "after: {{last_tool_result}}"}
    ]})
}

async fn held_call(c: &Cluster, id: &str) -> String {
    c.wait_status(
        id,
        &[SessionStatus::AwaitingApproval],
        Duration::from_secs(30),
    )
    .await;
    let msgs = c.store.messages(id).await.unwrap();
    msgs.iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .unwrap()
        .tool_calls[0]
        .id
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_approve_deny_and_time_out() {
    let c = Cluster::start(sensitive_script(), 1, 4, |cfg| {
        cfg.policy = policy_with(|p| p.tools.push("write_file".into()));
    })
    .await;
    let sensitive = |s: &mut SessionSpec| s.sensitive_tools = vec!["write_file".into()];

    // Approve: the tool runs once.
    let a = c.submit("approve me", &["write_file"], sensitive).await;
    let call = held_call(&c, &a).await;
    // Held: nothing ran yet, no worker slot held.
    assert!(tool_results(&c.store.messages(&a).await.unwrap()).is_empty());
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{a}/approvals"),
            json!({"tool_call_id": call, "approve": true}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let row = c
        .wait_status(&a, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    assert!(row.result.as_deref().unwrap().contains("after:"), "{row:?}");
    let msgs = c.store.messages(&a).await.unwrap();
    let r = tool_results(&msgs);
    assert_eq!(r.len(), 1);
    assert!(!r[0].is_error, "{}", r[0].content);
    // A second decision is refused.
    let (st, _) = c
        .post(
            &format!("/v1/sessions/{a}/approvals"),
            json!({"tool_call_id": call, "approve": false}),
        )
        .await;
    assert!(st == 409 || st == 422, "{st}");

    // Deny: the model sees the denial with the reason.
    let d = c.submit("deny me", &["write_file"], sensitive).await;
    let call = held_call(&c, &d).await;
    let (st, _) = c
        .post(
            &format!("/v1/sessions/{d}/approvals"),
            json!({"tool_call_id": call, "approve": false, "reason": "not today"}),
        )
        .await;
    assert_eq!(st, 200);
    c.wait_status(&d, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    let msgs = c.store.messages(&d).await.unwrap();
    let r = tool_results(&msgs);
    assert!(r[0].is_error);
    assert!(
        r[0].content.contains("denied by approval: not today"),
        "{}",
        r[0].content
    );

    // Timeout: nobody answers within the approval timeout.
    let t = c
        .submit("time me out", &["write_file"], |s| {
            s.sensitive_tools = vec!["write_file".into()];
            s.approval_timeout_secs = 1;
        })
        .await;
    held_call(&c, &t).await;
    c.wait_status(&t, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    let msgs = c.store.messages(&t).await.unwrap();
    let r = tool_results(&msgs);
    assert!(
        r[0].content.contains("denied by approval: timeout"),
        "{}",
        r[0].content
    );
    // The streams say how each was decided.
    for (id, reason) in [(&d, "not today"), (&t, "timeout")] {
        let evs = c
            .events_until(id, |evs| evs.iter().any(|(e, _)| e == "session_completed"))
            .await;
        let decided: Vec<&Value> = evs
            .iter()
            .filter(|(e, _)| e == "approval_decided")
            .map(|(_, d)| d)
            .collect();
        assert_eq!(decided.len(), 1, "{evs:?}");
        assert_eq!(decided[0]["approved"], false);
        assert_eq!(decided[0]["reason"], reason);
    }

    // A call that is not held is refused, naming the field.
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{t}/approvals"),
            json!({"tool_call_id": "nope", "approve": true}),
        )
        .await;
    assert_eq!(st, 422);
    assert_eq!(body["error"]["field"], "tool_call_id");
    c.shutdown().await;
}

fn two_writes_script() -> Value {
    json!({"turns": [
        {"text": "writing both", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "a.txt", "content": "first"}},
            {"name": "list_dir", "arguments": {}},
            {"name": "write_file", "arguments": {"path": "b.txt", "content": "second"}}
        ]},
        {"text": "both written"}
    ]})
}

fn approval_requests(events: &[(String, Value)]) -> Vec<&Value> {
    events
        .iter()
        .filter(|(e, _)| e == "approval_requested")
        .map(|(_, d)| d)
        .collect()
}

/// The calls a session holds are found without guessing: `GET` lists them with their
/// arguments until each is decided, and the event stream announces each once, live and
/// on replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_approvals_are_listed_and_announced() {
    let tweak = |cfg: &mut WorkerSettings| {
        cfg.policy = policy_with(|p| p.tools.push("write_file".into()));
    };
    // No worker yet, so the session cannot have run when it is first looked at.
    let mut c = Cluster::start(two_writes_script(), 0, 4, tweak).await;
    let id = c
        .submit("write two files", &["write_file", "list_dir"], |s| {
            s.sensitive_tools = vec!["write_file".into()];
        })
        .await;
    // Before it runs, it holds nothing.
    let (st, view) = c.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(st, 200, "{view}");
    assert_eq!(view["pending_approvals"], json!([]));
    c.add_worker(&tweak).await;

    c.wait_status(
        &id,
        &[SessionStatus::AwaitingApproval],
        Duration::from_secs(30),
    )
    .await;
    let msgs = c.store.messages(&id).await.unwrap();
    let made = &msgs
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .unwrap()
        .tool_calls;
    let (w1, w2) = (made[0].id.clone(), made[2].id.clone());
    // The unheld call ran; the two writes wait.
    assert_eq!(tool_results(&msgs).len(), 1);
    let (_, view) = c.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(view["status"], "awaiting_approval");
    let pending = view["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 2, "{view}");
    assert_eq!(pending[0]["tool_call_id"], w1.as_str());
    assert_eq!(pending[0]["tool"], "write_file");
    assert_eq!(
        pending[0]["arguments"],
        json!({"path": "a.txt", "content": "first"})
    );
    assert_eq!(pending[1]["tool_call_id"], w2.as_str());
    assert_eq!(
        pending[1]["arguments"],
        json!({"path": "b.txt", "content": "second"})
    );
    let deadline = pending[0]["deadline"].as_str().unwrap();
    assert_eq!(pending[1]["deadline"], deadline);

    // The stream announces both (while the session waits, it stays open).
    let live = c
        .events_until(&id, |evs| approval_requests(evs).len() >= 2)
        .await;
    let asked = approval_requests(&live);
    let mut ids: Vec<&str> = asked.iter().map(|d| d["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let mut want = vec![w1.as_str(), w2.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want);
    let first = asked.iter().find(|d| d["id"] == w1.as_str()).unwrap();
    assert_eq!(first["name"], "write_file");
    assert_eq!(
        first["arguments"],
        json!({"path": "a.txt", "content": "first"})
    );

    // One decision: that call leaves the list at once, the other stays.
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{id}/approvals"),
            json!({"tool_call_id": w1, "approve": true}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let (_, view) = c.get(&format!("/v1/sessions/{id}")).await;
    let pending = view["pending_approvals"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{view}");
    assert_eq!(pending[0]["tool_call_id"], w2.as_str());
    // The approved write runs; the session waits again for the other.
    wait_until("w1 to run", Duration::from_secs(30), || async {
        let results = tool_results(&c.store.messages(&id).await.unwrap()).len();
        if results >= 2 { Ok(()) } else { Err(results) }
    })
    .await;
    c.wait_status(
        &id,
        &[SessionStatus::AwaitingApproval],
        Duration::from_secs(30),
    )
    .await;
    let (_, view) = c.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(view["pending_approvals"].as_array().unwrap().len(), 1);
    assert_eq!(view["pending_approvals"][0]["tool_call_id"], w2.as_str());

    let (st, _) = c
        .post(
            &format!("/v1/sessions/{id}/approvals"),
            json!({"tool_call_id": w2, "approve": true}),
        )
        .await;
    assert_eq!(st, 200);
    let row = c
        .wait_status(&id, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    assert_eq!(row.result.as_deref(), Some("both written"));
    let (_, view) = c.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(view["pending_approvals"], json!([]));
    let msgs = transcript(&c, &id).await;
    let results = tool_results(&msgs);
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| !r.is_error), "{results:?}");

    // A replay of the finished session still shows each request once: the runs that
    // resumed it neither dropped them as redone work nor announced them again.
    let replay = c
        .events_until(&id, |evs| evs.iter().any(|(e, _)| e == "session_completed"))
        .await;
    let asked = approval_requests(&replay);
    assert_eq!(asked.len(), 2, "{replay:?}");
    // And each decision once, as the run that acted on it found it, before its result.
    let decided: Vec<(&str, &Value)> = replay
        .iter()
        .filter(|(e, _)| e == "approval_decided")
        .map(|(_, d)| (d["id"].as_str().unwrap(), &d["approved"]))
        .collect();
    assert_eq!(
        decided,
        [(w1.as_str(), &json!(true)), (w2.as_str(), &json!(true))],
        "{replay:?}"
    );
    let position = |kind: &str, call: &str| {
        replay
            .iter()
            .position(|(e, d)| e == kind && d["id"] == call)
            .unwrap()
    };
    assert!(position("approval_decided", &w2) < position("tool_result", &w2));
    c.shutdown().await;
}

fn slow_loop_script() -> Value {
    // Three slow tool rounds, then an answer that echoes what it was told last.
    json!({"turns": [
        {"text": "step 1", "tool_calls": [{"name": "list_dir", "arguments": {}}], "delay_ms": 600},
        {"text": "step 2", "tool_calls": [{"name": "list_dir", "arguments": {}}], "delay_ms": 600},
        {"text": "step 3", "tool_calls": [{"name": "list_dir", "arguments": {}}], "delay_ms": 600},
        {"text": "done"},
        {"text": "follow-up answered"}
    ]})
}

/// A message that arrives while no worker runs the session (queued behind another) is in
/// its inbox when it is claimed: the run reads it although no wake signal reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_while_queued_is_injected_once() {
    let c = Cluster::start(slow_loop_script(), 1, 1, |_| {}).await;
    let busy = c
        .submit("keep the only slot busy", &["list_dir"], |_| {})
        .await;
    c.wait_status(&busy, &[SessionStatus::Running], Duration::from_secs(20))
        .await;
    let s = c.submit("wait your turn", &["list_dir"], |_| {}).await;
    // Delivered as the API does, but its wake signal lost (pub/sub is fire-and-forget):
    // only the row's `wake_seq` tells the run that something is there.
    c.store
        .deliver(
            &s,
            InboxKind::Message,
            "lost-signal",
            &InboxPayload::Steer(SteerMessage {
                content: "read this first".into(),
                strategy: Strategy::Inject,
            }),
            &[],
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.row(&s).await.status, SessionStatus::Queued);
    c.wait_status(&s, &[SessionStatus::Completed], Duration::from_secs(40))
        .await;
    let msgs = c.store.messages(&s).await.unwrap();
    let injected = msgs
        .iter()
        .filter(|m| m.role == Role::User && m.content == "read this first")
        .count();
    assert_eq!(injected, 1, "{msgs:#?}");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_inject_enqueue_interrupt_reject() {
    let c = Cluster::start(slow_loop_script(), 1, 4, |_| {}).await;

    // inject: the message joins the history at the next boundary; the loop goes on.
    let s = c.submit("inject into me", &["list_dir"], |_| {}).await;
    c.wait_status(&s, &[SessionStatus::Running], Duration::from_secs(20))
        .await;
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{s}/messages"),
            json!({"content": "also check X", "strategy": "inject"}),
        )
        .await;
    assert_eq!(st, 202, "{body}");
    c.wait_status(&s, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    let msgs = c.store.messages(&s).await.unwrap();
    let injected: Vec<&Message> = msgs
        .iter()
        .filter(|m| m.role == Role::User && m.content == "also check X")
        .collect();
    assert_eq!(injected.len(), 1, "{msgs:#?}");

    // reject: refused while it runs, nothing written.
    let s2 = c.submit("reject while busy", &["list_dir"], |_| {}).await;
    c.wait_status(&s2, &[SessionStatus::Running], Duration::from_secs(20))
        .await;
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{s2}/messages"),
            json!({"content": "hey", "strategy": "reject"}),
        )
        .await;
    assert_eq!(st, 409, "{body}");

    // enqueue: runs as a new turn once the session finishes.
    let (st, _) = c
        .post(
            &format!("/v1/sessions/{s2}/messages"),
            json!({"content": "then summarise", "strategy": "enqueue"}),
        )
        .await;
    assert_eq!(st, 202);
    let (row, msgs) = wait_until(
        "the enqueued turn to be answered",
        Duration::from_secs(40),
        || async {
            let msgs = c.store.messages(&s2).await.unwrap();
            let row = c.row(&s2).await;
            if row.status == SessionStatus::Completed
                && msgs
                    .iter()
                    .any(|m| m.role == Role::User && m.content == "then summarise")
            {
                Ok((row, msgs))
            } else {
                Err(row)
            }
        },
    )
    .await;
    assert_eq!(
        row.result.as_deref(),
        Some("follow-up answered"),
        "{msgs:#?}"
    );
    // The follow-up came after the first turn's answer.
    let done = msgs.iter().position(|m| m.content == "done").unwrap();
    let fu = msgs
        .iter()
        .position(|m| m.content == "then summarise")
        .unwrap();
    assert!(fu > done);

    // interrupt: the current turn stops; the new message is answered from the saved
    // history.
    let s3 = c.submit("interrupt me", &["list_dir"], |_| {}).await;
    c.wait_status(&s3, &[SessionStatus::Running], Duration::from_secs(20))
        .await;
    // Sent while the first turn's model call (600 ms) runs.
    c.events_until(&s3, |evs| evs.iter().any(|(e, _)| e == "iteration_started"))
        .await;
    let (st, _) = c
        .post(
            &format!("/v1/sessions/{s3}/messages"),
            json!({"content": "stop, do Y instead", "strategy": "interrupt"}),
        )
        .await;
    assert_eq!(st, 202);
    c.wait_status(&s3, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    let msgs = c.store.messages(&s3).await.unwrap();
    assert!(
        msgs.iter()
            .any(|m| m.role == Role::User && m.content == "stop, do Y instead")
    );
    // The interrupted LLM call produced nothing: fewer list_dir rounds than the script's
    // three, and the history stays paired.
    let calls: usize = msgs.iter().map(|m| m.tool_calls.len()).sum();
    assert_eq!(calls, tool_results(&msgs).len());

    // A finished session takes a message as a follow-up turn with its full history.
    let before = c.store.messages(&s).await.unwrap().len();
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{s}/messages"),
            json!({"content": "one more thing"}),
        )
        .await;
    assert_eq!(st, 202, "{body}");
    assert_eq!(body["delivery"], "follow_up");
    c.wait_status(&s, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    let msgs = c.store.messages(&s).await.unwrap();
    assert!(msgs.len() > before);
    assert_eq!(msgs[before].content, "one more thing");

    // Bad input names the field.
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{s}/messages"),
            json!({"content": "x", "strategy": "shout"}),
        )
        .await;
    assert_eq!(st, 422);
    assert_eq!(body["error"]["field"], "strategy");
    c.shutdown().await;
}
