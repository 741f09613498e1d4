//! The service harness itself: private Redis and Postgres start, answer, stop, crash and
//! come back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use agentq_testkit::{PostgresServer, RedisServer, shared_postgres};

#[test]
fn redis_starts_pings_and_restarts_on_the_same_port() {
    let t = Instant::now();
    let mut redis = RedisServer::start().unwrap();
    eprintln!("redis start: {:?}", t.elapsed());
    let port = redis.port();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{port}"));
    redis.ping().unwrap();

    let t = Instant::now();
    redis.restart().unwrap();
    eprintln!("redis restart: {:?}", t.elapsed());
    assert_eq!(redis.port(), port);
    redis.ping().unwrap();

    redis.kill();
    assert!(!redis.is_running());
    assert!(redis.ping().is_err(), "a killed redis must not answer");
    assert_port_is_held(port);
    let t = Instant::now();
    redis.restart().unwrap();
    eprintln!("redis restart after SIGKILL: {:?}", t.elapsed());
    redis.ping().unwrap();

    redis.stop().unwrap();
    assert!(redis.ping().is_err(), "a stopped redis must not answer");
    assert_port_is_held(port);
    redis.restart().unwrap();
    redis.ping().unwrap();
}

/// A down server's port refuses connections and cannot be bound by another process until
/// the server starts again: left free, another test's server could take it, and the down
/// server's clients would reach that one and wait for answers instead of being refused.
fn assert_port_is_held(port: u16) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let refused = TcpStream::connect(addr).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{refused}");
    // Binding without SO_REUSEADDR conflicts with any socket bound to the port, as binding
    // port 0 skips every port in use.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    let taken = other.bind(addr).unwrap_err();
    assert_eq!(taken.kind(), ErrorKind::AddrInUse, "{taken}");
}

#[test]
fn redis_dir_is_removed_on_drop() {
    let redis = RedisServer::start().unwrap();
    let dir = redis.dir().to_path_buf();
    assert!(dir.is_dir());
    drop(redis);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn shared_postgres_gives_each_test_a_fresh_database() {
    let t = Instant::now();
    let pg = shared_postgres().unwrap();
    eprintln!(
        "shared postgres (initdb + start, or already up): {:?}",
        t.elapsed()
    );
    assert!(pg.base_url().starts_with("postgres://postgres@127.0.0.1:"));

    let t = Instant::now();
    let a = pg.fresh_database().unwrap();
    eprintln!("fresh database: {:?}", t.elapsed());
    let b = pg.fresh_database().unwrap();
    assert_ne!(a, b);
    let name_a = a.rsplit('/').next().unwrap();
    let name_b = b.rsplit('/').next().unwrap();

    pg.psql(&a, "create table t (x int); insert into t values (42)")
        .unwrap();
    assert_eq!(pg.psql(&a, "select x from t").unwrap(), "42");
    // Databases are isolated.
    assert!(pg.psql(&b, "select x from t").is_err());
    assert_eq!(pg.psql(name_b, "select 1").unwrap(), "1");
    assert_eq!(
        pg.psql(
            "postgres",
            &format!("select count(*) from pg_database where datname in ('{name_a}', '{name_b}')")
        )
        .unwrap(),
        "2"
    );
    // The same server for every caller in this process.
    assert_eq!(shared_postgres().unwrap().port(), pg.port());
}

#[test]
fn private_postgres_survives_sigkill_and_restarts() {
    let t = Instant::now();
    let mut pg = PostgresServer::start_crash_safe().unwrap();
    eprintln!("private postgres initdb + start: {:?}", t.elapsed());
    let port = pg.port();
    let db = pg.create_database("crashme").unwrap();
    assert_eq!(db, format!("postgres://postgres@127.0.0.1:{port}/crashme"));
    assert_eq!(pg.psql(&db, "select 1").unwrap(), "1");
    pg.psql(&db, "create table t (x int); insert into t values (7)")
        .unwrap();

    // Hold a backend open while the server dies, like a connected worker would.
    let t = Instant::now();
    pg.kill();
    eprintln!("postgres SIGKILL: {:?}", t.elapsed());
    assert!(!pg.is_running());
    assert!(
        pg.psql(&db, "select 1").is_err(),
        "a killed postgres must not answer"
    );
    assert_port_is_held(port);

    let t = Instant::now();
    pg.restart().unwrap();
    eprintln!("postgres restart with crash recovery: {:?}", t.elapsed());
    assert_eq!(pg.port(), port);
    assert_eq!(
        pg.psql(&db, "select x from t").unwrap(),
        "7",
        "committed row lost"
    );

    let t = Instant::now();
    pg.restart().unwrap();
    eprintln!("postgres clean restart: {:?}", t.elapsed());
    assert_eq!(pg.psql(&db, "select count(*) from t").unwrap(), "1");

    let dir = pg.data_dir().parent().unwrap().to_path_buf();
    drop(pg);
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn postgres_options_set_durability_and_the_connection_limit() {
    use agentq_testkit::{Durability, PostgresOptions};
    let pg = PostgresServer::start_with(PostgresOptions {
        durability: Durability::Durable,
        max_connections: 100,
        shared_buffers_mb: 64,
    })
    .unwrap();
    let show = |name: &str| pg.psql("postgres", &format!("SHOW {name}")).unwrap();
    assert_eq!(show("fsync"), "on");
    assert_eq!(show("synchronous_commit"), "on");
    assert_eq!(show("full_page_writes"), "on");
    assert_eq!(show("max_connections"), "100");
    assert_eq!(show("shared_buffers"), "64MB");
    // The tests' default stays the fast one.
    let fast = agentq_testkit::shared_postgres().unwrap();
    assert_eq!(fast.psql("postgres", "SHOW fsync").unwrap(), "off");
    assert_eq!(
        fast.psql("postgres", "SHOW max_connections").unwrap(),
        "300"
    );
}

#[tokio::test]
async fn a_stateless_fake_llm_answers_from_the_raw_body_and_only_counts() {
    use agentq_testkit::{FakeLlm, FakeResponse};
    let fake = FakeLlm::start_stateless(std::time::Duration::ZERO, |body| {
        FakeResponse::sse_chunks(vec![bytes_of(&format!("data: {} bytes\n\n", body.len()))])
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    for body in ["{}", "{\"messages\":[]}"] {
        let resp = client
            .post(format!("{}/v1/chat/completions", fake.url))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["content-type"],
            "text/event-stream",
            "{resp:?}"
        );
        assert_eq!(
            resp.content_length(),
            Some(format!("data: {} bytes\n\n", body.len()).len() as u64)
        );
        assert_eq!(
            resp.text().await.unwrap(),
            format!("data: {} bytes\n\n", body.len())
        );
    }
    assert_eq!(fake.request_count(), 2);
    assert!(
        fake.requests().is_empty(),
        "a stateless fake records nothing"
    );
}

fn bytes_of(s: &str) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(s.as_bytes())
}
