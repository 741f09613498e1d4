//! `shell` tried as a prompt-injected model would: its own environment is cleared, so it
//! reads its parent's instead (`/proc/$PPID/environ`, the worker that holds the provider
//! keys and the database URL). A real `agentq dev` with a canary key in its environment runs
//! that command; the transcript must not show the canary. When the test runs as root it
//! runs `agentq dev` as `nobody` (root reads any process's memory; the worker's own user is
//! what a deployment runs as).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use common::{Dev, clean, wait_finished};

const CANARY: &str = "sk-canary-parent-environ-9f3b";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn shell_cannot_read_the_workers_environment() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir(root.join("ws")).unwrap();
    for p in [root.to_path_buf(), root.join("ws")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let config = root.join("agentq.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nshell_enabled = true\nworkspace_root = {:?}\n\n\
             [policy]\ntools = [\"read_file\", \"list_dir\", \"glob\", \"grep\", \"spawn_agent\", \"shell\"]\n",
            root.join("ws").display().to_string()
        ),
    )
    .unwrap();
    let script = root.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "Looking.", "tool_calls": [{"name": "shell", "arguments": {"command":
                "echo ppid=$PPID; tr '\\000' '\\n' < /proc/$PPID/environ; echo; \
                 for p in /proc/[0-9]*; do tr '\\000' '\\n' < $p/environ; done 2>/dev/null; echo end"}}]},
            {"text": "Done."},
        ]})
        .to_string(),
    )
    .unwrap();
    let mut cmd = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_agentq"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_agentq"))
    };
    let dev = Dev::spawn(
        clean(&mut cmd)
            .current_dir(root)
            .env("OPENAI_API_KEY", CANARY)
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(root.join("dev.db"))
            .arg("--config")
            .arg(&config)
            .arg("--script")
            .arg(&script),
    );
    let url = dev.url.clone();

    let http = reqwest::Client::new();
    let v: Value = http
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"prompt": "env", "provider": "scripted", "tools": ["shell"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = v["id"].as_str().expect("created").to_string();
    let v = wait_finished(&http, &url, &id, Duration::from_secs(60)).await;
    assert_eq!(v["status"], "completed", "{v}");
    let transcript = http
        .get(format!("{url}/v1/sessions/{id}/messages"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    drop(dev);
    assert!(
        transcript.contains("ppid=") && transcript.contains("end"),
        "the shell did not run: {transcript}"
    );
    assert!(
        !transcript.contains(CANARY),
        "the worker's key leaked through /proc: {transcript}"
    );
}
