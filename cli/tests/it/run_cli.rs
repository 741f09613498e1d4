//! `agentq run` end to end: the real binary against a local server speaking the OpenAI and
//! Anthropic streaming wire formats.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use agentq_testkit::{FakeLlm, FakeResponse};
use serde_json::Value;

fn agentq() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agentq"))
}

fn openai_chunk(delta: Value, finish: Option<&str>) -> String {
    let v = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    });
    format!("data: {v}\n\n")
}

fn openai_tool_turn() -> String {
    let mut s = String::new();
    s += &openai_chunk(
        serde_json::json!({"role": "assistant", "content": "Looking."}),
        None,
    );
    s += &openai_chunk(
        serde_json::json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "list_dir", "arguments": ""}}]}),
        None,
    );
    s += &openai_chunk(
        serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]}),
        None,
    );
    s += &openai_chunk(
        serde_json::json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":"}}]}),
        None,
    );
    s += &openai_chunk(
        serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "th\": \".\"}"}}]}),
        None,
    );
    s += &openai_chunk(
        serde_json::json!({"tool_calls": [{"index": 1, "function": {"arguments": " \"notes.txt\"}"}}]}),
        None,
    );
    s += &openai_chunk(serde_json::json!({}), Some("tool_calls"));
    s += "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":20,\"total_tokens\":70}}\n\n";
    s += "data: [DONE]\n\n";
    s
}

fn openai_text_turn(text: &str) -> String {
    let mut s = openai_chunk(
        serde_json::json!({"role": "assistant", "content": text}),
        None,
    );
    s += &openai_chunk(serde_json::json!({}), Some("stop"));
    s += "data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":90,\"completion_tokens\":8,\"total_tokens\":98}}\n\n";
    s += "data: [DONE]\n\n";
    s
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "remember the milk\n").unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_session_with_parallel_tools_end_to_end() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(openai_tool_turn(), 11));
    fake.push(FakeResponse::sse(openai_text_turn("You need milk."), 5));
    let ws = workspace();
    let url = format!("{}/v1", fake.url);
    let out = tokio::task::spawn_blocking(move || {
        agentq()
            .args([
                "run",
                "--provider",
                "openai",
                "--model",
                "gpt-test",
                "--base-url",
                &url,
            ])
            .arg("--workspace")
            .arg(ws.path())
            .arg("What should I buy?")
            .env("OPENAI_API_KEY", "sk-test")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("You need milk."), "{stdout}");
    assert!(
        stderr.contains("list_dir") && stderr.contains("read_file"),
        "{stderr}"
    );

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert_eq!(reqs[0].header("authorization"), Some("Bearer sk-test"));
    let body = &reqs[0].body;
    assert_eq!(body["temperature"], 0.1);
    assert_eq!(body["max_tokens"], 8192);
    assert_eq!(body["stream_options"]["include_usage"], true);
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, vec!["glob", "grep", "list_dir", "read_file"]);
    // Second request: system, user, assistant with both calls, then both results in order.
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, vec!["system", "user", "assistant", "tool", "tool"]);
    let calls = msgs[2]["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["id"], "call_a");
    assert_eq!(
        calls[0]["function"]["arguments"].as_str().unwrap(),
        "{\"path\":\".\"}"
    );
    assert_eq!(calls[1]["id"], "call_b");
    assert_eq!(msgs[3]["tool_call_id"], "call_a");
    assert!(msgs[3]["content"].as_str().unwrap().contains("notes.txt"));
    assert_eq!(msgs[4]["tool_call_id"], "call_b");
    assert!(
        msgs[4]["content"]
            .as_str()
            .unwrap()
            .contains("remember the milk")
    );
}

