#![allow(clippy::unwrap_used, clippy::expect_used)]
//! MCP servers as tools, against real servers: the fault server (`fault_server.py`, one
//! misbehaviour per tool), `mcp-server-time` and `server-everything` over stdio, and a
//! streamable-HTTP server in process. Each test waits on events (a server's state, a
//! call's answer, what the server logged), never on the clock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_agent::tools::{
    LocalWorkspace, SideEffect, Tool, ToolContext, ToolOutput, ToolSettings,
};
use agentq_mcp::{McpServers, ServerStatus};
use agentq_testkit::mcp::{mcp_everything_server, mcp_time_server};
use agentq_types::config::{McpServerSettings, Secret, Settings};

/// Long enough for a real process to start on a loaded machine; a bound, not a wait.
const BOUND: Duration = Duration::from_secs(60);

fn server_settings(toml: &str) -> McpServerSettings {
    Settings::from_toml(&format!("[[mcp.servers]]\n{toml}"))
        .unwrap()
        .mcp
        .servers
        .remove(0)
}

/// The fault server, logging what it receives to `log`.
fn fault(log: &Path, extra: &str) -> McpServerSettings {
    let python = agentq_testkit::python::cache_dir().join("mcp/venv/bin/python3");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fault_server.py");
    let timeout = if extra.contains("timeout_secs") {
        ""
    } else {
        "timeout_secs = 5\n"
    };
    server_settings(&format!(
        "name = \"fault\"\ncommand = {:?}\nargs = [{:?}, {:?}]\n{timeout}{extra}",
        python.display().to_string(),
        script.display().to_string(),
        log.display().to_string(),
    ))
}

struct Running {
    servers: McpServers,
    cancel: CancellationToken,
    ctx: ToolContext,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(settings: Vec<McpServerSettings>, net: ToolSettings) -> Running {
        let cancel = CancellationToken::new();
        let servers = McpServers::start(&settings, &net, "worker-test", &cancel);
        servers.settled(BOUND).await;
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext {
            session_id: "s".into(),
            tool_call_id: "c".into(),
            idempotency_key: "s:c".into(),
            workspace: Arc::new(LocalWorkspace::new(dir.path()).unwrap()),
            settings: Arc::new(net),
            cancel: CancellationToken::new(),
        };
        Running {
            servers,
            cancel,
            ctx,
            _dir: dir,
        }
    }

    fn tool(&self, name: &str) -> Arc<dyn Tool> {
        let picked = self.servers.select(&[name.to_string()]);
        picked
            .registry
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("no tool {name}: {:?}", picked.registry.names()))
    }

    /// One call as the driver makes it (an `Err` is shown to the model as its text).
    async fn call(&self, name: &str, args: Value) -> ToolOutput {
        match self.tool(name).call(args, &self.ctx).await {
            Ok(out) => out,
            Err(e) => ToolOutput::error(format!("Error: {e}")),
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(BOUND, self.servers.stopped())
            .await
            .expect("the servers stop within a bound");
    }
}

