//! The real `agentq` binary as scheduler and as client: `migrate`, `scheduler` (refusing an
//! unmigrated database, stopping on SIGTERM), `submit` (single, `--file`, `--wait` by
//! pub/sub and by polling), `status`, `cancel`, `sessions`, and the one-line errors.
//! No worker runs: waits end by cancelling the session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use agentq_testkit::{RedisServer, shared_postgres, shared_postgres_shard};
use serde_json::Value;

use common::{Dev, migrate, migrated, migrated_db, text, wait_exit, wait_line};

/// The `AGENTQ_ADMIN_KEY` of the schedulers these tests start.
const ADMIN_KEY: &str = "client-cli-admin-key-0123456789abcdef";

/// `agentq` as the operator: the schedulers here accept that key.
fn agentq() -> Command {
    let mut c = common::agentq();
    c.env("AGENTQ_API_KEY", ADMIN_KEY);
    c
}

fn start_scheduler(db: &str, redis: &str) -> Dev {
    // The queues the batch case names: sessions may only name configured ones.
    let config = std::env::temp_dir().join(format!("client-cli-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "[scheduler]\nqueues = [\"default\", \"bulk\", \"other\"]\n",
    )
    .unwrap();
    Dev::spawn(
        agentq()
            .env("AGENTQ_CONFIG", &config)
            .args([
                "scheduler",
                "--addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .env("AGENTQ_ADMIN_KEY", ADMIN_KEY)
            .env("AGENTQ_DATABASE_URL", db)
            .env("AGENTQ_REDIS_URL", redis),
    )
}

fn client(api: &str, args: &[&str]) -> Output {
    agentq()
        .env("AGENTQ_API_URL", api)
        .args(args)
        .output()
        .unwrap()
}

/// Several URLs are several shards: `agentq migrate` migrates each; a malformed one is
/// refused by its position, its text never shown.
#[test]
fn migrate_migrates_every_shard() {
    let a = shared_postgres().unwrap().fresh_database().unwrap();
    let b = shared_postgres_shard(1).unwrap().fresh_database().unwrap();
    let both = format!("{a},{b}");
    let out = migrate(&both);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("shard 0:") && shown.contains("shard 1:"),
        "{shown}"
    );
    assert_eq!(
        shown.matches("database schema created").count(),
        2,
        "{shown}"
    );
    let shown = text(&migrate(&both).stdout);
    assert_eq!(shown.matches("up to date").count(), 2, "{shown}");

    let out = migrate(&format!("{a},mysql://u:secret@h/db"));
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("AGENTQ_DATABASE_URL") && e.contains("URL 2 of 2"),
        "{e}"
    );
    assert!(!e.contains("secret"), "{e}");
}

/// A shard is added by giving `agentq migrate` one more URL: it migrates the new shard and
/// adds a generation to the shard map. A shard left out again is refused, by `migrate` and
/// by every process that opens the store.
#[test]
fn migrate_adds_a_shard_to_the_map_and_refuses_one_left_out() {
    let urls: Vec<String> = (0..3)
        .map(|i| shared_postgres_shard(i).unwrap().fresh_database().unwrap())
        .collect();
    let run = |args: &[&str], n: usize| {
        agentq()
            .args(args)
            .env("AGENTQ_DATABASE_URL", urls[..n].join(","))
            .output()
            .unwrap()
    };
    let out = run(&["migrate"], 2);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("shard map generation 0: new trees over 2 shards (added now)"),
        "{shown}"
    );

    let out = run(&["migrate"], 3);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("shard 2:") && shown.contains("database schema created"),
        "{shown}"
    );
    assert!(
        shown.contains("shard map generation 0: new trees over 2 shards\n")
            && shown.contains("shard map generation 1: new trees over 3 shards (added now)"),
        "{shown}"
    );
    assert!(run(&["keys", "list"], 3).status.success());

    for args in [&["migrate"][..], &["keys", "list"][..]] {
        let out = run(args, 2);
        assert!(!out.status.success(), "{args:?}");
        let e = text(&out.stderr);
        assert!(e.contains("database_url"), "{args:?}: {e}");
        assert!(e.contains("3"), "{args:?}: {e}");
    }
}

