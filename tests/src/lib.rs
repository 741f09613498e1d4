//! agentq-testkit: what the tests share. A fake LLM HTTP server ([`fake_llm`]) and private
//! Redis and Postgres processes the tests start, stop and restart ([`services`]).

pub mod fake_llm;
pub mod services;

pub use fake_llm::{FakeLlm, FakeResponse, RecordedRequest};
pub use services::{PostgresServer, RedisServer, shared_postgres};

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