fn logged(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn calls_of(log: &Path, tool: &str) -> usize {
    logged(log)
        .iter()
        .filter(|m| m["method"] == "tools/call" && m["params"]["name"] == tool)
        .count()
}

/// Make round trips (each an event the server answers) until `seen` holds of its log.
async fn until_logged(r: &Running, log: &Path, seen: impl Fn(&[Value]) -> bool) {
    for _ in 0..500 {
        if seen(&logged(log)) {
            return;
        }
        r.call("mcp__fault__echo", json!({"text": "tick"})).await;
    }
    panic!("never logged: {:?}", logged(log));
}

#[tokio::test]
async fn a_stdio_server_sees_only_the_variables_listed() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut s = fault(&log, "env = [\"AGENTQ_MCP_VISIBLE\"]");
    // As the environment layer reads it from the worker's environment.
    s.env_values
        .insert("AGENTQ_MCP_VISIBLE".into(), Secret::new("yes"));
    let r = Running::start(vec![s], ToolSettings::default()).await;
    let out = r.call("mcp__fault__env", json!({})).await;
    assert!(!out.is_error, "{}", out.content);
    let env: serde_json::Map<String, Value> = serde_json::from_str(&out.content).unwrap();
    assert_eq!(env["AGENTQ_MCP_VISIBLE"], "yes");
    // The worker's own environment (PATH, HOME, any key or AGENTQ_ setting it holds)
    // stays behind; Python may add its locale coercion and nothing else.
    for (k, _) in std::env::vars() {
        assert!(!env.contains_key(&k), "the server sees the worker's {k}");
    }
    let others: Vec<&String> = env
        .keys()
        .filter(|k| *k != "AGENTQ_MCP_VISIBLE" && *k != "LC_CTYPE")
        .collect();
    assert!(others.is_empty(), "unlisted variables: {others:?}");
    r.stop().await;
}

#[tokio::test]
async fn arguments_are_held_to_the_schema_before_the_server_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![fault(&log, "")], ToolSettings::default()).await;
    let out = r.call("mcp__fault__echo", json!({"text": "hello"})).await;
    assert_eq!((out.is_error, out.content.as_str()), (false, "hello"));
    for (args, says) in [
        (json!({"text": 5}), "arguments.text must be of type"),
        (json!({}), "arguments.text is required"),
        (
            json!({"text": "a", "rm": true}),
            "arguments.rm is not a known argument",
        ),
        (json!({"text": "a".repeat(101)}), "at most 100 characters"),
        (json!(["text"]), "must be an object"),
    ] {
        let out = r.call("mcp__fault__echo", args.clone()).await;
        assert!(
            out.is_error && out.content.contains(says),
            "{args}: {}",
            out.content
        );
    }
    assert_eq!(
        calls_of(&log, "echo"),
        1,
        "a refused call never reaches the server"
    );
    r.stop().await;
}

#[tokio::test]
async fn side_effects_and_approvals_follow_the_annotations_unless_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let s = fault(
        &log,
        "destructive_sensitive = true\n[mcp.servers.tools.crash]\nside_effect = \"idempotent\"\n\
         [mcp.servers.tools.echo]\nsensitive = true\n",
    );
    let r = Running::start(vec![s], ToolSettings::default()).await;
    let picked = r.servers.select(&["mcp__fault__*".to_string()]);
    let effect = |t: &str| {
        picked
            .registry
            .get(&format!("mcp__fault__{t}"))
            .unwrap()
            .side_effect(&json!({}))
    };
    assert_eq!(effect("echo"), SideEffect::Pure);
    assert_eq!(effect("slow"), SideEffect::Idempotent);
    assert_eq!(effect("liar"), SideEffect::Unsafe);
    assert_eq!(
        effect("crash"),
        SideEffect::Idempotent,
        "the operator's word wins"
    );
    // The description and the schema reach the model as the server wrote them.
    let spec = picked.registry.get("mcp__fault__big").unwrap().spec();
    assert_eq!(spec.description, "Answer `bytes` bytes of text.");
    assert_eq!(spec.parameters["required"], json!(["bytes"]));
    let mut sensitive = picked.sensitive.clone();
    sensitive.sort();
    // Marked destructive (or not read-only, which the protocol presumes destructive),
    // and echo by the operator's word.
    for t in [
        "mcp__fault__delete_all",
        "mcp__fault__echo",
        "mcp__fault__liar",
    ] {
        assert!(sensitive.iter().any(|s| s == t), "{t} not in {sensitive:?}");
    }
    assert!(
        !sensitive.iter().any(|s| s == "mcp__fault__big"),
        "{sensitive:?}"
    );
    r.stop().await;
}