#[test]
fn migrate_then_scheduler_then_sigterm() {
    let db = shared_postgres().unwrap().fresh_database().unwrap();
    let redis = RedisServer::start().unwrap();

    // An unmigrated database: the scheduler refuses to start.
    let out = agentq()
        .args(["scheduler", "--addr", "127.0.0.1:0"])
        .env("AGENTQ_DATABASE_URL", &db)
        .env("AGENTQ_REDIS_URL", redis.url())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("database schema is behind (no migration applied; this binary needs version")
            && text(&out.stderr).contains("): run `agentq migrate`"),
        "{}",
        text(&out.stderr)
    );

    let out = migrate(&db);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("applied"),
        "{}",
        text(&out.stdout)
    );
    let out = migrate(&db);
    assert!(
        text(&out.stdout).contains("up to date"),
        "{}",
        text(&out.stdout)
    );

    let mut s = start_scheduler(&db, &redis.url());
    let ready = client(&s.url, &["sessions"]);
    assert!(ready.status.success(), "{}", text(&ready.stderr));

    let status =
        agentq_testkit::sigterm_and_wait(&mut s.child, Duration::from_secs(15), "agentq scheduler");
    assert!(status.success(), "{status}");
}

#[test]
fn submit_status_cancel_sessions() {
    submit_status_cancel_sessions_on(&migrated_db());
}

