//! The embedded default, through the real binary: `agentq demo` runs a batch with a worker
//! killed midway and its summary agrees with the SQLite file it leaves; `agentq dev`
//! serves the API on a file, survives a SIGKILL mid-session (the session resumes from the
//! file after a restart) and stops on SIGTERM. No services needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use agentq_core::SessionStore;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{ListFilter, SessionRow, SessionStatus};
use serde_json::{Value, json};

use common::{Dev, agentq, wait_exit, wait_session, wait_until};

/// What every demo session writes to `notes.md` in its workspace (cli/src/demo.rs).
const NOTES_CONTENT: &str = "# Notes\n\n- agentq runs agent sessions as durable jobs.\n\
    - Every step is checkpointed, so any worker can resume any session.\n";

/// Run to the end, killing the child past `limit`.
fn run_with_limit(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let Some(status) = wait_exit(&mut child, limit) else {
        panic!(
            "timed out after {limit:?}; stderr: {}",
            err_t.join().unwrap()
        );
    };
    (
        status.success(),
        out_t.join().unwrap(),
        err_t.join().unwrap(),
    )
}

async fn all_rows(store: &SqliteStore) -> Vec<SessionRow> {
    store
        .list(&ListFilter {
            limit: 10_000,
            ..ListFilter::default()
        })
        .await
        .unwrap()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("summary field {k}: {v}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn demo_summary_matches_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let mut cmd = agentq();
    cmd.args([
        "demo",
        "--sessions",
        "12",
        "--workers",
        "3",
        "--concurrency",
        "2",
    ])
    .arg("--db")
    .arg(&db)
    .arg("--json");
    let (ok, stdout, stderr) = run_with_limit(cmd, Duration::from_secs(180));
    assert!(ok, "demo failed: {stderr}\n{stdout}");
    let s: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    // The plain progress lines went to stderr (not a terminal), and the kill was told.
    assert!(stderr.contains("done ·"), "{stderr}");

    // Every 4th session spawns a reviewer sub-agent and waits for it.
    let store = SqliteStore::open(&db).await.unwrap();
    let rows = all_rows(&store).await;
    let roots: Vec<&SessionRow> = rows.iter().filter(|r| r.parent_id.is_none()).collect();
    let children: Vec<&SessionRow> = rows.iter().filter(|r| r.parent_id.is_some()).collect();
    assert_eq!(roots.len(), 12);
    assert_eq!(children.len(), 3);
    assert_eq!(n(&s, "sessions"), 15);
    assert_eq!(n(&s, "root_sessions"), 12);
    assert_eq!(n(&s, "sub_agents"), 3);
    assert_eq!(n(&s, "completed"), 15);
    assert_eq!(s["all_completed"], json!(true));
    for r in &rows {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
    }
    assert_eq!(s["by_finish_reason"]["stop"], json!(15));
    for c in &children {
        let parent = roots
            .iter()
            .find(|r| Some(&r.id) == c.parent_id.as_ref())
            .unwrap();
        assert!(parent.spec.prompt.starts_with("[lead]"), "{parent:?}");
        assert_eq!(c.root_id, parent.id);
        assert_eq!(c.result.as_deref(), Some("The notes are complete."));
        // The child's answer came back to the parent as the tool result.
        assert!(
            parent
                .result
                .as_deref()
                .unwrap()
                .contains("The notes are complete."),
            "{parent:?}"
        );
    }

    let iterations: u64 = rows.iter().map(|r| u64::from(r.iteration)).sum();
    let input: u64 = rows.iter().map(|r| r.usage.input_tokens).sum();
    let output: u64 = rows.iter().map(|r| r.usage.output_tokens).sum();
    assert_eq!(n(&s, "iterations"), iterations);
    assert_eq!(n(&s, "input_tokens"), input);
    assert_eq!(n(&s, "output_tokens"), output);
    // Four model turns per session (write, read, list, answer), one more for the spawn,
    // two per reviewer (read, answer).
    assert_eq!(iterations, 12 * 4 + 3 + 3 * 2);
    assert!(input > 0 && output > 0);

    // A worker was killed mid-run, and every session it left unfinished was taken over
    // (claimed again, with a newer lease epoch) and completed.
    assert!(s["killed_worker"].is_string(), "no kill: {s}");
    assert!(n(&s, "killed_running") >= 1, "{s}");
    assert_eq!(n(&s, "resumed"), n(&s, "killed_running"), "{s}");
    let resumed = s["resumed_sessions"].as_array().unwrap();
    assert_eq!(resumed.len() as u64, n(&s, "resumed"));
    for id in resumed {
        let r = rows.iter().find(|r| r.id == id.as_str().unwrap()).unwrap();
        assert!(r.lease_epoch >= 2, "{r:?}");
        assert_eq!(r.status, SessionStatus::Completed);
    }
    // Only calls in flight in the killed worker are made again (one per session at most),
    // and never one whose answer had been checkpointed.
    assert_eq!(n(&s, "llm_answers_requested_again"), 0, "{s}");
    assert_eq!(s["durable"], json!(true));
    assert!(n(&s, "llm_reissued") <= n(&s, "killed_running"), "{s}");

    // Latency and throughput are coherent with the rows.
    let mut lat: Vec<i64> = roots
        .iter()
        .map(|r| (r.finished_at.unwrap() - r.created_at).num_milliseconds())
        .collect();
    lat.sort_unstable();
    assert_eq!(n(&s, "latency_p95_ms") as i64, lat[11]); // nearest rank: ceil(0.95 × 12) = 12
    assert_eq!(n(&s, "latency_p50_ms") as i64, lat[5]);
    assert!(s["sessions_per_sec"].as_f64().unwrap() > 0.0);
    assert!(s["wall_secs"].as_f64().unwrap() > 0.0);

    // Every session wrote its notes in its own workspace, exactly once in effect.
    let workspaces = Path::new(s["workspaces"].as_str().unwrap());
    for r in &rows {
        let notes = workspaces.join(&r.root_id).join("notes.md");
        let text =
            std::fs::read_to_string(&notes).unwrap_or_else(|e| panic!("{}: {e}", notes.display()));
        assert_eq!(text, NOTES_CONTENT);
    }
    store.close().await;
}

#[test]
fn demo_prints_a_table_and_refuses_a_used_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    let mut cmd = agentq();
    cmd.args(["demo", "--sessions", "3", "--workers", "1", "--db"])
        .arg(&db);
    let (ok, stdout, stderr) = run_with_limit(cmd, Duration::from_secs(120));
    assert!(ok, "{stderr}\n{stdout}");
    for want in [
        "finish reason stop",
        "iterations",
        "tokens in / out",
        "LLM calls re-issued",
        "throughput",
        "latency p50 / p95",
        "every session completed",
    ] {
        assert!(stdout.contains(want), "no {want:?} in:\n{stdout}");
    }
    // One worker: nothing to kill.
    assert!(stdout.contains("worker killed"), "{stdout}");

    let mut again = agentq();
    again.args(["demo", "--sessions", "1", "--db"]).arg(&db);
    let (ok, _, stderr) = run_with_limit(again, Duration::from_secs(60));
    assert!(!ok);
    assert!(stderr.contains("already holds sessions"), "{stderr}");
}

