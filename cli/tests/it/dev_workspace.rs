//! The embedded mode's workspaces are durable too: `agentq dev` (the binary) writes a file
//! in a session, is SIGKILLed during the next model call, and started again on the same
//! database file with another workspace directory (as on another machine, or after the
//! directory was lost): the resumed session reads the file it wrote. The same with the
//! contents in an S3-compatible bucket (moto), the SQLite file keeping only their index.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_core::WorkspaceStore;
use agentq_core::blob::s3::S3Blobs;
use agentq_core::config::S3Section;
use agentq_core::sqlite::SqliteStore;

use common::{Dev, agentq, wait_session, wait_until};

/// How long a session may take to get where a test waits for it.
const LIMIT: Duration = Duration::from_secs(60);

fn start_dev(db: &Path, config: &Path, script: &Path) -> Dev {
    Dev::spawn(
        agentq()
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(db)
            .arg("--config")
            .arg(config)
            .arg("--script")
            .arg(script)
            .env("DEV_S3_KEY", "test")
            .env("DEV_S3_SECRET", "test"),
    )
}

/// `s3`: the endpoint of the bucket `agentq-dev` to keep the contents in.
fn config(path: &Path, workspaces: &Path, s3: Option<&str>) {
    let mut text = format!(
        "[worker]\nlease_ttl_secs = 2\nheartbeat_secs = 1\nreclaim_min_idle_secs = 3\n\
         reclaim_interval_secs = 1\ndrain_timeout_secs = 5\nworkspace_root = {:?}\n\n\
         [policy]\ntools = [\"read_file\", \"write_file\", \"list_dir\", \"glob\", \"grep\"]\n",
        workspaces.display().to_string()
    );
    if let Some(endpoint) = s3 {
        text.push_str(&format!(
            "\n[workspace]\nblob_store = \"s3\"\n\n[workspace.s3]\nbucket = \"agentq-dev\"\n\
             endpoint = {endpoint:?}\naccess_key_env = \"DEV_S3_KEY\"\n\
             secret_key_env = \"DEV_S3_SECRET\"\n"
        ));
    }
    std::fs::write(path, text).unwrap();
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn dev_resumes_with_its_files_after_sigkill_in_another_directory() {
    resumes_after_sigkill(None).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn dev_with_an_s3_bucket_resumes_with_its_files_after_sigkill() {
    let moto = agentq_testkit::MotoServer::start()
        .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)");
    let section = S3Section {
        bucket: "agentq-dev".into(),
        endpoint: moto.endpoint(),
        ..S3Section::default()
    };
    let objects = Arc::new(S3Blobs::new(&section, "test".into(), "test".into()).unwrap());
    objects.create_bucket().await.unwrap();
    resumes_after_sigkill(Some((moto.endpoint(), objects))).await;
}

/// `bucket`: the endpoint of the bucket `agentq-dev` and a client of it.
async fn resumes_after_sigkill(bucket: Option<(String, Arc<S3Blobs>)>) {
    let (s3, objects) = bucket.unzip();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dev.db");
    let cfg = dir.path().join("agentq.toml");
    let first_ws = dir.path().join("ws-first");
    let second_ws = dir.path().join("ws-second");
    config(&cfg, &first_ws, s3.as_deref());
    // Write a file; then a long model call (the kill lands in it) that reads it back; then
    // answer with what was read.
    let script = dir.path().join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "Writing.", "tool_calls": [{"name": "write_file",
                "arguments": {"path": "notes/kept.txt", "content": "kept across the crash"}}],
             "delay_ms": 50},
            {"text": "Reading.", "tool_calls": [{"name": "read_file",
                "arguments": {"path": "notes/kept.txt"}}],
             "delay_ms": 3000},
            {"text": "Read: {{last_tool_result}}", "delay_ms": 50},
        ]})
        .to_string(),
    )
    .unwrap();
    let http = reqwest::Client::new();
    let mut dev = start_dev(&db, &cfg, &script);
    let resp = http
        .post(format!("{}/v1/sessions", dev.url))
        .json(&json!({"prompt": "files", "tools": ["read_file", "write_file"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The write's result checkpointed (the model's first answer is, before its tool has
    // run): the session is in its long second call.
    wait_until(format_args!("{id}'s write_file result"), LIMIT, || async {
        let v: Value = http
            .get(format!("{}/v1/sessions/{id}/messages", dev.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let written = v["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        if written { Ok(()) } else { Err(v) }
    })
    .await;
    assert!(first_ws.join(&id).join("notes/kept.txt").exists());
    dev.child.kill().unwrap(); // SIGKILL, in the long model call
    dev.child.wait().unwrap();
    drop(dev);

    config(&cfg, &second_ws, s3.as_deref());
    let dev = start_dev(&db, &cfg, &script);
    let v = wait_session(&http, &dev.url, &id, LIMIT, |v| v["status"] == "completed").await;
    let result = v["result"].as_str().unwrap_or_default();
    assert!(result.contains("kept across the crash"), "{v}");
    assert_eq!(
        std::fs::read_to_string(second_ws.join(&id).join("notes/kept.txt")).unwrap(),
        "kept across the crash"
    );
    // The API serves it (from the bucket, with one configured).
    let resp = http
        .get(format!("{}/v1/sessions/{id}/files/notes/kept.txt", dev.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.bytes().await.unwrap().as_ref(),
        b"kept across the crash"
    );
    drop(dev);

    let store = SqliteStore::open(&db).await.unwrap();
    let files = store.workspace_files(&id).await.unwrap();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].path, "notes/kept.txt");
    if let Some(objects) = objects {
        // The file holds only the index: the bytes are in the bucket.
        assert!(store.workspace_file(&id, "notes/kept.txt").await.is_err());
        assert!(objects.exists(&files[0].sha256).await.unwrap());
        let store = store.with_objects(objects);
        let (_, data) = store
            .workspace_file(&id, "notes/kept.txt")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(data, b"kept across the crash");
        store.close().await;
        return;
    }
    store.close().await;
}