fn anthropic_event(v: Value) -> String {
    format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_session_with_parallel_tools_and_json_events() {
    use serde_json::json;
    let fake = FakeLlm::start().await.unwrap();
    let mut t1 = String::new();
    t1 += &anthropic_event(
        json!({"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "usage": {"input_tokens": 40, "output_tokens": 1}}}),
    );
    t1 += &anthropic_event(
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {}}}),
    );
    t1 += &anthropic_event(
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"path\""}}),
    );
    t1 += &anthropic_event(
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ": \".\"}"}}),
    );
    t1 += &anthropic_event(json!({"type": "content_block_stop", "index": 0}));
    t1 += &anthropic_event(
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {}}}),
    );
    t1 += &anthropic_event(
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"path\": \"notes.txt\"}"}}),
    );
    t1 += &anthropic_event(json!({"type": "content_block_stop", "index": 1}));
    t1 += &anthropic_event(
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 30}}),
    );
    t1 += &anthropic_event(json!({"type": "message_stop"}));
    let mut t2 = String::new();
    t2 += &anthropic_event(
        json!({"type": "message_start", "message": {"id": "m2", "type": "message", "role": "assistant", "model": "claude-test", "content": [], "usage": {"input_tokens": 90, "output_tokens": 1}}}),
    );
    t2 += &anthropic_event(
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    t2 += &anthropic_event(
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Buy milk."}}),
    );
    t2 += &anthropic_event(json!({"type": "content_block_stop", "index": 0}));
    t2 += &anthropic_event(
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
    );
    t2 += &anthropic_event(json!({"type": "message_stop"}));
    fake.push(FakeResponse::sse(t1, 9));
    fake.push(FakeResponse::sse(t2, 9));
    let ws = workspace();
    let url = fake.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        agentq()
            .args([
                "run",
                "--provider",
                "anthropic",
                "--model",
                "claude-test",
                "--json",
                "--base-url",
                &url,
            ])
            .arg("--workspace")
            .arg(ws.path())
            .arg("What should I buy?")
            .env("ANTHROPIC_API_KEY", "ak-test")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "session_completed");
    assert_eq!(last["finish_reason"], "stop");
    assert_eq!(last["result"], "Buy milk.");
    assert_eq!(last["usage"]["input_tokens"], 130);
    assert_eq!(last["usage"]["output_tokens"], 34);
    let reqs = fake.requests();
    assert_eq!(reqs[1].header("x-api-key"), Some("ak-test"));
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    let results = msgs[2]["content"].as_array().unwrap();
    assert_eq!(results[0]["tool_use_id"], "toolu_1");
    assert_eq!(results[1]["tool_use_id"], "toolu_2");
}

