//! Finding and deciding a held tool call with the real `agentq` binary: a scheduler and a
//! worker (the scripted provider) on the test kit's Postgres and Redis; `status` names
//! the held call and the commands that decide it, `approve` decides it, `watch` shows the
//! request and how to answer it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::{Output, Stdio};
use std::time::Duration;

use agentq_testkit::RedisServer;
use serde_json::{Value, json};

use common::{Procs, agentq, client_as, migrated_db, poll_until, text, wait_line};

/// The operator allows the write this test holds (the default policy allows reads only).
const ALLOWED_TOOLS: &str = "read_file,list_dir,glob,grep,write_file";

/// The scheduler's operator key, which the client commands use too.
const ADMIN_KEY: &str = "approvals-cli-admin-key-0123456789abcdef";

fn client(api: &str, args: &[&str]) -> Output {
    client_as(api, Some(ADMIN_KEY), args)
}

fn status(api: &str, id: &str) -> (Value, String) {
    let out = client(api, &["status", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        text(&out.stderr),
    )
}

#[test]
fn status_names_the_held_call_and_watch_shows_the_request() {
    let db = migrated_db();
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "writing", "tool_calls": [{"id": "call_w1", "name": "write_file",
                "arguments": {"path": "out.txt", "content": "hello from the test"}}]},
            {"text": "written"}
        ]})
        .to_string(),
    )
    .unwrap();

    let mut procs = Procs(Vec::new());
    let mut scheduler = agentq()
        .args(["scheduler", "--addr", "127.0.0.1:0"])
        .env("AGENTQ_DATABASE_URL", &db)
        .env("AGENTQ_REDIS_URL", redis.url())
        .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
        .env("AGENTQ_ADMIN_KEY", ADMIN_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (line, _drain) = wait_line(scheduler.stderr.take().unwrap(), "listening on ");
    procs.0.push(scheduler);
    let api = line
        .trim()
        .rsplit("listening on ")
        .next()
        .unwrap()
        .to_string();
    let worker = agentq()
        .arg("worker")
        .args(["--database-url", &db])
        .args(["--redis-url", &redis.url()])
        .args(["--default-provider", "scripted"])
        .arg("--script")
        .arg(&script)
        .arg("--workspace-root")
        .arg(dir.path().join("ws"))
        .env("AGENTQ_METRICS_ADDR", "127.0.0.1:0")
        .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(worker);

    let batch = dir.path().join("batch.jsonl");
    std::fs::write(
        &batch,
        format!(
            "{}\n",
            json!({"prompt": "write the file", "tools": ["write_file"],
                   "sensitive_tools": ["write_file"]})
        ),
    )
    .unwrap();
    let out = client(&api, &["submit", "--file", batch.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 36, "{id}");

    let (view, hints) = poll_until("the call to be held", Duration::from_secs(60), || {
        let (view, hints) = status(&api, &id);
        if view["status"] == "awaiting_approval" {
            Ok((view, hints))
        } else {
            Err(view)
        }
    });
    // stdout stays the JSON view, with the held call in it.
    assert_eq!(view["pending_approvals"][0]["tool_call_id"], "call_w1");
    assert_eq!(view["pending_approvals"][0]["tool"], "write_file");
    // stderr says which call waits, with what, and the exact commands.
    assert!(hints.contains("1 tool call(s) await approval"), "{hints}");
    assert!(
        hints.contains(r#"call_w1 write_file({"content":"hello from the test","path":"out.txt"})"#),
        "{hints}"
    );
    assert!(
        hints.contains(&format!("agentq approve {id} call_w1")),
        "{hints}"
    );
    assert!(
        hints.contains(&format!("agentq deny {id} call_w1")),
        "{hints}"
    );

    let out = client(&api, &["approve", &id, "call_w1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // `watch` replays the session to its end, the request among its events.
    let out = client(&api, &["watch", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains(&format!(
            "⏸ write_file({{\"content\":\"hello from the test\",\"path\":\"out.txt\"}}) \
             awaits approval, call call_w1: agentq approve {id} call_w1"
        )),
        "{shown}"
    );
    assert!(
        shown.contains("▶ write_file call call_w1 approved"),
        "{shown}"
    );
    assert!(shown.contains("← write_file"), "{shown}");
    assert_eq!(
        std::fs::read_to_string(
            dir.path()
                .join("ws")
                .read_dir()
                .unwrap()
                .map(|e| e.unwrap().path())
                // The workspace root also holds the trees' local indexes.
                .find(|p| p.file_name().is_some_and(|n| n != ".index"))
                .unwrap()
                .join("out.txt")
        )
        .unwrap(),
        "hello from the test"
    );

    // Decided and done: nothing is held, nothing is printed about it.
    let (view, hints) = status(&api, &id);
    assert_eq!(view["status"], "completed");
    assert_eq!(view["pending_approvals"], json!([]));
    assert!(!hints.contains("await approval"), "{hints}");
}