#[tokio::test]
async fn a_server_that_crashes_mid_call_fails_the_call_naming_it_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![fault(&log, "")], ToolSettings::default()).await;
    let out = r.call("mcp__fault__crash", json!({})).await;
    assert!(
        out.is_error && out.content.contains("`fault`"),
        "{}",
        out.content
    );
    let server = r.servers.get("fault").unwrap();
    assert!(server.up(BOUND).await, "restarted: {:?}", server.status());
    let out = r.call("mcp__fault__echo", json!({"text": "back"})).await;
    assert_eq!(out.content, "back");
    r.stop().await;
}

#[tokio::test]
async fn a_server_that_hangs_times_the_call_out_and_is_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(
        vec![fault(&log, "timeout_secs = 1")],
        ToolSettings::default(),
    )
    .await;
    let out = r.call("mcp__fault__hang", json!({})).await;
    assert!(
        out.is_error
            && out
                .content
                .contains("`fault` did not answer `hang` within 1s"),
        "{}",
        out.content
    );
    // The ping after the timeout goes unanswered: the server is restarted.
    let server = r.servers.get("fault").unwrap();
    let mut states = Vec::new();
    for _ in 0..100 {
        let out = r.call("mcp__fault__echo", json!({"text": "back"})).await;
        if !out.is_error {
            break;
        }
        states.push(out.content);
        server.up(BOUND).await;
    }
    let out = r.call("mcp__fault__echo", json!({"text": "back"})).await;
    assert_eq!(out.content, "back", "{states:?}");
    assert!(
        logged(&log)
            .iter()
            .filter(|m| m["method"] == "initialize")
            .count()
            >= 2,
        "restarted"
    );
    r.stop().await;
}

#[tokio::test]
async fn a_result_past_the_bound_fails_the_call_without_being_held() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let s = fault(&log, "max_result_bytes = 1048576");
    let r = Running::start(vec![s], ToolSettings::default()).await;
    let out = r
        .call("mcp__fault__big", json!({"bytes": 50 * 1024 * 1024}))
        .await;
    assert!(
        out.is_error && out.content.contains("max_result_bytes"),
        "{}",
        &out.content[..out.content.len().min(300)]
    );
    // Within the bound is fine, once the server is back.
    assert!(r.servers.get("fault").unwrap().up(BOUND).await);
    let out = r.call("mcp__fault__big", json!({"bytes": 1000})).await;
    assert_eq!(out.content.len(), 1000, "{}", out.content);
    r.stop().await;
}

#[tokio::test]
async fn a_schema_that_lies_and_an_answer_that_is_garbage_are_tool_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(
        vec![fault(&log, "timeout_secs = 2")],
        ToolSettings::default(),
    )
    .await;
    let out = r.call("mcp__fault__liar", json!({"n": 2})).await;
    assert!(
        out.is_error && out.content.contains("refused the call: n must be odd"),
        "{}",
        out.content
    );
    let out = r.call("mcp__fault__garbage", json!({})).await;
    assert!(out.is_error, "{}", out.content);
    let out = r
        .call("mcp__fault__echo", json!({"text": "still here"}))
        .await;
    assert_eq!(out.content, "still here");
    r.stop().await;
}

#[tokio::test]
async fn a_changed_tool_list_is_listed_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![fault(&log, "")], ToolSettings::default()).await;
    assert!(
        r.servers
            .select(&["mcp__fault__added".into()])
            .registry
            .get("mcp__fault__added")
            .is_some()
    );
    let out = r.call("mcp__fault__added", json!({})).await;
    assert!(
        out.is_error && out.content.contains("does not offer"),
        "{}",
        out.content
    );
    let out = r.call("mcp__fault__grow", json!({})).await;
    assert_eq!(out.content, "grown");
    assert!(r.servers.get("fault").unwrap().lists("added", BOUND).await);
    let picked = r.servers.select(&["mcp__fault__*".into()]);
    assert!(picked.registry.get("mcp__fault__added").is_some());
    let out = r.call("mcp__fault__added", json!({})).await;
    assert_eq!(out.content, "added ran");
    r.stop().await;
}

