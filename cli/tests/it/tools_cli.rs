//! The operator's own tools in a real `agentq dev`, through a model at the HTTP level:
//! skills from the configured folders, offered as `load_skill` to sessions whose policy
//! allows it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use agentq_testkit::{FakeLlm, FakeResponse};
use serde_json::{Value, json};

use common::{Dev, agentq, create_session, wait_finished};

/// One streamed OpenAI answer: `delta`s in order, then the finish reason and usage.
fn turn(deltas: &[Value], finish: &str) -> FakeResponse {
    let mut lines = String::new();
    for d in deltas {
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": d, "finish_reason": null}]});
        lines.push_str(&format!("{chunk}\n"));
    }
    let end = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}});
    lines.push_str(&format!("{end}\n"));
    FakeResponse::sse(FakeResponse::openai_jsonl(&lines), 64)
}

fn write(dir: &Path, rel: &str, text: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A skill folder configured for `agentq dev`, a session whose model loads the skill and
/// then answers: the model saw the skill in the tool list, and its instructions came back
/// as the tool's result. A tenant policy without `load_skill` refuses the tool at submit.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_loads_a_configured_skill() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "skills/summarise/SKILL.md",
        "---\nname: summarise\ndescription: Summarise a ticket in three lines.\n---\nWrite what, why and next.\n",
    );
    write(d, "skills/summarise/template.md", "1. what\n");
    write(
        d,
        "agentq.toml",
        &format!(
            "[worker]\nskills_dirs = [{:?}]\ndefault_tools = [\"read_file\"]\n\n\
             [policy]\ntools = [\"read_file\", \"load_skill\"]\n",
            d.join("skills").display().to_string()
        ),
    );
    let fake = FakeLlm::start().await.unwrap();
    fake.push(turn(
        &[
            json!({"role": "assistant", "content": ""}),
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "load_skill", "arguments": "{\"name\": \"summarise\"}"}}]}),
        ],
        "tool_calls",
    ));
    fake.push(turn(
        &[json!({"role": "assistant", "content": "Done."})],
        "stop",
    ));
    let dev = Dev::spawn(
        agentq()
            .current_dir(d)
            .env("OPENAI_API_KEY", "sk-skills")
            .env("OPENAI_BASE_URL", format!("{}/v1", fake.url))
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(d.join("dev.db"))
            .arg("--workspace-root")
            .arg(d.join("ws"))
            .arg("--config")
            .arg(d.join("agentq.toml")),
    );
    let http = reqwest::Client::new();
    let (status, body) = create_session(
        &http,
        &dev.url,
        json!({"prompt": "Summarise the ticket", "tools": ["load_skill"]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap();
    let done = wait_finished(&http, &dev.url, id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "completed", "{done}");

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    let tools = reqs[0].body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{tools:?}");
    assert_eq!(tools[0]["function"]["name"], "load_skill");
    let described = tools[0]["function"]["description"].as_str().unwrap();
    assert!(
        described.contains("- summarise: Summarise a ticket in three lines."),
        "{described}"
    );
    let sent = reqs[1].body["messages"].to_string();
    assert!(sent.contains("Write what, why and next."), "{sent}");
    assert!(sent.contains("- template.md"), "{sent}");

    // A tool the policy does not allow is refused at submit, naming the field.
    let (status, body) = create_session(
        &http,
        &dev.url,
        json!({"prompt": "x", "tools": ["load_skill", "write_file"]}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "tools[1]", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`write_file`"),
        "{body}"
    );
}

/// A skill folder that cannot be read stops the start, naming the setting.
#[test]
fn a_broken_skill_stops_the_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "skills/bad/SKILL.md", "no front matter\n");
    write(
        d,
        "agentq.toml",
        &format!(
            "[worker]\nskills_dirs = [{:?}]\n",
            d.join("skills").display().to_string()
        ),
    );
    let out = agentq()
        .current_dir(d)
        .args(["dev", "--addr", "127.0.0.1:0", "--db"])
        .arg(d.join("dev.db"))
        .arg("--config")
        .arg(d.join("agentq.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("worker.skills_dirs") && err.contains("bad/SKILL.md"),
        "{err}"
    );
}

/// The README's "Your own tools" configuration, as written: its ```toml block after the
/// `<!-- tools-config -->` line.
fn readme_tools_config() -> String {
    let readme = std::fs::read_to_string(agentq_testkit::repo_root().join("README.md")).unwrap();
    let after = readme
        .split_once("<!-- tools-config -->")
        .expect("README.md has a <!-- tools-config --> block")
        .1;
    let block = after.split_once("```toml\n").unwrap().1;
    block.split_once("```").unwrap().0.to_string()
}

/// `text` with `from` replaced by `to`, which must be there: a README that no longer
/// says what this test substitutes fails here rather than testing something else.
fn substitute(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in:\n{text}");
    text.replace(from, to)
}

/// `server-everything` serving streamable HTTP on a free port, up to its ready line.
fn everything_over_http() -> (common::Procs, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(agentq_testkit::mcp::mcp_everything_server())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let procs = common::Procs(vec![child]);
    let (_line, _drain) = common::wait_line(stderr, "listening on port");
    (procs, port)
}

/// The README's configuration of one stdio and one HTTP server, with only the addresses
/// and paths made local: `agentq dev` starts both real servers (mcp-server-time over stdio,
/// server-everything over streamable HTTP), offers their tools with the servers' own
/// schemas, and a session's calls reach them and come back to the model.
#[tokio::test(flavor = "multi_thread")]
async fn the_readme_tools_configuration_runs_in_dev_against_real_servers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "skills/summarise/SKILL.md",
        "---\nname: summarise\ndescription: Summarise a ticket.\n---\nWrite what and why.\n",
    );
    let (_http_server, port) = everything_over_http();
    let time = agentq_testkit::mcp::mcp_time_server();
    let mut config = readme_tools_config();
    config = substitute(
        &config,
        "\"/etc/agentq/skills\"",
        &format!("{:?}", d.join("skills").display().to_string()),
    );
    config = substitute(
        &config,
        "command = \"mcp-server-time\"",
        &format!("command = {:?}", time.display().to_string()),
    );
    config = substitute(
        &config,
        "\"https://mcp.example.internal/mcp\"",
        &format!("\"http://127.0.0.1:{port}/mcp\""),
    );
    config = substitute(
        &config,
        "allowed_hosts = [\"mcp.example.internal\"]",
        &format!("allowed_hosts = [\"127.0.0.1:{port}\"]"),
    );
    write(d, "agentq.toml", &config);

    let fake = FakeLlm::start().await.unwrap();
    fake.push(turn(
        &[
            json!({"role": "assistant", "content": ""}),
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                "function": {"name": "mcp__time__get_current_time",
                    "arguments": "{\"timezone\": \"Asia/Tokyo\"}"}}]}),
            json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                "function": {"name": "mcp__tickets__echo",
                    "arguments": "{\"message\": \"ticket 42\"}"}}]}),
        ],
        "tool_calls",
    ));
    fake.push(turn(
        &[json!({"role": "assistant", "content": "Done."})],
        "stop",
    ));
    let dev = Dev::spawn(
        agentq()
            .current_dir(d)
            .env("OPENAI_API_KEY", "sk-tools")
            .env("OPENAI_BASE_URL", format!("{}/v1", fake.url))
            .env("TICKETS_MCP_TOKEN", "Bearer tickets-token")
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(d.join("dev.db"))
            .arg("--workspace-root")
            .arg(d.join("ws"))
            .arg("--config")
            .arg(d.join("agentq.toml")),
    );
    let http = reqwest::Client::new();
    let (status, body) = create_session(
        &http,
        &dev.url,
        json!({"prompt": "What time is it in Tokyo? Then echo ticket 42.",
            "tools": ["mcp__time__get_current_time", "mcp__tickets__echo", "load_skill"]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap();
    let done = wait_finished(&http, &dev.url, id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "completed", "{done}");

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    let offered: Vec<&Value> = reqs[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["function"])
        .collect();
    let mut names: Vec<&str> = offered
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "load_skill",
            "mcp__tickets__echo",
            "mcp__time__get_current_time"
        ],
        "{offered:?}"
    );
    let schema = |name: &str| {
        let f = offered.iter().find(|f| f["name"] == name).unwrap();
        f["parameters"]["properties"].clone()
    };
    // Each server's own schema, as it lists it.
    assert!(schema("mcp__time__get_current_time")["timezone"].is_object());
    assert!(schema("mcp__tickets__echo")["message"].is_object());
    // The servers' answers, as the model was given them.
    let sent = reqs[1].body["messages"].to_string();
    assert!(
        sent.contains("Asia/Tokyo") && sent.contains("datetime"),
        "{sent}"
    );
    assert!(sent.contains("Echo: ticket 42"), "{sent}");
}
