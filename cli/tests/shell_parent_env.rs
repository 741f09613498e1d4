//! `shell` tried as a prompt-injected model would: its own environment is cleared, so it
//! reads its parent's instead (`/proc/$PPID/environ`, the worker that holds the provider
//! keys and the database URL). A real `agentq dev` with a canary key in its environment runs
//! that command; the transcript must not show the canary. When the test runs as root it
//! runs `agentq dev` as `nobody` (root reads any process's memory; the worker's own user is
//! what a deployment runs as).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

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
    for k in [
        "AGENTQ_DATABASE_URL",
        "AGENTQ_REDIS_URL",
        "AGENTQ_API_URL",
        "AGENTQ_API_ADDR",
        "AGENTQ_CONFIG",
        "AGENTQ_DB",
        "AGENTQ_SCRIPT",
        "AGENTQ_ADMIN_KEY",
    ] {
        cmd.env_remove(k);
    }
    let mut child = cmd
        .current_dir(root)
        .env("OPENAI_API_KEY", CANARY)
        .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
        .arg(root.join("dev.db"))
        .arg("--config")
        .arg(&config)
        .arg("--script")
        .arg(&script)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    let url = loop {
        assert!(Instant::now() < deadline, "dev did not start: {seen}");
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("dev exited: {seen}");
        }
        if let Some(i) = line.find("listening on ") {
            break line[i + "listening on ".len()..].trim().to_string();
        }
        seen.push_str(&line);
    };
    let _drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });

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
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v: Value = http
            .get(format!("{url}/v1/sessions/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if matches!(
            v["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            assert_eq!(v["status"], "completed", "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "not finished: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let transcript = http
        .get(format!("{url}/v1/sessions/{id}/messages"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        transcript.contains("ppid=") && transcript.contains("end"),
        "the shell did not run: {transcript}"
    );
    assert!(
        !transcript.contains(CANARY),
        "the worker's key leaked through /proc: {transcript}"
    );
}