#[tokio::test]
async fn a_cancelled_call_tells_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(
        vec![fault(&log, "timeout_secs = 600")],
        ToolSettings::default(),
    )
    .await;
    let tool = r.tool("mcp__fault__slow");
    let ctx = r.ctx.clone();
    let cancel = CancellationToken::new();
    let call_ctx = ToolContext {
        cancel: cancel.clone(),
        ..ctx
    };
    let running = tokio::spawn(async move { tool.call(json!({}), &call_ctx).await });
    until_logged(&r, &log, |l| {
        l.iter()
            .any(|m| m["method"] == "tools/call" && m["params"]["name"] == "slow")
    })
    .await;
    cancel.cancel();
    let out = running.await.unwrap().unwrap();
    assert!(
        out.is_error && out.content.contains("cancelled"),
        "{}",
        out.content
    );
    until_logged(&r, &log, |l| {
        let id = l
            .iter()
            .find(|m| m["params"]["name"] == "slow")
            .map(|m| m["id"].clone());
        l.iter().any(|m| {
            m["method"] == "notifications/cancelled"
                && Some(&m["params"]["requestId"]) == id.as_ref()
        })
    })
    .await;
    r.stop().await;
}

#[tokio::test]
async fn a_tool_of_a_server_this_worker_lacks_fails_naming_the_server_and_worker() {
    let r = Running::start(Vec::new(), ToolSettings::default()).await;
    let out = r.call("mcp__tickets__close", json!({})).await;
    assert!(
        out.is_error && out.content.contains("`tickets`") && out.content.contains("`worker-test`"),
        "{}",
        out.content
    );
    assert!(
        r.servers
            .select(&["mcp__tickets__*".into()])
            .registry
            .is_empty()
    );
    r.stop().await;
}

#[tokio::test]
async fn mcp_server_time_tells_the_time() {
    let s = server_settings(&format!(
        "name = \"time\"\ncommand = {:?}\nargs = [\"--local-timezone\", \"UTC\"]\n",
        mcp_time_server().display().to_string()
    ));
    let r = Running::start(vec![s], ToolSettings::default()).await;
    let out = r
        .call(
            "mcp__time__get_current_time",
            json!({"timezone": "Europe/Paris"}),
        )
        .await;
    assert!(
        !out.is_error && out.content.contains("Europe/Paris"),
        "{}",
        out.content
    );
    let out = r.call("mcp__time__get_current_time", json!({})).await;
    assert!(
        out.is_error && out.content.contains("timezone"),
        "{}",
        out.content
    );
    r.stop().await;
}

#[tokio::test]
async fn server_everything_echoes() {
    let s = server_settings(&format!(
        "name = \"everything\"\ncommand = {:?}\nenv = [\"PATH\"]\n",
        mcp_everything_server().display().to_string()
    ));
    let mut s = s;
    // `node` is found on the worker's PATH, which the operator listed.
    s.env_values
        .insert("PATH".into(), Secret::new(std::env::var("PATH").unwrap()));
    let r = Running::start(vec![s], ToolSettings::default()).await;
    let out = r
        .call("mcp__everything__echo", json!({"message": "hi there"}))
        .await;
    assert!(
        !out.is_error && out.content.contains("hi there"),
        "{}",
        out.content
    );
    r.stop().await;
}