#[test]
fn bad_flags_and_unreachable_endpoints_give_one_clear_line() {
    let out = agentq()
        .args(["run", "--mode", "fly", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mode"));

    let out = agentq()
        .args(["run", "--tools", "read_file,teleport", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tools") && err.contains("teleport"), "{err}");

    // The web search is the provider's own: one that cannot run it is refused, naming
    // the flag, before any call.
    let out = agentq()
        .args([
            "run",
            "--provider",
            "scripted",
            "--tools",
            "read_file,web_search",
            "x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tools") && err.contains("`web_search`") && err.contains("scripted"),
        "{err}"
    );

    let out = agentq()
        .args([
            "run",
            "--provider",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "hi",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap();
    assert!(
        last.contains("error") && last.contains("127.0.0.1:9"),
        "{err}"
    );
}

/// The scripted model, asked for (it is no default: see
/// `without_a_model_run_says_how_to_configure_one`), needs no service.
#[test]
fn the_scripted_model_runs_with_no_services() {
    let ws = workspace();
    let out = agentq()
        .args(["run", "--provider", "scripted"])
        .arg("--workspace")
        .arg(ws.path())
        .arg("what is here?")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("notes.txt"));
}

/// `agentq run --provider openai` against `fake`, in `ws`.
async fn run_openai(fake: &FakeLlm, ws: &tempfile::TempDir) -> std::process::Output {
    let url = format!("{}/v1", fake.url);
    let dir = ws.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        agentq()
            .args([
                "run",
                "--provider",
                "openai",
                "--base-url",
                &url,
                "--workspace",
            ])
            .arg(&dir)
            .arg("hi")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Seed 001's retry policy through the real OpenAI provider and HTTP: a 429 with
/// `Retry-After`, a 500 and a stream cut mid-way are retried (at most twice each call);
/// a 400 is not.
#[tokio::test(flavor = "multi_thread")]
async fn retries_over_http_and_gives_up_on_client_errors() {
    let ws = workspace();
    let fake = FakeLlm::start().await.unwrap();
    fake.push(
        FakeResponse::json(
            429,
            r#"{"error":{"message":"slow down","type":"rate_limit_exceeded"}}"#,
        )
        .with_header("retry-after", "1"),
    );
    fake.push(FakeResponse::json(
        500,
        r#"{"error":{"message":"boom","type":"server_error"}}"#,
    ));
    fake.push(FakeResponse::sse(openai_text_turn("made it"), 7));
    let started = std::time::Instant::now();
    let out = run_openai(&fake, &ws).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("made it"));
    assert_eq!(fake.request_count(), 3);
    // The 429's Retry-After (1 s) was waited for (the base delay would be shorter).
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));

    // A stream cut mid-way is retried too.
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(openai_text_turn("lost"), 7).cut_after(3));
    fake.push(FakeResponse::sse(openai_text_turn("second try"), 7));
    let out = run_openai(&fake, &ws).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fake.request_count(), 2);

    // A 400 ends the session at once, with the provider's message.
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::json(
        400,
        r#"{"error":{"message":"Unsupported parameter: 'max_tokens'","type":"invalid_request_error"}}"#,
    ));
    let out = run_openai(&fake, &ws).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Unsupported parameter"));
    assert_eq!(fake.request_count(), 1);
}

/// `agentq run --config` runs the session with the file's hooks, as a worker would.
#[test]
fn run_applies_the_configured_hooks() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        r#"{"turns":[
          {"text":"writing","tool_calls":[{"name":"write_file","arguments":{"path":"out.txt","content":"x"}}]},
          {"text":"result: {{last_tool_result}}"}
        ]}"#,
    )
    .unwrap();
    let config = dir.path().join("agentq.toml");
    std::fs::write(
        &config,
        r#"
[[hooks]]
on = "pre_tool_use"
command = ["sh", "-c", "cat >/dev/null; printf '{\"behavior\":\"deny\",\"reason\":\"not from the CLI\"}'"]
"#,
    )
    .unwrap();
    let out = agentq()
        .args([
            "run",
            "--provider",
            "scripted",
            "--tools",
            "write_file",
            "--json",
        ])
        .arg("--script")
        .arg(&script)
        .arg("--workspace")
        .arg(&ws)
        .arg("--config")
        .arg(&config)
        .arg("write a file")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("result: Tool call denied by PreToolUse hook: not from the CLI"),
        "{stdout}"
    );
    assert!(!ws.join("out.txt").exists(), "the denied call ran");

    // A configuration that cannot be used is refused, naming the flag and the setting.
    std::fs::write(
        &config,
        "[[hooks]]\non = \"pre_tool_use\"\nurl = \"ftp://x/\"\n",
    )
    .unwrap();
    let out = agentq()
        .args(["run", "--provider", "scripted"])
        .arg("--config")
        .arg(&config)
        .arg("hi")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--config") && stderr.contains("hooks[0].url"),
        "{stderr}"
    );
}

/// Without a provider named or configured, `run` says how to configure one instead of
/// answering from a script; the scripted model is there when asked for.
#[test]
fn without_a_model_run_says_how_to_configure_one() {
    let no_model = |args: &[&str]| {
        agentq()
            .args(args)
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_BASE_URL")
            .output()
            .unwrap()
    };
    let out = no_model(&["run", "hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no model configured")
            && err.contains("OPENAI_API_KEY")
            && err.contains("--provider"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = no_model(&["run", "--provider", "scripted", "--tools", "list_dir", "hi"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
