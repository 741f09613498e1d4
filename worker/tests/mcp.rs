//! MCP servers configured in `agentq.toml` and called by sessions on a worker with real
//! Postgres and Redis: `mcp-server-time` over stdio on the scripted provider, a tool of
//! a server the worker lacks, and the tenant's policy over MCP tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use agentq_agent::schema::Role;
use agentq_agent::spec::SessionSpec;
use agentq_core::config::Settings;
use agentq_core::{SessionStatus, SessionStore};
use agentq_testkit::mcp::mcp_time_server;
use agentq_worker::WorkerSettings;

use common::setup;

/// The session asks for the time in Paris, then reports what the call came back with.
fn script(tool: &str) -> String {
    format!(
        r#"{{"turns":[
  {{"text":"asking","tool_calls":[{{"name":"{tool}","arguments":{{"timezone":"Europe/Paris"}}}}]}},
  {{"text":"result: {{{{last_tool_result}}}}"}}
]}}"#
    )
}

/// A worker whose `agentq.toml` declares the `time` server, under a policy of the
/// read-only tools (every session's default) and `tools`.
fn config(dir: &Path, tools: &str, script: String) -> WorkerSettings {
    let file = dir.join("agentq.toml");
    let toml = format!(
        "[[mcp.servers]]\nname = \"time\"\ncommand = {:?}\n\
         args = [\"--local-timezone\", \"UTC\"]\ntimeout_secs = 30\n\
         [policy]\ntools = [\"read_file\", \"list_dir\", \"glob\", \"grep\"{tools}]\n",
        mcp_time_server().display().to_string()
    );
    std::fs::write(&file, toml).unwrap();
    let settings = Settings::load_with(Some(&file), |_| None).unwrap();
    let mut cfg = WorkerSettings::from_settings(&settings).unwrap();
    cfg.read_block = Duration::from_millis(200);
    cfg.workspace_root = dir.join("ws");
    cfg.default_provider = Some("scripted".into());
    cfg.providers.script = Some(script);
    cfg
}

fn spec(tools: &[&str]) -> SessionSpec {
    let mut spec = SessionSpec::new("what time is it in Paris?");
    spec.tools = Some(tools.iter().map(|t| t.to_string()).collect());
    spec
}

async fn tool_results(store: &agentq_core::pg::PgStore, id: &str) -> Vec<String> {
    store
        .messages(id)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_calls_mcp_server_time_through_the_worker() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        r#", "mcp__time__*""#,
        script("mcp__time__get_current_time"),
    );
    // Asked for by glob, as a tenant would ask for the whole server.
    let (row, _) = common::run_one(&store, &queue, cfg, spec(&["mcp__time__*"])).await;
    assert_eq!(row.status, SessionStatus::Completed, "{:?}", row.error);
    let results = tool_results(&store, &row.id).await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].contains("Europe/Paris") && results[0].contains("datetime"),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_of_a_server_the_worker_lacks_is_an_error_the_session_survives() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        r#", "mcp__*""#,
        script("mcp__tickets__close_ticket"),
    );
    let consumer = cfg.consumer.clone();
    let (row, _) =
        common::run_one(&store, &queue, cfg, spec(&["mcp__tickets__close_ticket"])).await;
    assert_eq!(row.status, SessionStatus::Completed, "{:?}", row.error);
    let results = tool_results(&store, &row.id).await;
    assert!(
        results[0].contains("`tickets`") && results[0].contains(&consumer),
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_whose_policy_does_not_allow_the_server_cannot_use_it() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "", script("mcp__time__get_current_time"));
    let (row, _) = common::run_one(&store, &queue, cfg, spec(&["mcp__time__*"])).await;
    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    let error = row.error.unwrap_or_default();
    assert!(error.contains("mcp__time__*"), "{error}");
    assert!(tool_results(&store, &row.id).await.is_empty());
}
