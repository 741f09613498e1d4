//! The README's guide, run as written: every ```sh block after a `<!-- guide -->` line, in
//! order, as one bash script in an empty directory, with the `agentq` binary this build
//! made first on `PATH`. Only addresses are changed: the model's URL points at a fake
//! OpenAI-compatible server, the Postgres and Redis URLs at private ones, and the API and
//! metrics ports at free ones (so two runs of the suite do not fight over 7700).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use agentq_testkit::{FakeLlm, FakeResponse, RedisServer, shared_postgres};

use common::{clean, text, wait_exit};

/// The guide's blocks, in order.
fn guide_script(readme: &str) -> String {
    let mut script = String::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "<!-- guide -->" {
            continue;
        }
        assert_eq!(
            lines.next().map(str::trim),
            Some("```sh"),
            "a guide block is ```sh"
        );
        for l in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            script.push_str(l);
            script.push('\n');
        }
    }
    script
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let v = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {v}\n\n")
}

/// A streamed answer: `text`, or one call of `tool`.
fn answer(text: &str, tool: Option<(&str, Value)>) -> FakeResponse {
    let mut out = vec![chunk(json!({"role": "assistant", "content": text}), None)];
    if let Some((name, args)) = &tool {
        out.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_report", "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}}]}),
            None,
        ));
    }
    let finish = if tool.is_some() { "tool_calls" } else { "stop" };
    out.push(chunk(json!({}), Some(finish)));
    out.push(format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
               "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}})
    ));
    out.push("data: [DONE]\n\n".into());
    FakeResponse::sse(out.concat(), 256)
}

/// The model the guide talks to: it writes the report when asked to (once), and answers
/// everything else in a sentence.
fn model(body: &[u8]) -> FakeResponse {
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let after_tool = messages.last().is_some_and(|m| m["role"] == "tool");
    let asks_report = messages
        .iter()
        .any(|m| m["content"].to_string().contains("status report"));
    if asks_report && !after_tool {
        let args = json!({"path": "report.md", "content": "All printers work again.\n"});
        return answer("", Some(("write_file", args)));
    }
    answer("A printer jams on A3 paper.", None)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn logs(dir: &Path) -> String {
    let mut out = String::new();
    for name in ["dev.log", "scheduler.log", "worker1.log", "worker2.log"] {
        if let Ok(t) = std::fs::read_to_string(dir.join(name)) {
            out.push_str(&format!("--- {name}\n{t}\n"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_guide_works_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let mut script = guide_script(&readme);
    assert!(
        script.contains("agentq dev") && script.contains("agentq worker"),
        "{script}"
    );

    let fake = FakeLlm::start_stateless(Duration::from_millis(20), model)
        .await
        .unwrap();
    let db = shared_postgres().unwrap().fresh_database().unwrap();
    let redis = RedisServer::start().unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    for (from, to) in [
        ("http://localhost:8080/v1", format!("{}/v1", fake.url)),
        ("postgres://agentq@localhost:5432/agentq", db.clone()),
        ("redis://localhost:6379", redis.url()),
        ("localhost:7700", api.clone()),
        ("127.0.0.1:9465", "127.0.0.1:0".into()),
        ("127.0.0.1:9466", "127.0.0.1:0".into()),
    ] {
        assert!(script.contains(from), "the guide no longer names {from}");
        script = script.replace(from, &to);
    }

    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_agentq")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    clean(&mut cmd)
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("HOME", dir.path())
        .env("AGENTQ_API_ADDR", &api)
        .env("AGENTQ_API_URL", format!("http://{api}"))
        .env_remove("RUST_LOG")
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .env_remove("AGENTQ_ADMIN_KEY")
        .env_remove("AGENTQ_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: whatever the script left running goes with it.
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let pgid = child.id();
    let exit = tokio::task::block_in_place(|| wait_exit(&mut child, Duration::from_secs(300)));
    let _ = Command::new("kill")
        .args(["-9", "--", &format!("-{pgid}")])
        .status();
    let out = child.wait_with_output().unwrap();
    let report = format!(
        "exit {exit:?}\n--- stdout\n{}\n--- stderr\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr),
        logs(dir.path())
    );
    assert!(exit.is_some_and(|e| e.success()), "{report}");

    // What the guide says happens, happened.
    let stdout = text(&out.stdout);
    assert!(stdout.contains("key_set=true"), "{report}");
    assert!(stdout.contains("A printer jams on A3 paper."), "{report}");
    assert!(stdout.contains("All printers work again."), "{report}");
    // `ID<TAB>file` per session, then (under --wait) `ID<TAB>status<TAB>…` per session.
    for file in ["batch.tsv", "cluster.tsv"] {
        let out = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let ids: std::collections::BTreeSet<&str> =
            out.lines().filter_map(|l| l.split('\t').next()).collect();
        assert_eq!(ids.len(), 20, "{file}: {out}");
        let completed = out.lines().filter(|l| l.contains("\tcompleted\t")).count();
        assert_eq!(completed, 20, "{file}: {out}");
    }
    assert!(fake.request_count() >= 42, "{report}");
}
