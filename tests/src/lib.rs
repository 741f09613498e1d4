//! agentq-testkit: what the tests share. A fake LLM HTTP server ([`fake_llm`]), one that
//! enforces rate limits like a real provider ([`rate_limited`]), and private
//! Redis and Postgres processes the tests start, stop and restart ([`services`]): all three
//! from `agentq-fixtures` (which `agentq bench` runs on too), re-exported here; and the
//! tests' own helpers (the recorded provider responses, a graceful-stop check, Pythons
//! with the MCP SDK and with schemathesis: [`python`], the real MCP servers: [`mcp`],
//! Anthropic answers written by hand: [`anthropic`], npm packages for the TypeScript
//! client: [`node`]).

pub mod anthropic;
pub mod mcp;
pub mod node;

pub use agentq_fixtures::{
    Durability, FakeLlm, FakeResponse, Limits, MotoServer, PostgresOptions, PostgresServer,
    RateLimitedConfig, RateLimitedLlm, RateStats, RecordedRequest, RedisCluster, RedisServer,
    Reply, fake_llm, rate_limited, services, shared_postgres, shared_postgres_shard,
};

pub mod python;
mod redis;
pub use redis::{Redis, pttl};

/// The last `n` lines of the log file at `path` (empty if it cannot be read): what a
/// test prints of a process it started when it fails.
pub fn log_tail(path: &std::path::Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A fresh database on `server`, a copy of one migrated once per server and test binary
/// (a store opened on it finds nothing to migrate, and checks that) instead of the
/// schema's hundreds of statements per test: the store's contract binary, whose every test
/// opens one or two stores, took 141 s among CI's lanes with them and 80 s with copies.
/// For a test that needs an empty database, [`PostgresServer::fresh_database`].
pub fn migrated_database(server: &PostgresServer) -> anyhow::Result<String> {
    server.fresh_database_from("agentq_migrated", |url| {
        let url = url.to_string();
        // On a thread of its own: the caller may be on a runtime's thread already.
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(async {
                    let store = agentq_store::pg::PgStore::connect(&url, 1).await?;
                    store.migrate().await?;
                    store.close().await;
                    anyhow::Ok(())
                })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the template's migration panicked"))?
    })
}

/// SIGTERM `child` and wait for it to exit; panics (naming `what`) if it is still running
/// after `timeout`. For tests that check a process stops gracefully.
pub fn sigterm_and_wait(
    child: &mut std::process::Child,
    timeout: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    if let Err(e) = services::signal(child.id(), "TERM") {
        panic!("cannot SIGTERM {what}: {e:#}");
    }
    match services::wait_timeout(child, timeout) {
        Ok(Some(status)) => status,
        Ok(None) => panic!("{what} ignored SIGTERM for {timeout:?}"),
        Err(e) => panic!("waiting for {what}: {e}"),
    }
}

/// The root of the repository (the workspace's directory), for tests that read its
/// files (deploy manifests, dashboards, the example configuration).
pub fn repo_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// Every `.rs` file under `dir`, recursively, in path order (unreadable entries are a
/// test failure: a tree the tests read must be whole).
pub fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .collect();
    entries.sort();
    let mut files = Vec::new();
    for p in entries {
        if p.is_dir() {
            files.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    files
}

/// Directory of the recorded provider responses (`../shared/fixtures/llm`).
pub fn fixtures_dir() -> std::path::PathBuf {
    if let Ok(d) = std::env::var("AGENTQ_FIXTURES") {
        return d.into();
    }
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let in_repo = here.join("fixtures/llm");
    if in_repo.is_dir() {
        return in_repo;
    }
    here.join("../../shared/fixtures/llm")
}

/// Read one fixture file as bytes, exactly as recorded.
pub fn fixture(name: &str) -> Vec<u8> {
    let p = fixtures_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}