// ---- agentq dev ----

fn start_dev(db: &Path, config: &Path, script: &Path) -> Dev {
    Dev::spawn(
        agentq()
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "2", "--db"])
            .arg(db)
            .arg("--config")
            .arg(config)
            .arg("--script")
            .arg(script),
    )
}

async fn submit(http: &reqwest::Client, dev: &Dev, prompt: &str) -> String {
    let resp = http
        .post(format!("{}/v1/sessions", dev.url))
        .json(&json!({"prompt": prompt, "tools": ["list_dir"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let v: Value = resp.json().await.unwrap();
    v["id"].as_str().unwrap().to_string()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_resumes_after_sigkill_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dev.db");
    let config = dir.path().join("agentq.toml");
    // Short leases so the restarted process takes the killed session over within seconds.
    std::fs::write(
        &config,
        format!(
            "[worker]\nlease_ttl_secs = 2\nheartbeat_secs = 1\nreclaim_min_idle_secs = 3\n\
             reclaim_interval_secs = 1\ndrain_timeout_secs = 5\nworkspace_root = {:?}\n",
            dir.path().join("ws").display().to_string()
        ),
    )
    .unwrap();
    // A quick first step, then a long "model call": the kill lands in it.
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "Looking.", "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
             "usage": {"input_tokens": 10, "output_tokens": 2}, "delay_ms": 50},
            {"text": "All done.", "usage": {"input_tokens": 20, "output_tokens": 3},
             "delay_ms": 2500},
        ]})
        .to_string(),
    )
    .unwrap();
    let http = reqwest::Client::new();

    // 1. Submit and wait for completion.
    let mut dev = start_dev(&db, &config, &script);
    let first = submit(&http, &dev, "first").await;
    let v = wait_session(&http, &dev.url, &first, Duration::from_secs(60), |v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(v["finish_reason"], "stop", "{v}");

    // 2. A second session: SIGKILL the process while it is in its long step.
    let second = submit(&http, &dev, "second").await;
    wait_session(&http, &dev.url, &second, Duration::from_secs(60), |v| {
        v["status"] == "running" && v["iterations"].as_u64().unwrap_or(0) >= 1
    })
    .await;
    dev.child.kill().unwrap(); // SIGKILL
    dev.child.wait().unwrap();
    drop(dev);

    // 3. Start again on the same file: the session resumes and completes.
    let mut dev = start_dev(&db, &config, &script);
    let v = wait_session(&http, &dev.url, &second, Duration::from_secs(60), |v| {
        v["status"] == "completed"
    })
    .await;
    assert_eq!(v["finish_reason"], "stop", "{v}");
    assert_eq!(v["iterations"], 2, "{v}");
    // The first step was not redone: the history holds it once.
    let msgs: Value = http
        .get(format!("{}/v1/sessions/{second}/messages", dev.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = msgs.to_string();
    assert_eq!(text.matches("Looking.").count(), 1, "{text}");

    // 4. SIGTERM: a graceful stop, promptly, exit code 0.
    let status =
        agentq_testkit::sigterm_and_wait(&mut dev.child, Duration::from_secs(30), "agentq dev");
    assert!(status.success(), "{status:?}");

    // Both sessions are in the file, completed.
    let store = SqliteStore::open(&db).await.unwrap();
    let rows = all_rows(&store).await;
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.status == SessionStatus::Completed));
    let resumed = rows.iter().find(|r| r.id == second).unwrap();
    assert!(resumed.lease_epoch >= 2, "{resumed:?}");
    store.close().await;
}

