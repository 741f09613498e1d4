//! A person approves a held call with edited arguments, end to end on a real scheduler,
//! workers, Postgres and Redis (only the model is scripted): the call runs with the
//! person's arguments, the transcript keeps the model's call and the arguments it ran
//! with (marked as edited), and edited arguments get no further than a model's would —
//! a path outside the workspace is refused by the tool's own rules.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::schema::{Message, Role};
use agentq_agent::spec::SessionSpec;
use agentq_core::{SessionStatus, SessionStore};

use common::Cluster;

/// One write, held for a human, then the answer with what the write came back with.
fn script() -> Value {
    json!({"turns": [
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "out.txt", "content": "hello"}}]},
        {"text": "after: {{last_tool_result}}"}
    ]})
}

fn policy() -> Arc<agentq_core::policy::Policy> {
    let mut section = agentq_core::config::PolicySection::default();
    section.tools.push("write_file".into());
    Arc::new(agentq_core::policy::Policy::from_section(&section).unwrap())
}

fn sensitive(s: &mut SessionSpec) {
    s.sensitive_tools = vec!["write_file".into()];
}

/// The id of the call session `id` holds, once it holds one.
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

fn tool_result(msgs: &[Message]) -> &Message {
    msgs.iter().find(|m| m.role == Role::Tool).unwrap()
}

async fn files(c: &Cluster, id: &str) -> Vec<String> {
    let (st, v) = c.get(&format!("/v1/sessions/{id}/files")).await;
    assert_eq!(st, 200, "{v}");
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_with_edited_arguments_runs_them_and_says_so() {
    let c = Cluster::start(script(), 1, 4, |cfg| cfg.policy = policy()).await;
    let id = c.submit("write it", &["write_file"], sensitive).await;
    let call = held_call(&c, &id).await;

    // The cross-session listing shows the held call as the model made it.
    let (st, page) = c.get(&format!("/v1/approvals?session_id={id}")).await;
    assert_eq!(st, 200, "{page}");
    let held = &page["approvals"][0];
    assert_eq!(held["tool_call_id"], call.as_str(), "{page}");
    assert_eq!(held["tool"], "write_file");
    assert_eq!(
        held["arguments"],
        json!({"path": "out.txt", "content": "hello"})
    );
    assert!(held["deadline"].is_string(), "{page}");

    let edited = json!({"path": "edited.txt", "content": "from a person"});
    let (st, body) = c
        .post(
            &format!("/v1/sessions/{id}/approvals"),
            json!({"tool_call_id": call, "approve": true, "arguments": edited}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let row = c
        .wait_status(&id, &[SessionStatus::Completed], Duration::from_secs(30))
        .await;
    assert!(row.result.as_deref().unwrap().contains("after:"), "{row:?}");

    // It ran with the person's arguments, not the model's.
    assert_eq!(files(&c, &id).await, ["edited.txt"]);
    let (st, content) = c.get(&format!("/v1/sessions/{id}/files/edited.txt")).await;
    assert!(st == 200, "{st} {content}");

    // The transcript: the model's call as it was, its result marked as edited with the
    // arguments it ran with.
    let (st, v) = c.get(&format!("/v1/sessions/{id}/messages")).await;
    assert_eq!(st, 200, "{v}");
    let msgs: Vec<Message> = serde_json::from_value(v["messages"].clone()).unwrap();
    let asked = msgs.iter().find(|m| !m.tool_calls.is_empty()).unwrap();
    assert_eq!(
        asked.tool_calls[0].arguments,
        json!({"path": "out.txt", "content": "hello"})
    );
    let result = tool_result(&msgs);
    assert!(!result.is_error, "{}", result.content);
    assert_eq!(
        result.edited_arguments.as_ref(),
        Some(&edited.clone().into())
    );
    assert!(
        result
            .content
            .starts_with(agentq_agent::driver::EDITED_NOTE),
        "{}",
        result.content
    );
    // Nothing is held any more.
    let (_, page) = c.get("/v1/approvals").await;
    assert_eq!(page["approvals"], json!([]), "{page}");
}

/// A person with the approve scope cannot reach what the model could not: edited
/// arguments naming a path outside the workspace are refused by the tool's path rules,
/// and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edited_arguments_pass_the_same_checks_as_the_models() {
    let c = Cluster::start(script(), 1, 4, |cfg| cfg.policy = policy()).await;
    for (i, path) in ["../escaped.txt", "/tmp/agentq-approval-escape.txt"]
        .into_iter()
        .enumerate()
    {
        let id = c
            .submit(&format!("write it {i}"), &["write_file"], sensitive)
            .await;
        let call = held_call(&c, &id).await;
        let (st, body) = c
            .post(
                &format!("/v1/sessions/{id}/approvals"),
                json!({"tool_call_id": call, "approve": true,
                       "arguments": {"path": path, "content": "escaped"}}),
            )
            .await;
        assert_eq!(st, 200, "{body}");
        c.wait_status(&id, &[SessionStatus::Completed], Duration::from_secs(30))
            .await;
        let msgs = c.store.messages(&id).await.unwrap();
        let result = tool_result(&msgs);
        assert!(result.is_error, "{path}: {}", result.content);
        assert_eq!(
            result.edited_arguments.as_ref().unwrap().value()["path"],
            path,
            "the refusal is recorded against the edit"
        );
        assert!(files(&c, &id).await.is_empty(), "{path}");
    }
    assert!(!std::path::Path::new("/tmp/agentq-approval-escape.txt").exists());
}
