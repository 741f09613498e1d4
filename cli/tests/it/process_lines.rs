//! What a long-running process tells its operator on stderr, through the real binary:
//! one start line (version, id, queues, concurrency, provider, model, whether a key is set,
//! store and queue without passwords, addresses) and one stop line saying why; no colour
//! codes when stderr is not a terminal; a `/metrics` port already taken refused at start,
//! naming the flag and the address, with a non-zero exit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use agentq_testkit::RedisServer;

use common::{Procs, agentq, migrated_db, text, wait_exit};

const T: Duration = Duration::from_secs(60);
const PASSWORD: &str = "hunter2-pw";

/// A running process and its stderr, line by line, as far as it has been read.
struct Watched {
    procs: Procs,
    lines: Receiver<String>,
    seen: String,
}

impl Watched {
    fn spawn(cmd: &mut Command) -> Watched {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Watched {
            procs: Procs(vec![child]),
            lines,
            seen: String::new(),
        }
    }

    fn child(&mut self) -> &mut Child {
        &mut self.procs.0[0]
    }

    /// The first line from here on that contains `marker`; panics with what was seen if the
    /// stream ends or `T` passes first.
    fn line(&mut self, marker: &str) -> String {
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(marker) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("no {marker:?} in {T:?}: {}", self.seen),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("stderr closed before {marker:?}: {}", self.seen)
                }
            }
        }
    }

    /// SIGTERM, then the stop line; the process must exit 0.
    fn terminate(&mut self, command: &str) -> String {
        let pid = self.child().id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let stop = self.line(&format!("agentq {command} stopped"));
        let status = wait_exit(self.child(), T).expect("exits after SIGTERM");
        assert!(status.success(), "{status:?}: {}", self.seen);
        stop
    }
}

fn assert_fields(line: &str, fields: &[&str]) {
    for f in fields {
        assert!(line.contains(f), "{f:?} not in {line}");
    }
    assert!(
        !line.contains("\x1b["),
        "colour codes off a terminal: {line:?}"
    );
}

/// The stop line of a process stopped by SIGTERM.
fn assert_signalled(stop: &str) {
    assert_fields(stop, &["reason=signal", "signal=SIGTERM", "drain=finished"]);
}

#[test]
fn dev_says_what_it_runs_and_why_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("dev.db");
    let mut dev = Watched::spawn(
        agentq()
            .current_dir(dir.path())
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1"])
            .args(["--queues", "default,nightly", "--concurrency", "5"])
            // The scripted model is opted into, never the default.
            .args(["--default-provider", "scripted"])
            .arg("--db")
            .arg(&db),
    );
    let start = dev.line("agentq dev started");
    assert_fields(
        &start,
        &[
            &format!("version={}", env!("CARGO_PKG_VERSION")),
            "-dev0",
            "queues=default,nightly",
            "concurrency=5",
            "provider=scripted",
            "model=scripted",
            "key_set=false",
            &format!("store=sqlite://{}", db.display()),
            "queue=in-process",
            "api=127.0.0.1:",
            "metrics=127.0.0.1:",
        ],
    );
    assert_eq!(dev.seen.matches("agentq dev started").count(), 1);
    assert_signalled(&dev.terminate("dev"));
    assert!(!dev.seen.contains("\x1b["), "{:?}", dev.seen);
}

#[test]
fn worker_and_scheduler_say_what_they_run_without_passwords() {
    let redis = RedisServer::start().unwrap();
    // The private Postgres trusts every client: the password is only there to be hidden.
    let db = migrated_db().replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{PASSWORD}@"),
        1,
    );
    let shown_db = db.replacen(PASSWORD, "***", 1);
    let dir = tempfile::tempdir().unwrap();
    let mut worker = Watched::spawn(
        agentq()
            .current_dir(dir.path())
            .args(["worker", "--database-url", &db, "--redis-url", &redis.url()])
            .args(["--queues", "default,nightly", "--concurrency", "7"])
            .args(["--default-provider", "scripted"])
            .arg("--workspace-root")
            .arg(dir.path().join("ws")),
    );
    let start = worker.line("agentq worker started");
    assert_fields(
        &start,
        &[
            &format!("version={}", env!("CARGO_PKG_VERSION")),
            "id=",
            "queues=default,nightly",
            "concurrency=7",
            "provider=scripted",
            "model=scripted",
            "key_set=false",
            &format!("store={shown_db}"),
            &format!("queue={}", redis.url()),
            "metrics=127.0.0.1:",
        ],
    );

    let mut scheduler = Watched::spawn(
        agentq()
            .current_dir(dir.path())
            .args(["scheduler", "--addr", "127.0.0.1:0"])
            .env("AGENTQ_DATABASE_URL", &db)
            .env("AGENTQ_REDIS_URL", redis.url()),
    );
    let sched_start = scheduler.line("agentq scheduler started");
    assert_fields(
        &sched_start,
        &[
            &format!("store={shown_db}"),
            "api=127.0.0.1:",
            "metrics=127.0.0.1:",
        ],
    );

    assert_signalled(&worker.terminate("worker"));
    assert_signalled(&scheduler.terminate("scheduler"));
    for p in [&worker, &scheduler] {
        assert!(!p.seen.contains(PASSWORD), "{}", p.seen);
        assert!(!p.seen.contains("\x1b["), "{:?}", p.seen);
    }
}

/// A second process on a host once lost its `/metrics` to a warning: now it refuses to
/// start, naming the flag and the address, before it connects to anything (the URLs here
/// lead nowhere).
#[test]
fn a_taken_metrics_port_is_refused_at_start() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let nowhere_db = format!("postgres://u:{PASSWORD}@127.0.0.1:1/db");
    let cases: [(&str, Vec<String>); 3] = [
        (
            "worker",
            vec![
                "worker".into(),
                "--database-url".into(),
                nowhere_db.clone(),
                "--redis-url".into(),
                "redis://127.0.0.1:1".into(),
            ],
        ),
        (
            "dev",
            vec![
                "dev".into(),
                "--addr".into(),
                "127.0.0.1:0".into(),
                "--db".into(),
                dir.path().join("dev.db").display().to_string(),
            ],
        ),
        (
            "scheduler",
            vec!["scheduler".into(), "--addr".into(), "127.0.0.1:0".into()],
        ),
    ];
    for (command, args) in cases {
        let mut cmd = agentq();
        cmd.current_dir(dir.path())
            .args(&args)
            .args(["--metrics-addr", &addr])
            .stdin(Stdio::null());
        let out = cmd.output().unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{command} started: {err}");
        assert!(
            err.contains("--metrics-addr") && err.contains(&addr),
            "{command}: {err}"
        );
        assert!(!err.contains(&format!("agentq {command} started")), "{err}");
        assert!(!err.contains(PASSWORD), "{err}");
    }
    // Nothing was created before the refusal.
    assert!(!dir.path().join("dev.db").exists());
}