/// A streamable-HTTP MCP server in process: `echo`, answered as JSON or (for
/// `sse = true`) as an event stream, behind a bearer token; `/moved` redirects.
async fn http_server() -> std::net::SocketAddr {
    async fn mcp(headers: HeaderMap, body: String) -> Response {
        if headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            != Some("Bearer t0k")
        {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        let msg: Value = serde_json::from_str(&body).unwrap();
        let Some(id) = msg.get("id").cloned() else {
            return StatusCode::ACCEPTED.into_response();
        };
        let result = match msg["method"].as_str().unwrap_or("") {
            "initialize" => json!({
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "http", "version": "1"}
            }),
            "tools/list" => json!({"tools": [{
                "name": "echo",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}, "sse": {"type": "boolean"}}},
                "annotations": {"readOnlyHint": true}
            }]}),
            "tools/call" => {
                json!({"content": [{"type": "text", "text": msg["params"]["arguments"]["text"]}]})
            }
            _ => json!({}),
        };
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        if msg["params"]["arguments"]["stall"] == true {
            // A slow loris: an event stream that starts, then never says anything more.
            use futures::StreamExt;
            let first = futures::stream::once(async { Ok::<_, std::io::Error>(": hi\n") });
            let body = axum::body::Body::from_stream(first.chain(futures::stream::pending()));
            return ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
        }
        if msg["params"]["arguments"]["sse"] == true {
            let body = format!("event: message\ndata: {reply}\n\n");
            ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
        } else {
            ([(header::CONTENT_TYPE, "application/json")], reply).into_response()
        }
    }
    async fn moved() -> Response {
        (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, "http://169.254.169.254/")],
        )
            .into_response()
    }
    let app = Router::new()
        .route("/mcp", axum::routing::post(mcp))
        .route("/moved", axum::routing::post(moved));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn http_settings(addr: std::net::SocketAddr, path: &str) -> McpServerSettings {
    let mut s = server_settings(&format!(
        "name = \"remote\"\nurl = \"http://{addr}{path}\"\n\
         headers = {{ Authorization = \"REMOTE_TOKEN\" }}\ntimeout_secs = 5\n"
    ));
    s.header_values
        .insert("Authorization".into(), Secret::new("Bearer t0k"));
    s
}

fn loopback_allowed() -> ToolSettings {
    ToolSettings {
        allowed_hosts: vec!["127.0.0.1".into()],
        ..ToolSettings::default()
    }
}

#[tokio::test]
async fn an_http_server_answers_as_json_and_as_an_event_stream() {
    let addr = http_server().await;
    let r = Running::start(vec![http_settings(addr, "/mcp")], loopback_allowed()).await;
    let out = r.call("mcp__remote__echo", json!({"text": "plain"})).await;
    assert_eq!((out.is_error, out.content.as_str()), (false, "plain"));
    let out = r
        .call(
            "mcp__remote__echo",
            json!({"text": "streamed", "sse": true}),
        )
        .await;
    assert_eq!((out.is_error, out.content.as_str()), (false, "streamed"));
    r.stop().await;
}

#[tokio::test]
async fn an_http_server_on_a_private_address_is_refused_unless_the_operator_allows_it() {
    let addr = http_server().await;
    let r = Running::start(vec![http_settings(addr, "/mcp")], ToolSettings::default()).await;
    let status = r.servers.get("remote").unwrap().status();
    let ServerStatus::Down(why) = status else {
        panic!("reached a loopback server: {status:?}");
    };
    assert!(
        why.contains("127.0.0.1") && why.contains("loopback"),
        "{why}"
    );
    let out = r.call("mcp__remote__echo", json!({"text": "x"})).await;
    assert!(
        out.is_error && out.content.contains("`remote`"),
        "{}",
        out.content
    );
    r.stop().await;
}

#[tokio::test]
async fn an_http_server_that_redirects_is_not_followed() {
    let addr = http_server().await;
    let r = Running::start(vec![http_settings(addr, "/moved")], loopback_allowed()).await;
    let status = r.servers.get("remote").unwrap().status();
    let ServerStatus::Down(why) = status else {
        panic!("followed a redirect: {status:?}");
    };
    assert!(why.contains("redirects are not followed"), "{why}");
    r.stop().await;
}

