//! API keys through the real `agentq` binary: `keys create | list | revoke` against
//! Postgres (the key printed on the last line works against `agentq scheduler`; a revoked
//! one stops working once the key cache lets go of it; a key without the scope gets a 403
//! naming it; a keyless client is told where a key goes) and against the embedded file
//! (`agentq dev` checks a presented key, keeps tenants apart, refuses a non-loopback
//! `Host`, and refuses to listen on a public address without `AGENTQ_ADMIN_KEY`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use agentq_testkit::{RedisServer, shared_postgres};
use serde_json::Value;

fn agentq() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentq"));
    for k in [
        "AGENTQ_DATABASE_URL",
        "AGENTQ_REDIS_URL",
        "AGENTQ_API_URL",
        "AGENTQ_API_ADDR",
        "AGENTQ_CONFIG",
        "AGENTQ_ADMIN_KEY",
        "AGENTQ_API_KEY",
        "AGENTQ_DB",
        "AGENTQ_METRICS_ADDR",
        "AGENTQ_KEY_CACHE_SECS",
    ] {
        c.env_remove(k);
    }
    c.current_dir(std::env::temp_dir());
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Server {
    child: Child,
    url: String,
    _drain: std::thread::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawn `cmd` and wait for its "listening on <url>" line.
fn serve(mut cmd: Command) -> Server {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    let url = loop {
        assert!(Instant::now() < deadline, "no listening line: {seen}");
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "exited: {seen}");
        if let Some(i) = line.find("listening on ") {
            break line[i + "listening on ".len()..].trim().to_string();
        }
        seen.push_str(&line);
    };
    let drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    Server {
        child,
        url,
        _drain: drain,
    }
}

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

fn client(api: &str, key: Option<&str>, args: &[&str]) -> Output {
    let mut c = agentq();
    c.env("AGENTQ_API_URL", api).args(args);
    if let Some(k) = key {
        c.env("AGENTQ_API_KEY", k);
    }
    c.output().unwrap()
}

fn migrated_db() -> String {
    let db = shared_postgres().unwrap().fresh_database().unwrap();
    let out = agentq()
        .arg("migrate")
        .env("AGENTQ_DATABASE_URL", &db)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    db
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
    let s = serve(sched);

    // No key: refused, and told where the key goes.
    let out = client(&s.url, None, &["sessions", "--json"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("401") && err.contains("unauthorized"), "{err}");
    assert!(
        err.contains("--api-key") && err.contains("AGENTQ_API_KEY"),
        "{err}"
    );
    // The printed key works; the read-only one cannot submit.
    let out = client(&s.url, Some(&rw), &["submit", "hello"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mine = text(&out.stdout).trim().to_string();
    let out = client(&s.url, Some(&ro), &["submit", "hello"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("403") && err.contains("sessions:write"),
        "{err}"
    );
    // Another tenant neither lists nor reads it.
    assert_eq!(
        ids_of(&client(&s.url, Some(&ro), &["sessions", "--json"])),
        std::slice::from_ref(&mine)
    );
    assert!(ids_of(&client(&s.url, Some(&other), &["sessions", "--json"])).is_empty());
    let out = client(&s.url, Some(&other), &["status", &mine]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );

    // Revoked: refused once the scheduler's cached entry (1 s here) is stale.
    let out = keys(&env, &["revoke", &rw_id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = client(&s.url, Some(&rw), &["sessions", "--json"]);
        if !out.status.success() {
            let err = text(&out.stderr);
            assert!(err.contains("revoked"), "{err}");
            break;
        }
        assert!(Instant::now() < deadline, "the revoked key still works");
        std::thread::sleep(Duration::from_millis(200));
    }
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
    let dev = serve(cmd);

    // Keyless on loopback: the tenant `default` (the two-command start).
    let out = client(&dev.url, None, &["submit", "local"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let local = text(&out.stdout).trim().to_string();
    // A presented key is checked, and it names its tenant.
    let out = client(&dev.url, Some(&acme), &["submit", "acme's"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let theirs = text(&out.stdout).trim().to_string();
    assert_eq!(
        ids_of(&client(&dev.url, None, &["sessions", "--json"])),
        std::slice::from_ref(&local)
    );
    assert_eq!(
        ids_of(&client(&dev.url, Some(&acme), &["sessions", "--json"])),
        [theirs]
    );
    let bad = format!("aq_{}_{}", "0".repeat(12), "1".repeat(64));
    let out = client(&dev.url, Some(&bad), &["sessions", "--json"]);
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
    .env("AGENTQ_ADMIN_KEY", "dev-admin-key");
    let _dev = serve(cmd);
    let url = format!("http://127.0.0.1:{port}");
    let out = client(&url, None, &["sessions", "--json"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    let out = client(&url, Some("dev-admin-key"), &["sessions", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
