//! API keys through the real `agentq` binary: `keys create | list | revoke` against
//! Postgres (the key printed on the last line works against `agentq scheduler`; a revoked
//! one stops working once the key cache lets go of it; a key without the scope gets a 403
//! naming it; a keyless client is told where a key goes) and against the embedded file
//! (`agentq dev` checks a presented key, keeps tenants apart, refuses a non-loopback
//! `Host`, and refuses to listen on a public address without `AGENTQ_ADMIN_KEY`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Output;
use std::time::Duration;

use agentq_testkit::RedisServer;
use serde_json::Value;

use common::{Dev, agentq, client_as, migrated_db, poll_until, text};

/// `agentq keys …` with `env`; its output.
fn keys(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = agentq();
    c.arg("keys").args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// `agentq keys create …`: the key (the last line of stdout) and its id.
fn create_key(env: &[(&str, &str)], args: &[&str]) -> (String, String) {
    let mut all = vec!["create"];
    all.extend_from_slice(args);
    let out = keys(env, &all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let key = stdout.lines().last().unwrap().trim().to_string();
    let id = agentq_core::auth::key_id(&key)
        .unwrap_or_else(|| panic!("the last line is not a key: {stdout}"))
        .to_string();
    (key, id)
}

/// A raw HTTP/1.1 request (so the `Host` header is exactly what the test says); the
/// status and body.
fn raw(url: &str, request: &str) -> (u16, Value) {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn ids_of(out: &Output) -> Vec<String> {
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn keys_created_by_the_binary_open_the_api_until_revoked() {
    let db = migrated_db();
    let redis = RedisServer::start().unwrap();
    let env = [("AGENTQ_DATABASE_URL", db.as_str())];

    // Bad flags are named.
    let out = keys(
        &env,
        &["create", "--tenant", "acme", "--scopes", "sessions:delete"],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--scopes"),
        "{}",
        text(&out.stderr)
    );
    let out = keys(
        &env,
        &["create", "--tenant", "a b", "--scopes", "sessions:read"],
    );
    assert!(
        text(&out.stderr).contains("--tenant"),
        "{}",
        text(&out.stderr)
    );
    let out = keys(
        &env,
        &[
            "create",
            "--tenant",
            "acme",
            "--scopes",
            "admin",
            "--expires",
            "2001-01-01",
        ],
    );
    assert!(
        text(&out.stderr).contains("--expires"),
        "{}",
        text(&out.stderr)
    );

    let (rw, rw_id) = create_key(
        &env,
        &[
            "--tenant",
            "acme",
            "--scopes",
            "sessions:read,sessions:write",
            "--label",
            "ci",
            "--expires",
            "2999-01-01",
        ],
    );
    let (ro, _) = create_key(&env, &["--tenant", "acme", "--scopes", "sessions:read"]);
    let (other, _) = create_key(
        &env,
        &[
            "--tenant",
            "globex",
            "--scopes",
            "sessions:read,sessions:write",
        ],
    );
    let out = keys(&env, &["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    assert!(listing.contains(&rw_id) && listing.contains("acme") && listing.contains("ci"));
    assert!(listing.contains("2999-01-01"), "{listing}");
    for secret in [&rw, &ro, &other] {
        assert!(
            !listing.contains(&secret[16..]),
            "a secret in the listing: {listing}"
        );
    }

    let mut sched = agentq();
    sched
        .args([
            "scheduler",
            "--addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .env("AGENTQ_DATABASE_URL", &db)
        .env("AGENTQ_REDIS_URL", redis.url())
        .env("AGENTQ_KEY_CACHE_SECS", "1");
    let s = Dev::spawn(&mut sched);

    // No key: refused, and told where the key goes.
    let out = client_as(&s.url, None, &["sessions", "--json"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("401") && err.contains("unauthorized"), "{err}");
    assert!(
        err.contains("--api-key") && err.contains("AGENTQ_API_KEY"),
        "{err}"
    );
    // The printed key works; the read-only one cannot submit.
    let out = client_as(&s.url, Some(&rw), &["submit", "hello"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mine = text(&out.stdout).trim().to_string();
    let out = client_as(&s.url, Some(&ro), &["submit", "hello"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("403") && err.contains("sessions:write"),
        "{err}"
    );
    // Another tenant neither lists nor reads it.
    assert_eq!(
        ids_of(&client_as(&s.url, Some(&ro), &["sessions", "--json"])),
        std::slice::from_ref(&mine)
    );
    assert!(ids_of(&client_as(&s.url, Some(&other), &["sessions", "--json"])).is_empty());
    let out = client_as(&s.url, Some(&other), &["status", &mine]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );

    // Revoked: refused once the scheduler's cached entry (1 s here) is stale.
    let out = keys(&env, &["revoke", &rw_id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = poll_until(
        "the revoked key to stop working",
        Duration::from_secs(30),
        || {
            let out = client_as(&s.url, Some(&rw), &["sessions", "--json"]);
            if out.status.success() {
                None
            } else {
                Some(text(&out.stderr))
            }
        },
    );
    assert!(err.contains("revoked"), "{err}");
    let listing = text(&keys(&env, &["list"]).stdout);
    let line = listing.lines().find(|l| l.starts_with(&rw_id)).unwrap();
    assert!(
        !line.trim_end().ends_with('-'),
        "no revocation time: {line}"
    );
    let out = keys(&env, &["revoke", "000000000000"]);
    assert!(!out.status.success());
}

#[test]
fn dev_on_loopback_checks_hosts_and_presented_keys() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("agentq.db");
    let db_s = db.to_str().unwrap();
    let env = [("AGENTQ_DB", db_s)];
    let (acme, _) = create_key(
        &env,
        &[
            "--tenant",
            "acme",
            "--scopes",
            "sessions:read,sessions:write",
        ],
    );
    let mut cmd = agentq();
    cmd.args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
        .arg(&db);
    let dev = Dev::spawn(&mut cmd);

    // Keyless on loopback: the tenant `default` (the two-command start).
    let out = client_as(&dev.url, None, &["submit", "local"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let local = text(&out.stdout).trim().to_string();
    // A presented key is checked, and it names its tenant.
    let out = client_as(&dev.url, Some(&acme), &["submit", "acme's"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let theirs = text(&out.stdout).trim().to_string();
    assert_eq!(
        ids_of(&client_as(&dev.url, None, &["sessions", "--json"])),
        std::slice::from_ref(&local)
    );
    assert_eq!(
        ids_of(&client_as(&dev.url, Some(&acme), &["sessions", "--json"])),
        [theirs]
    );
    let bad = format!("aq_{}_{}", "0".repeat(12), "1".repeat(64));
    let out = client_as(&dev.url, Some(&bad), &["sessions", "--json"]);
    assert!(!out.status.success());

    // DNS rebinding: a page at attacker.example that resolved to 127.0.0.1.
    let path = format!("/v1/sessions/{local}");
    let (status, body) = raw(
        &dev.url,
        &format!("GET {path} HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(body["error"]["field"], "Host");
    let port = dev.url.rsplit(':').next().unwrap();
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (status, body) = raw(
            &dev.url,
            &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status, 200, "{host}: {body}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn dev_refuses_a_public_address_without_an_admin_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("agentq.db");
    let out = agentq()
        .args(["dev", "--addr", "0.0.0.0:0", "--workers", "1", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--addr") && err.contains("AGENTQ_ADMIN_KEY"),
        "{err}"
    );

    // With the admin key it starts, and checks keys as the scheduler does.
    let port = free_port();
    let mut cmd = agentq();
    cmd.args([
        "dev",
        "--addr",
        &format!("0.0.0.0:{port}"),
        "--workers",
        "1",
        "--db",
    ])
    .arg(&db)
    .env("AGENTQ_ADMIN_KEY", "dev-admin-key-0123456789abcdef-0123");
    let _dev = Dev::spawn(&mut cmd);
    let url = format!("http://127.0.0.1:{port}");
    let out = client_as(&url, None, &["sessions", "--json"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let out = client_as(
        &url,
        Some("dev-admin-key-0123456789abcdef-0123"),
        &["sessions", "--json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// An admin key opens every tenant: one short enough to guess is refused at start, by the
/// scheduler and by `dev`, before anything is opened, naming the variable and the bound.
#[test]
fn a_short_admin_key_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("agentq.db");
    let short = "s3cret-but-31-bytes-long-012345";
    assert_eq!(short.len(), 31);
    // An address this host does not have: were the key let through, `dev` would fail to
    // listen and exit rather than serve (and this test hang on it).
    let dev = agentq()
        .args([
            "dev",
            "--addr",
            "203.0.113.1:7700",
            "--workers",
            "1",
            "--db",
        ])
        .arg(&db)
        .env("AGENTQ_ADMIN_KEY", short)
        .output()
        .unwrap();
    // The scheduler is refused before it looks for Redis or Postgres (there are none).
    let scheduler = agentq()
        .args(["scheduler", "--addr", "127.0.0.1:0"])
        .env("AGENTQ_ADMIN_KEY", short)
        .env("AGENTQ_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("AGENTQ_REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    for (what, out) in [("dev", dev), ("scheduler", scheduler)] {
        assert!(!out.status.success(), "{what}");
        let err = text(&out.stderr);
        assert!(
            err.contains("AGENTQ_ADMIN_KEY is 31 bytes long") && err.contains("at least 32"),
            "{what}: {err}"
        );
        assert!(!err.contains(short), "{what} printed the key: {err}");
        assert!(!err.contains("started"), "{what}: {err}");
    }
    assert!(
        !db.exists(),
        "dev opened its database before refusing the key"
    );
}