#[tokio::test]
async fn an_http_answer_past_the_bound_fails() {
    let addr = http_server().await;
    let mut s = http_settings(addr, "/mcp");
    s.max_result_bytes = 1024;
    let r = Running::start(vec![s], loopback_allowed()).await;
    let out = r
        .call("mcp__remote__echo", json!({"text": "y".repeat(4096)}))
        .await;
    assert!(
        out.is_error && out.content.contains("max_result_bytes"),
        "{}",
        out.content
    );
    let out = r
        .call(
            "mcp__remote__echo",
            json!({"text": "y".repeat(4096), "sse": true}),
        )
        .await;
    assert!(
        out.is_error && out.content.contains("max_result_bytes"),
        "{}",
        out.content
    );
    r.stop().await;
}

// --- A hostile server: what it says is an attacker's, and every bound holds ---

/// The hostile server in `mode` (see `hostile_server.py`), logging what it receives.
fn hostile(log: &Path, mode: &str, extra: &str) -> McpServerSettings {
    let python = agentq_testkit::python::cache_dir().join("mcp/venv/bin/python3");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile_server.py");
    server_settings(&format!(
        "name = \"hostile\"\ncommand = {:?}\nargs = [{:?}, {:?}, {mode:?}]\ntimeout_secs = 30\n{extra}",
        python.display().to_string(),
        script.display().to_string(),
        log.display().to_string(),
    ))
}

#[tokio::test]
async fn a_tool_list_without_end_is_cut_at_the_page_bound() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![hostile(&log, "pages", "")], ToolSettings::default()).await;
    let server = r.servers.get("hostile").unwrap();
    // Without the bound the listing runs until the timeout and the server is down.
    assert_eq!(server.status(), ServerStatus::Up);
    assert_eq!(server.tools().len(), agentq_mcp::MAX_PAGES);
    let pages = logged(&log)
        .iter()
        .filter(|m| m["method"] == "tools/list")
        .count();
    assert_eq!(pages, agentq_mcp::MAX_PAGES);
    r.stop().await;
}

#[tokio::test]
async fn a_hundred_thousand_tools_are_cut_to_the_tool_bound() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let settings = hostile(&log, "many", "max_result_bytes = 67108864\n");
    let r = Running::start(vec![settings], ToolSettings::default()).await;
    let server = r.servers.get("hostile").unwrap();
    assert_eq!(server.status(), ServerStatus::Up);
    assert_eq!(server.tools().len(), agentq_mcp::MAX_TOOLS);
    let picked = r.servers.select(&["mcp__hostile__*".to_string()]);
    assert_eq!(picked.registry.names().len(), agentq_mcp::MAX_TOOLS);
    r.stop().await;
}

#[tokio::test]
async fn tool_names_a_provider_would_refuse_are_left_out_and_a_twin_is_listed_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![hostile(&log, "names", "")], ToolSettings::default()).await;
    let mut names = r
        .servers
        .select(&["mcp__hostile__*".to_string()])
        .registry
        .names();
    names.sort();
    assert_eq!(
        names,
        [
            "mcp__hostile__also-good_1",
            "mcp__hostile__dup",
            "mcp__hostile__fat",
            "mcp__hostile__good"
        ]
    );
    // A description past the bound is cut (on a character); a schema past it leaves
    // the tool out: both would go to the model with every request.
    let fat = r.tool("mcp__hostile__fat");
    assert!(
        fat.description().len() <= agentq_mcp::MAX_DESCRIPTION_BYTES
            && fat.description().starts_with('\u{e9}'),
        "{}",
        fat.description().len()
    );
    for n in &names {
        assert!(n.len() <= agentq_mcp::MAX_TOOL_NAME, "{n}");
    }
    // A bad name asked for exactly is not offered by the server: its calls say so.
    let picked = r.servers.select(&["mcp__hostile__spaced name".to_string()]);
    if let Some(t) = picked.registry.get("mcp__hostile__spaced name") {
        let out = t.call(json!({}), &r.ctx).await.unwrap();
        assert!(
            out.is_error && out.content.contains("does not offer"),
            "{out:?}"
        );
    }
    assert!(
        !logged(&log).iter().any(|m| m["method"] == "tools/call"),
        "a refused name never reaches the server"
    );
    r.stop().await;
}

