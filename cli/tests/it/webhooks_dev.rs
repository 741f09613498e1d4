//! Webhooks survive a crash of the process that delivers them: `agentq dev` (the binary,
//! on its embedded SQLite store) finishes a session, its first delivery attempt is
//! answered 500, and the process is SIGKILLed with the delivery still pending. Started
//! again on the same file, it delivers: the receiver (verifying with the `standardwebhooks`
//! package) gets the event after a timeout and a success, every attempt with the one id.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{Value, json};

use common::{Dev, agentq, wait_session, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

fn start_dev(db: &Path, config: &Path, script: &Path) -> Dev {
    Dev::spawn(
        agentq()
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(db)
            .arg("--config")
            .arg(config)
            .arg("--script")
            .arg(script),
    )
}

struct Receiver(Child);

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn log(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("log.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_delivery_is_sent_after_a_sigkill_and_restart() {
    let python = agentq_testkit::python::webhooks_python().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("receiver");
    std::fs::create_dir_all(&hooks).unwrap();
    let _receiver = Receiver(
        Command::new(python)
            .arg(agentq_testkit::repo_root().join("scheduler/tests/webhook_receiver.py"))
            .arg(&hooks)
            .spawn()
            .unwrap(),
    );
    let port_file = hooks.join("port");
    let port: u16 = wait_until("the receiver's port", LIMIT, || {
        let f = port_file.clone();
        async move { std::fs::read_to_string(f).ok().and_then(|p| p.parse().ok()) }
    })
    .await;

    let db = dir.path().join("dev.db");
    let cfg = dir.path().join("agentq.toml");
    std::fs::write(
        &cfg,
        format!(
            "[worker]\nworkspace_root = {:?}\n\n[webhooks]\nallowed_hosts = [\"127.0.0.1:{port}\"]\n\
             timeout_secs = 2\npoll_interval_ms = 50\n",
            dir.path().join("ws").display().to_string()
        ),
    )
    .unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [{"text": "done", "delay_ms": 10}]}).to_string(),
    )
    .unwrap();

    let http = reqwest::Client::new();
    let mut dev = start_dev(&db, &cfg, &script);
    let resp = http
        .post(format!("{}/v1/webhooks", dev.url))
        .json(&json!({"url": format!("http://127.0.0.1:{port}/script"),
                      "events": ["session.completed"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let hook: Value = resp.json().await.unwrap();
    std::fs::write(
        hooks.join("secrets.json"),
        json!({"/script": [hook["secret"]]}).to_string(),
    )
    .unwrap();

    let resp = http
        .post(format!("{}/v1/sessions", dev.url))
        .json(&json!({"prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_session(&http, &dev.url, &id, LIMIT, |v| v["status"] == "completed").await;

    // The first attempt is refused (500); the process dies with the delivery pending.
    wait_until("the first attempt", LIMIT, || {
        let n = log(&hooks).len();
        async move { n >= 1 }
    })
    .await;
    dev.child.kill().unwrap();
    dev.child.wait().unwrap();
    drop(dev);
    assert_eq!(log(&hooks).len(), 1, "{:?}", log(&hooks));

    // Started again: the retry hangs (the timeout ends it), the next one is accepted.
    let dev = start_dev(&db, &cfg, &script);
    let entries = wait_until("the delivery after the restart", LIMIT, || {
        let entries = log(&hooks);
        async move {
            entries
                .iter()
                .any(|e| e["status"] == 200)
                .then_some(entries)
        }
    })
    .await;
    let first = &entries[0];
    assert_eq!(first["status"], 500);
    for e in &entries {
        assert_eq!(
            e["id"], first["id"],
            "one id for every attempt: {entries:?}"
        );
        assert_eq!(e["verified"], json!([true]), "{e}");
        assert_eq!(e["body"]["type"], "session.completed");
        assert_eq!(e["body"]["data"]["session_id"], id.as_str());
    }
    let hook_id = hook["id"].as_str().unwrap();
    // The receiver logs an attempt before it answers, and the process counts the answer
    // once it has read it (or, past the timeout on a loaded machine, sends it again).
    let url = format!("{}/v1/webhooks/{hook_id}", dev.url);
    wait_until("the delivery counted", LIMIT, || {
        let get = http.get(&url).send();
        async move {
            let v: Value = get.await.unwrap().json().await.unwrap();
            if v["counts"]["delivered"] == 1 {
                Ok(())
            } else {
                Err(v)
            }
        }
    })
    .await;
    drop(dev);
}
