//! MCP servers configured in `agentq.toml` and called by sessions on a worker with real
//! Postgres and Redis: `mcp-server-time` over stdio on the scripted provider, a tool of
//! a server the worker lacks, and the tenant's policy over MCP tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

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

/// The fault server (see `mcp/tests/fault_server.py`), logging its calls to `log`.
fn fault_server(log: &Path) -> agentq_core::config::McpServerSettings {
    let python = agentq_testkit::python::cache_dir().join("mcp/venv/bin/python3");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../mcp/tests/fault_server.py");
    Settings::from_toml(&format!(
        "[[mcp.servers]]\nname = \"fault\"\ncommand = {:?}\nargs = [{:?}, {:?}]\n\
         timeout_secs = 3\n",
        python.display().to_string(),
        script.display().to_string(),
        log.display().to_string(),
    ))
    .unwrap()
    .mcp
    .servers
    .remove(0)
}

fn calls_of(log: &Path, tool: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| m["method"] == "tools/call" && m["params"]["name"] == tool)
        .count()
}

/// A worker dies in the middle of an MCP call of `tool`; its replacement resumes the
/// session. What the model was told, and how many times the server saw the call.
async fn crash_mid_call(tool: &str) -> (Vec<String>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    let server = fault_server(&log);
    let name = format!("mcp__fault__{tool}");
    let script = serde_json::json!({"turns": [
        {"text": "calling", "tool_calls": [{"name": name, "arguments": {}}]},
        {"text": "result: {{last_tool_result}}"}
    ]});
    let tweak = move |cfg: &mut WorkerSettings| {
        cfg.mcp_servers = vec![server.clone()];
        let mut policy = agentq_core::config::PolicySection::default();
        policy.tools.push("mcp__fault__*".into());
        cfg.policy =
            std::sync::Arc::new(agentq_core::policy::Policy::from_section(&policy).unwrap());
    };
    let mut c = common::Cluster::start(script, 1, 1, &tweak).await;
    let id = c.submit("call it", &[name.as_str()], |_| {}).await;
    common::wait_until(
        format_args!("the call of {tool} reaching the server"),
        Duration::from_secs(60),
        || async { (calls_of(&log, tool) == 1).then_some(()) },
    )
    .await;
    c.crash_and_replace_with(0, &tweak).await;
    let rows = c
        .wait_terminal(std::slice::from_ref(&id), Duration::from_secs(60))
        .await;
    assert_eq!(
        rows[0].status,
        SessionStatus::Completed,
        "{:?}",
        rows[0].error
    );
    let results = tool_results(&c.store, &id).await;
    let calls = calls_of(&log, tool);
    c.shutdown().await;
    (results, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_mcp_call_cut_by_a_crash_is_run_once_more() {
    let (results, calls) = crash_mid_call("slow").await;
    assert_eq!(calls, 2, "re-run once: {results:?}");
    assert!(results[0].contains("did not answer"), "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsafe_mcp_call_cut_by_a_crash_is_never_run_twice() {
    let (results, calls) = crash_mid_call("hold").await;
    assert_eq!(calls, 1, "never run twice: {results:?}");
    assert!(results[0].contains("outcome unknown"), "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_hooks_decide_over_mcp_calls_like_any_other() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls");
    let server = fault_server(&log);
    let file = dir.path().join("agentq.toml");
    std::fs::write(
        &file,
        "[[hooks]]\non = \"pre_tool_use\"\ntools = [\"mcp__*\"]\n\
         command = [\"sh\", \"-c\", \"cat >/dev/null; printf '{\\\"behavior\\\":\\\"deny\\\",\\\"reason\\\":\\\"not that server\\\"}'\"]\n\
         [policy]\ntools = [\"read_file\", \"list_dir\", \"glob\", \"grep\", \"mcp__fault__*\"]\n",
    )
    .unwrap();
    let settings = Settings::load_with(Some(&file), |_| None).unwrap();
    let mut cfg = WorkerSettings::from_settings(&settings).unwrap();
    cfg.mcp_servers = vec![server];
    cfg.read_block = Duration::from_millis(200);
    cfg.workspace_root = dir.path().join("ws");
    cfg.default_provider = Some("scripted".into());
    cfg.providers.script = Some(
        r#"{"turns":[
  {"text":"echo","tool_calls":[{"name":"mcp__fault__echo","arguments":{"text":"hi"}}]},
  {"text":"result: {{last_tool_result}}"}
]}"#
        .into(),
    );
    let (row, _) = common::run_one(&store, &queue, cfg, spec(&["mcp__fault__echo"])).await;
    assert_eq!(row.status, SessionStatus::Completed, "{:?}", row.error);
    let results = tool_results(&store, &row.id).await;
    assert_eq!(
        results,
        vec!["Tool call denied by PreToolUse hook: not that server"]
    );
    assert_eq!(calls_of(&log, "echo"), 0, "the server never saw the call");
}