/// `agentq dev` on a file another process holds the write lock of: `/readyz` answers 503
/// while the store cannot write, and 200 again once it can, and writes go through then.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn dev_is_not_ready_while_its_file_cannot_be_written() {
    use sqlx::{ConnectOptions, Connection};

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dev.db");
    let config = dir.path().join("agentq.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nworkspace_root = {:?}\n",
            dir.path().join("ws").display().to_string()
        ),
    )
    .unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, json!({"turns": [{"text": "done"}]}).to_string()).unwrap();
    let dev = start_dev(&db, &config, &script);
    let http = reqwest::Client::new();
    let ready = || async {
        http.get(format!("{}/readyz", dev.url))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(ready().await, 200);

    let mut other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .connect()
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let resp = http
        .post(format!("{}/v1/sessions", dev.url))
        .json(&json!({"prompt": "blocked"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(ready().await, 503);

    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    wait_until("ready again", Duration::from_secs(30), || async {
        ready().await == 200
    })
    .await;
    let id = submit(&http, &dev, "after").await;
    wait_session(&http, &dev.url, &id, Duration::from_secs(30), |v| {
        v["status"] == "completed"
    })
    .await;
}

/// A damaged database file is refused at start: the process exits non-zero with a
/// message that names the file and says it is corrupt.
#[tokio::test(flavor = "multi_thread")]
async fn dev_refuses_a_corrupt_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broken.db");
    let store = SqliteStore::open(&db).await.unwrap();
    store.migrate().await.unwrap();
    // Everything into the main file, so that the damage below is what a reader sees.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(store.pool())
        .await
        .unwrap();
    store.close().await;
    let mut bytes = std::fs::read(&db).unwrap();
    let page = 4096;
    assert!(bytes.len() >= 4 * page, "{} bytes", bytes.len());
    let middle = bytes.len() / page / 2;
    bytes[middle * page..(middle + 1) * page].fill(0x5a);
    std::fs::write(&db, &bytes).unwrap();
    let mut cmd = agentq();
    cmd.args(["dev", "--addr", "127.0.0.1:0", "--db"]).arg(&db);
    let (ok, _out, err) = run_with_limit(cmd, Duration::from_secs(30));
    assert!(!ok, "{err}");
    assert!(err.contains("corrupt"), "{err}");
    assert!(err.contains(&db.display().to_string()), "{err}");
}