#[tokio::test]
async fn a_server_gets_no_llm_call_no_human_and_no_roots() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![hostile(&log, "asks", "")], ToolSettings::default()).await;
    // The client offered none of them.
    let init = logged(&log)
        .into_iter()
        .find(|m| m["method"] == "initialize")
        .unwrap();
    let caps = &init["params"]["capabilities"];
    for cap in ["sampling", "elicitation", "roots"] {
        assert!(caps.get(cap).is_none(), "{cap} offered: {caps}");
    }
    let out = r.call("mcp__hostile__ask", json!({})).await;
    assert!(!out.is_error, "{out:?}");
    let got: Value = serde_json::from_str(&out.content).unwrap();
    for id in ["s1", "s2", "s3"] {
        assert_eq!(got[id]["code"], json!(-32601), "{id}: {got}");
    }
    assert!(
        got["s1"]["message"].as_str().unwrap().contains("sampling"),
        "{got}"
    );
    r.stop().await;
}

#[tokio::test]
async fn a_flood_of_notifications_a_stray_answer_and_bytes_not_utf8_do_not_take_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let r = Running::start(vec![hostile(&log, "asks", "")], ToolSettings::default()).await;
    let out = r.call("mcp__hostile__flood", json!({})).await;
    // Either the answer, or a tool error naming the server: never a hang or a panic.
    assert!(
        out.content == "flooded" || (out.is_error && out.content.contains("hostile")),
        "{out:?}"
    );
    r.stop().await;
}

#[test]
fn a_wide_schema_against_long_arguments_is_checked_within_a_bound() {
    use agentq_mcp::schema::check;
    // Each item fits only the last of 1,500 shapes (a schema under the 64 KiB kept), and
    // the last item fits none: unbounded, 30,000 items cost 45 million visits before the
    // misfit is found, holding the worker's thread for seconds.
    let mut shapes: Vec<Value> = (0..1499)
        .map(|i| json!({"type": "string", "minLength": 100_000 + i}))
        .collect();
    shapes.push(json!({"type": "string"}));
    let schema = json!({"type": "object", "properties": {
        "xs": {"type": "array", "items": {"anyOf": shapes}}}});
    assert!(serde_json::to_vec(&schema).unwrap().len() <= agentq_mcp::MAX_SCHEMA_BYTES);
    let schema = schema.as_object().unwrap();
    let items = |n: usize| {
        let mut xs = vec![json!("a"); n];
        xs.push(json!(5));
        json!({"xs": xs})
    };
    // Within the bound the misfit is found and named.
    let e = check(&items(10), schema).unwrap_err();
    assert!(e.contains("arguments.xs[10]") && e.contains("anyOf"), "{e}");
    // Past it the check gives up and leaves the server to judge.
    assert_eq!(check(&items(30_000), schema), Ok(()));
}

#[tokio::test]
async fn an_http_answer_that_never_ends_times_the_call_out_and_the_server_serves_again() {
    let addr = http_server().await;
    let r = Running::start(vec![http_settings(addr, "/mcp")], loopback_allowed()).await;
    let out = r
        .call("mcp__remote__echo", json!({"text": "x", "stall": true}))
        .await;
    assert!(
        out.is_error && out.content.contains("`remote`") && out.content.contains("within 5s"),
        "{out:?}"
    );
    // The stalled stream does not hold the connection: calls are answered again, on it
    // or on the connection that replaced it.
    let mut answered = None;
    for _ in 0..20 {
        let server = r.servers.get("remote").unwrap();
        assert!(server.up(BOUND).await, "{:?}", server.status());
        let out = r.call("mcp__remote__echo", json!({"text": "after"})).await;
        if !out.is_error {
            answered = Some(out.content);
            break;
        }
    }
    assert_eq!(answered.as_deref(), Some("after"));
    r.stop().await;
}
