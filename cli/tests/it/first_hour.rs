//! The first hour of a newcomer, through the real binary: a model that says what it is
//! (no fake model unless asked for, the provider the environment configures otherwise,
//! and a session without one failing with how to configure one), and errors that state
//! their cause once (a service that is down, a schema that is behind, a refused key, an
//! unknown queue).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use agentq_testkit::{FakeLlm, FakeResponse, fixture, shared_postgres};
use serde_json::{Value, json};

use common::{Dev, agentq, client_as, create_session, migrated_db, text, wait_exit, wait_finished};

/// A closed port: bound, then let go.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `agentq dev` started by `cmd`, up to its start line.
fn start_dev(cmd: &mut Command) -> Dev {
    Dev::spawn_until(cmd, "agentq dev started")
}

fn dev_in(dir: &Path) -> Command {
    let mut cmd = agentq();
    cmd.current_dir(dir)
        .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
        .arg(dir.join("dev.db"))
        .arg("--workspace-root")
        .arg(dir.join("ws"));
    cmd
}

/// With no provider configured, dev says so at start (one line, and in its start line),
/// and a session fails with how to configure one, never a made-up answer.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_model_dev_says_so_and_a_session_fails_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let dev = start_dev(&mut dev_in(dir.path()));
    let (seen, url) = (dev.started.clone(), dev.url.clone());
    assert_eq!(
        seen.matches("agentq dev: no model configured: set OPENAI_API_KEY")
            .count(),
        1,
        "{seen}"
    );
    assert_start_line(&seen, &["provider=none", "model=none", "key_set=false"]);
    let done = one_session(&url).await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = done["error"].as_str().unwrap();
    assert!(
        error.contains("no model configured") && error.contains("OPENAI_API_KEY"),
        "{error}"
    );
    // Failed for good (not retried), and nothing made up.
    assert_eq!(done["result"], Value::Null, "{done}");
}

/// The start line of `agentq dev` in `seen` holds each of `fields`.
fn assert_start_line(seen: &str, fields: &[&str]) {
    let start = seen
        .lines()
        .find(|l| l.contains("agentq dev started"))
        .unwrap();
    for f in fields {
        assert!(start.contains(f), "{f} not in {start}");
    }
}

/// One session through the API at `url`, followed to its end.
async fn one_session(url: &str) -> Value {
    let http = reqwest::Client::new();
    let (status, body) = create_session(&http, url, json!({"prompt": "Summarise"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap();
    wait_finished(&http, url, id, Duration::from_secs(60)).await
}

/// With a key and an endpoint in the environment, OpenAI is the default provider: the
/// session's request goes there with the key, and the start line says so.
#[tokio::test(flavor = "multi_thread")]
async fn an_openai_key_in_the_environment_makes_openai_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("openai_stream_text_usage.sse"),
        64,
    ));
    let dev = start_dev(
        dev_in(dir.path())
            .env("OPENAI_API_KEY", "sk-first-hour")
            .env("OPENAI_BASE_URL", format!("{}/v1", fake.url)),
    );
    let (seen, url) = (dev.started.clone(), dev.url.clone());
    assert!(!seen.contains("no model configured"), "{seen}");
    assert_start_line(
        &seen,
        &["provider=openai", "model=gpt-4o-mini", "key_set=true"],
    );
    let done = one_session(&url).await;
    assert_eq!(done["status"], "completed", "{done}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].header("authorization"),
        Some("Bearer sk-first-hour")
    );
    // The request named no model: `agentq status` shows the one that answered.
    assert_eq!(reqs[0].body["model"], "gpt-4o-mini");
    let out = client_as(&url, None, &["status", done["id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["model"], "gpt-4o-mini", "{shown}");
}

/// A key the provider refuses: the session's error names the variable that holds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_key_names_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::json(
        401,
        r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#,
    ));
    let dev = start_dev(
        dev_in(dir.path())
            .env("OPENAI_API_KEY", "sk-wrong")
            .env("OPENAI_BASE_URL", format!("{}/v1", fake.url)),
    );
    let url = dev.url.clone();
    let http = reqwest::Client::new();
    let (_, body) = create_session(&http, &url, json!({"prompt": "Summarise"})).await;
    let id = body["id"].as_str().unwrap();
    let done = wait_finished(&http, &url, id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "failed", "{done}");
    let error = done["error"].as_str().unwrap();
    assert!(
        error.contains("401") && error.contains("OPENAI_API_KEY"),
        "{error}"
    );
}

/// A queue dev does not serve is refused naming the setting that lists queues, not an
/// admin route a keyless dev cannot call; a queue its workers read (`--queues`) is taken.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_queue_in_dev_points_to_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let dev = start_dev(
        dev_in(dir.path())
            .args(["--queues", "default,nightly"])
            .args(["--default-provider", "scripted"]),
    );
    let url = dev.url.clone();
    let http = reqwest::Client::new();
    let (status, body) =
        create_session(&http, &url, json!({"prompt": "x", "queue": "weekly"})).await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(
        text.contains("scheduler.queues") && text.contains("--queues"),
        "{text}"
    );
    assert!(!text.contains("/v1/queues"), "{text}");
    let (status, body) =
        create_session(&http, &url, json!({"prompt": "x", "queue": "nightly"})).await;
    assert_eq!(status, 201, "{body}");
}

/// Run `cmd` to its end (bounded); its exit code and stderr.
fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_exit(&mut child, Duration::from_secs(60)).expect("exits");
    (status.code(), reader.join().unwrap())
}

/// The lines the process wrote as `agentq: …` (its error), not its log lines.
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("agentq: "))
        .collect()
}

/// Postgres down: the cause, said once, from the first attempt (not a pool's timeout).
#[test]
fn postgres_down_is_one_line_with_its_cause() {
    let port = closed_port();
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = run(agentq().current_dir(dir.path()).args([
        "worker",
        "--database-url",
        &format!("postgres://u:secret@127.0.0.1:{port}/db"),
        "--redis-url",
        "redis://127.0.0.1:1",
    ]));
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        error_lines(&stderr),
        [format!(
            "agentq: cannot connect to Postgres at 127.0.0.1:{port}: connection refused"
        )],
        "{stderr}"
    );
    assert!(!stderr.contains("timed out"), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
}

/// Redis down: one line with its address and cause.
#[test]
fn redis_down_is_one_line_with_its_cause() {
    let db = migrated_db();
    let port = closed_port();
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = run(agentq()
        .current_dir(dir.path())
        .args(["worker", "--database-url", &db, "--redis-url"])
        .arg(format!("redis://127.0.0.1:{port}")));
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        error_lines(&stderr),
        [format!(
            "agentq: cannot connect to Redis at 127.0.0.1:{port}: connection refused"
        )],
        "{stderr}"
    );
}

/// A database without the schema: the error says where it stands and what to run.
#[test]
fn a_schema_behind_names_the_versions() {
    let db = shared_postgres().unwrap().fresh_database().unwrap();
    let (code, stderr) = run(agentq()
        .args(["keys", "list"])
        .env("AGENTQ_DATABASE_URL", &db));
    assert_eq!(code, Some(2), "{stderr}");
    let lines = error_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("no migration applied")
            && lines[0].contains("needs version")
            && lines[0].contains("agentq migrate"),
        "{stderr}"
    );
    assert!(!stderr.contains("None"), "{stderr}");
}
