//! What the CLI's tests share: the `agentq` binary with a clean environment, the line a
//! process writes when it is ready, `agentq dev` running until the test ends, a migrated
//! database, and the waits: a process's exit is waited for itself (bounded by a watchdog
//! that kills it), anything that announces nothing by a bounded poll. Each test binary
//! uses a part of this.
#![allow(dead_code)]

use std::fmt::{Debug, Display};
use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use agentq_testkit::shared_postgres;
use serde_json::Value;

/// The settings this process's environment might hand down to a child: removed, so that
/// a child sees only what its test sets.
const INHERITED: &[&str] = &[
    "AGENTQ_DATABASE_URL",
    "AGENTQ_REDIS_URL",
    "AGENTQ_API_URL",
    "AGENTQ_API_ADDR",
    "AGENTQ_CONFIG",
    "AGENTQ_DB",
    "AGENTQ_SCRIPT",
    "AGENTQ_POLICY_TOOLS",
    "AGENTQ_ADMIN_KEY",
    "AGENTQ_API_KEY",
    "AGENTQ_METRICS_ADDR",
    "AGENTQ_KEY_CACHE_SECS",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
];

/// Remove from `cmd` the environment a test does not set itself. Its `/metrics` goes on
/// a free port: a process refuses a taken one, and tests run side by side (a test may
/// still set its own).
pub fn clean(cmd: &mut Command) -> &mut Command {
    for k in INHERITED {
        cmd.env_remove(k);
    }
    cmd.env("AGENTQ_METRICS_ADDR", "127.0.0.1:0")
}

/// The `agentq` binary, with a clean environment, run in the temporary directory.
pub fn agentq() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentq"));
    clean(&mut c);
    c.current_dir(std::env::temp_dir());
    c
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `agentq migrate` on `url` (one database, or several between commas).
pub fn migrate(url: &str) -> std::process::Output {
    agentq()
        .arg("migrate")
        .env("AGENTQ_DATABASE_URL", url)
        .output()
        .unwrap()
}

/// [`migrate`], which must succeed.
pub fn migrated(url: &str) {
    let out = migrate(url);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A fresh database on the shared private Postgres, migrated by `agentq migrate`.
pub fn migrated_db() -> String {
    let db = shared_postgres().unwrap().fresh_database().unwrap();
    migrated(&db);
    db
}

/// Child processes, killed when the test ends however it ends.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Read `stderr` line by line until one contains `marker` (the process says it is
/// ready); that line, and the thread draining the rest (so the process never blocks on
/// a full pipe). Panics if the stream ends first.
pub fn wait_line(stderr: ChildStderr, marker: &str) -> (String, std::thread::JoinHandle<()>) {
    let (seen, drain) = wait_lines(stderr, marker);
    let line = seen.lines().last().unwrap_or_default().to_string();
    (line, drain)
}

/// As [`wait_line`], with every line read up to and including the marker's.
pub fn wait_lines(stderr: ChildStderr, marker: &str) -> (String, std::thread::JoinHandle<()>) {
    let mut reader = BufReader::new(stderr);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "stderr closed before {marker:?}: {seen}");
        seen.push_str(&line);
        if line.contains(marker) {
            let drain = std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = reader.read_to_end(&mut sink);
            });
            return (seen, drain);
        }
    }
}

/// Wait for `child` to exit, for `limit` at most: its status, or `None` when it was still
/// running at the limit (it is killed then).
pub fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let pid = child.id();
    let (exited, watched) = std::sync::mpsc::channel::<()>();
    // The pid is this child's until `wait` below reaps it, so the watchdog cannot reach
    // another process.
    let watchdog = std::thread::spawn(move || {
        let late = watched.recv_timeout(limit).is_err();
        if late {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        late
    });
    let status = child.wait().unwrap();
    let _ = exited.send(());
    let late = watchdog.join().unwrap();
    (!late).then_some(status)
}

/// `agentq dev` (or anything that logs `listening on <url>` when it serves), killed when
/// the test ends.
pub struct Dev {
    pub child: Child,
    pub url: String,
    /// What it wrote on stderr until it was ready.
    pub started: String,
    _drain: std::thread::JoinHandle<()>,
}

impl Dev {
    /// Start `cmd` and wait until it serves.
    pub fn spawn(cmd: &mut Command) -> Dev {
        Dev::spawn_until(cmd, "listening on ")
    }

    /// Start `cmd` and wait until it has written `marker` (at or after its `listening on`
    /// line).
    pub fn spawn_until(cmd: &mut Command, marker: &str) -> Dev {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (started, drain) = wait_lines(stderr, marker);
        let url = started
            .lines()
            .find_map(|l| l.split("listening on ").nth(1))
            .unwrap()
            .trim()
            .to_string();
        Dev {
            child,
            url,
            started,
            _drain: drain,
        }
    }
}

/// `POST /v1/sessions` with `body` at `url`: the status and the JSON answer (`null` when
/// there is none).
pub async fn create_session(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let resp = http
        .post(format!("{url}/v1/sessions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `args` against the API at `api` as the client, with `key` if any.
pub fn client_as(api: &str, key: Option<&str>, args: &[&str]) -> Output {
    let mut c = agentq();
    c.env("AGENTQ_API_URL", api).args(args);
    if let Some(k) = key {
        c.env("AGENTQ_API_KEY", k);
    }
    c.output().unwrap()
}

/// The session `id` as the API at `url` shows it.
pub async fn session(http: &reqwest::Client, url: &str, id: &str) -> Value {
    http.get(format!("{url}/v1/sessions/{id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Wait until `pred` holds for session `id` as the API at `url` shows it (polled: the
/// client's view announces nothing); that view.
pub async fn wait_session(
    http: &reqwest::Client,
    url: &str,
    id: &str,
    limit: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(format_args!("session {id}"), limit, || async {
        let v = session(http, url, id).await;
        if pred(&v) { Ok(v) } else { Err(v) }
    })
    .await
}

/// Wait until session `id` has ended: completed, failed or cancelled.
pub async fn wait_finished(http: &reqwest::Client, url: &str, id: &str, limit: Duration) -> Value {
    wait_session(http, url, id, limit, |v| {
        matches!(
            v["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
    })
    .await
}

/// What a check of [`wait_until`] or [`poll_until`] found: ready with a value, or not
/// yet (with what it saw, for the message if the wait runs out).
pub trait Ready {
    type Output;
    fn ready(self) -> Result<Self::Output, String>;
}

impl Ready for bool {
    type Output = ();
    fn ready(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("not yet".into()) }
    }
}

impl<T> Ready for Option<T> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".into())
    }
}

impl<T, E: Debug> Ready for Result<T, E> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|seen| format!("{seen:?}"))
    }
}

/// The pause before the next check: often at first, then every 100 ms.
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_millis(100))
}

/// Poll `check` until it is [`Ready`], for a state that announces nothing; panics naming
/// `what` and the last thing seen if `limit` passes first.
pub async fn wait_until<R: Ready, F: Future<Output = R>>(
    what: impl Display,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> R::Output {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(10);
    loop {
        match check().await.ready() {
            Ok(v) => return v,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

/// [`wait_until`] for a test without a runtime (its checks run commands).
pub fn poll_until<R: Ready>(
    what: impl Display,
    limit: Duration,
    mut check: impl FnMut() -> R,
) -> R::Output {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(10);
    loop {
        match check().ready() {
            Ok(v) => return v,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; last seen: {seen}"
            ),
        }
        std::thread::sleep(pause);
        pause = next_pause(pause);
    }
}