/// The same HTTP API on a scheduler over two Postgres shards (`AGENTQ_DATABASE_URL`
/// naming both, migrated by `agentq migrate`): every call answers as on one, lists gather
/// both shards, and a retried idempotent submit finds its session wherever its key put it.
#[test]
fn submit_status_cancel_sessions_over_two_shards() {
    let a = shared_postgres().unwrap().fresh_database().unwrap();
    let b = shared_postgres_shard(1).unwrap().fresh_database().unwrap();
    let both = format!("{a},{b}");
    migrated(&both);
    let ids = submit_status_cancel_sessions_on(&both);

    let redis = RedisServer::start().unwrap();
    let s = start_scheduler(&both, &redis.url());
    // Sessions on both shards, each found by id and all in one list.
    // A root's partition is random: at least 12 roots, and more until both shards hold
    // one (64 all on one shard would be a chance of 2^-63, not bad luck).
    let mut many = ids.clone();
    let shard = |id: &String| {
        agentq_core::shard::partition_of(id)
            .map_or(usize::MAX, |p| agentq_core::shard::shard_of(p, 2))
    };
    let mut shards: std::collections::BTreeSet<usize> = many.iter().map(shard).collect();
    for i in 0..64 {
        if i >= 12 && shards.len() == 2 {
            break;
        }
        let out = client(&s.url, &["submit", &format!("spread {i}")]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let id = text(&out.stdout).trim().to_string();
        shards.insert(shard(&id));
        many.push(id);
    }
    assert_eq!(shards, [0, 1].into(), "{many:?}");
    let out = client(&s.url, &["sessions", "--limit", "100"]);
    let table = text(&out.stdout);
    for id in &many {
        assert!(table.contains(id.as_str()), "{id} missing from\n{table}");
        let out = client(&s.url, &["status", id]);
        assert!(out.status.success(), "{id}: {}", text(&out.stderr));
    }
    // An idempotent submit, retried: the same session, from whichever shard holds it.
    let first = client(&s.url, &["submit", "--idempotency-key", "retry-me", "once"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let again = client(&s.url, &["submit", "--idempotency-key", "retry-me", "once"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&first.stdout), text(&again.stdout));
    assert!(
        text(&again.stderr).contains("existing session"),
        "{}",
        text(&again.stderr)
    );
}

/// Submit, read, list and cancel sessions through `agentq` against a scheduler on `db`
/// (one URL or several); the ids it submitted.
fn submit_status_cancel_sessions_on(db: &str) -> Vec<String> {
    let redis = RedisServer::start().unwrap();
    let s = start_scheduler(db, &redis.url());

    let out = client(
        &s.url,
        &[
            "submit",
            "--mode",
            "think",
            "--max-iterations",
            "3",
            "--tools",
            "read_file,grep",
            "hello",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 36, "{id}");

    let out = client(&s.url, &["status", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["status"], "queued");
    assert_eq!(view["mode"], "think");
    assert_eq!(view["max_iterations"], 3);
    assert_eq!(view["tools"], serde_json::json!(["read_file", "grep"]));

    let out = client(&s.url, &["sessions"]);
    let table = text(&out.stdout);
    assert!(table.starts_with("ID"), "{table}");
    assert!(
        table.contains(&id) && table.contains("queued") && table.contains("hello"),
        "{table}"
    );

    let out = client(&s.url, &["cancel", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cancelled"),
        "{}",
        text(&out.stdout)
    );
    let out = client(&s.url, &["cancel", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("already finished"),
        "{}",
        text(&out.stderr)
    );
    let out = client(&s.url, &["sessions", "--status", "cancelled"]);
    assert!(text(&out.stdout).contains(&id));

    // 4xx: the server's message and field, one line.
    let out = client(&s.url, &["submit", "--mode", "turbo", "p"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("field `mode`") && err.contains("422"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let out = client(&s.url, &["status", "0190aaaa-0000-7000-8000-000000000000"]);
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );

    // A batch file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("batch.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"one\"}\n\n{\"prompt\": \"two\", \"queue\": \"other\"}\n{\"prompt\": \"three\"}\n",
    )
    .unwrap();
    let out = client(
        &s.url,
        &[
            "submit",
            "--file",
            file.to_str().unwrap(),
            "--queue",
            "bulk",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ids: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 3);
    let out = client(&s.url, &["status", &ids[1]]);
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["queue"], "other");
    assert_eq!(view["prompt"], "two");
    let out = client(&s.url, &["status", &ids[2]]);
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["queue"], "bulk");
    let mut all = vec![id];
    all.extend(ids);
    all
}

/// `submit --wait` ends when the session ends (here: cancelled, so exit 1).
fn wait_then_cancel(api: &str, redis: Option<&str>) {
    let mut cmd = agentq();
    cmd.env("AGENTQ_API_URL", api)
        .args(["submit", "--wait", "--wait-timeout", "30", "wait for me"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(r) = redis {
        cmd.env("AGENTQ_REDIS_URL", r);
    }
    let mut child = cmd.spawn().unwrap();
    let (line, drain) = wait_line(child.stderr.take().unwrap(), "submitted ");
    let id = line.trim().rsplit(' ').next().unwrap().to_string();
    let out = client(api, &["cancel", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = wait_exit(&mut child, Duration::from_secs(20)).expect("--wait did not end");
    drain.join().unwrap();
    assert_eq!(status.code(), Some(1));
}

#[test]
fn submit_wait_by_pubsub_and_by_polling() {
    let db = migrated_db();
    let redis = RedisServer::start().unwrap();
    let s = start_scheduler(&db, &redis.url());
    wait_then_cancel(&s.url, Some(&redis.url()));
    wait_then_cancel(&s.url, None);
}

#[test]
fn unreachable_api_is_one_clear_line() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api = format!("http://127.0.0.1:{port}");
    let out = client(&api, &["sessions"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(
        err.trim(),
        format!(
            "agentq: cannot reach the API at {api}: connection refused (is `agentq dev` or \
             `agentq scheduler` running there?)"
        )
    );
}
