//! The API's listener against hostile clients, with the real server (`serve`) on a real
//! Postgres and Redis: caps on connections and event streams (503 with `Retry-After` and
//! a JSON body), header and body read timeouts (trickling and idle connections are
//! closed), and JSON bodies on 414 and 431. Outcomes only: every wait is a generous
//! bound on a loop, never a timing assertion.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::auth::{self, Scope};
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::workspace::InputFile;
use agentq_core::{KeyStore, NewSession, SessionStore};
use agentq_scheduler::{Scheduler, SchedulerSettings, router, serve};
use agentq_testkit::{RedisServer, shared_postgres};

use common::wait_until;

const ADMIN_KEY: &str = "test-admin-key";
/// The bound on every wait for the server to act: generous, the outcome is what counts.
const PATIENCE: Duration = Duration::from_secs(60);

struct Env {
    addr: SocketAddr,
    store: Arc<PgStore>,
    queue: Arc<RedisQueue>,
    stop: CancellationToken,
    _redis: RedisServer,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Env {
    async fn start(tune: impl FnOnce(&mut SchedulerSettings)) -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        tune(&mut settings);
        let limits = settings.serve;
        let stop = CancellationToken::new();
        let state =
            Scheduler::new(store.clone(), queue.clone(), settings).with_shutdown(stop.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router(state), limits, stop.clone()));
        Env {
            addr,
            store,
            queue,
            stop,
            _redis: redis,
        }
    }

    async fn session(&self) -> String {
        let (row, _) = self
            .store
            .create_session(&NewSession::root(SessionSpec::new("hello"), "default"))
            .await
            .unwrap();
        row.id
    }

    /// A stored key of `tenant` that may read sessions; the key itself.
    async fn key(&self, tenant: &str) -> String {
        let (new, key) = auth::generate(tenant, vec![Scope::SessionsRead], None, None).unwrap();
        self.store.create_key(&new).await.unwrap();
        key
    }

    /// `GET path` with `key` on the open connection `s`, which stays open for more.
    async fn get_on(s: &mut TcpStream, path: &str, key: &str) -> Answer {
        let req = format!(
            "GET {path} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {key}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        read_answer(s).await
    }

    async fn tcp(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// `GET path` with the admin key on a fresh connection, reading the answer's head
    /// (and, unless it is an event stream, its body).
    async fn get(&self, path: &str) -> (Answer, TcpStream) {
        let mut s = self.tcp().await;
        let req = format!(
            "GET {path} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {ADMIN_KEY}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let a = read_answer(&mut s).await;
        (a, s)
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not a JSON body ({e}): {self:?}"))
    }
}

/// One answer from `s`: its head, and its body when it has a `content-length`.
async fn read_answer(s: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(PATIENCE, s.read(&mut chunk))
            .await
            .expect("no answer")
            .expect("read failed");
        assert!(
            n > 0,
            "closed without an answer: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut a = Answer {
        status,
        head,
        body: String::new(),
    };
    if let Some(len) = a.header("content-length") {
        let len: usize = len.parse().unwrap();
        let mut body = buf[head_end..].to_vec();
        while body.len() < len {
            let n = tokio::time::timeout(PATIENCE, s.read(&mut chunk))
                .await
                .expect("no body")
                .unwrap();
            assert!(n > 0, "closed mid-body");
            body.extend_from_slice(&chunk[..n]);
        }
        a.body = String::from_utf8_lossy(&body[..len]).to_string();
    }
    a
}

/// Whether the server closes `s` within [`PATIENCE`], while `trickle` is sent to it a
/// byte at a time (nothing when empty). Bytes the server answers with are returned.
async fn closed_by_server(s: &mut TcpStream, trickle: &[u8]) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut i = 0usize;
    while tokio::time::Instant::now() < deadline {
        if !trickle.is_empty() {
            let b = trickle[i % trickle.len()];
            i += 1;
            if s.write_all(&[b]).await.is_err() {
                return Some(got);
            }
        }
        match tokio::time::timeout(Duration::from_millis(200), s.read(&mut chunk)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trickling_header_is_cut_by_the_header_timeout() {
    let env = Env::start(|s| s.serve.header_read_timeout = Duration::from_secs(1)).await;
    let mut s = env.tcp().await;
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    // One header byte every 200 ms, forever: the connection must not stay open.
    let got = closed_by_server(&mut s, b"x-slow: aaaaaaaaaaaaaaaa\r\n").await;
    let got = got.expect("a trickling request head kept its connection open");
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_are_closed() {
    let env = Env::start(|s| s.serve.header_read_timeout = Duration::from_secs(1)).await;
    // Never a byte.
    let mut s = env.tcp().await;
    assert!(closed_by_server(&mut s, b"").await.is_some());
    // Idle after a request (keep-alive).
    let (a, mut s) = env.get("/healthz").await;
    assert_eq!(a.status, 200);
    assert!(closed_by_server(&mut s, b"").await.is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trickling_body_is_cut_with_a_408() {
    let env = Env::start(|s| s.serve.body_read_timeout = Duration::from_secs(1)).await;
    let mut s = env.tcp().await;
    let head = format!(
        "POST /v1/sessions HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {ADMIN_KEY}\r\n\
         content-type: application/json\r\ncontent-length: 100000\r\n\r\n{{\"prompt\": \""
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let got = closed_by_server(&mut s, b"a")
        .await
        .expect("a trickling body kept its connection open");
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "timeout");
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_past_the_cap_get_a_503() {
    let env = Env::start(|s| {
        s.serve.max_connections = 3;
        s.serve.header_read_timeout = Duration::from_secs(600);
    })
    .await;
    // Three idle connections hold every slot (a keyed request on each proves it is
    // served, and makes it one a newer connection cannot displace).
    let mut held = Vec::new();
    for _ in 0..3 {
        let (a, s) = env.get("/v1/sessions?limit=1").await;
        assert_eq!(a.status, 200);
        held.push(s);
    }
    let (a, _) = env.get("/healthz").await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.header("retry-after").as_deref(), Some("1"));
    assert_eq!(a.json()["error"]["code"], "overloaded");
    // A slot freed is served again.
    held.pop();
    wait_until("the freed slot to serve again", PATIENCE, || async {
        env.get("/healthz").await.0.status == 200
    })
    .await;
}

/// One key cannot take the listener's connections: past `max_connections_per_key`, a
/// request with that key is refused and its connection closed, while another key (of the
/// same tenant) and the connections the key already holds are served; a connection that
/// closes frees its place. Switching keys on one connection does not get past it.
#[tokio::test(flavor = "multi_thread")]
async fn connections_past_the_key_cap_get_a_503() {
    let env = Env::start(|s| {
        s.serve.max_connections_per_key = 2;
        s.serve.header_read_timeout = Duration::from_secs(600);
    })
    .await;
    let hog = env.key("t1").await;
    let other = env.key("t1").await;
    let path = "/v1/sessions?limit=1";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = env.tcp().await;
        let a = Env::get_on(&mut s, path, &hog).await;
        assert_eq!(a.status, 200, "{a:?}");
        held.push(s);
    }
    // A third connection of the same key is refused, and closed.
    let mut third = env.tcp().await;
    let a = Env::get_on(&mut third, path, &hog).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.header("retry-after").as_deref(), Some("1"));
    assert_eq!(a.json()["error"]["code"], "overloaded");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_connections_per_key"),
        "{a:?}"
    );
    assert!(closed_by_server(&mut third, b"").await.is_some());
    // Opening the connection with another key, then switching to the capped one, is
    // refused the same.
    let mut switched = env.tcp().await;
    assert_eq!(Env::get_on(&mut switched, path, &other).await.status, 200);
    assert_eq!(Env::get_on(&mut switched, path, &hog).await.status, 503);
    // The connections the key holds go on being served, and so does another key.
    for s in &mut held {
        assert_eq!(Env::get_on(s, path, &hog).await.status, 200);
    }
    let mut s = env.tcp().await;
    assert_eq!(Env::get_on(&mut s, path, &other).await.status, 200);
    // A connection that closes gives its place back.
    drop(held.pop());
    wait_until(
        "the closed connection's place to be freed",
        PATIENCE,
        || async {
            let mut s = env.tcp().await;
            Env::get_on(&mut s, path, &hog).await.status == 200
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn event_streams_past_the_tenant_cap_get_a_503() {
    let env = Env::start(|s| s.streams.per_tenant = 2).await;
    let id = env.session().await;
    let path = format!("/v1/sessions/{id}/events");
    let (a, s1) = env.get(&path).await;
    assert_eq!(a.status, 200, "{a:?}");
    let (a, _s2) = env.get(&path).await;
    assert_eq!(a.status, 200, "{a:?}");
    let (a, _) = env.get(&path).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert!(a.header("retry-after").is_some(), "{a:?}");
    let v = a.json();
    assert_eq!(v["error"]["code"], "overloaded");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("tenant"),
        "{v}"
    );
    // A client that goes away frees its stream.
    drop(s1);
    wait_until("the stream to be freed", PATIENCE, || async {
        let (a, _s) = env.get(&path).await;
        assert!(matches!(a.status, 200 | 503), "{a:?}");
        a.status == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn overlong_uris_and_headers_get_json_bodies() {
    let env = Env::start(|_| {}).await;
    // Past the API's own limits.
    let (a, _) = env
        .get(&format!("/v1/sessions/{}", "a".repeat(20_000)))
        .await;
    assert_eq!(a.status, 414, "{a:?}");
    assert_eq!(a.json()["error"]["code"], "uri_too_long");
    let mut s = env.tcp().await;
    let req = format!(
        "GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-big: {}\r\n\r\n",
        "b".repeat(100_000)
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let a = read_answer(&mut s).await;
    assert_eq!(a.status, 431, "{a:?}");
    assert_eq!(a.json()["error"]["code"], "headers_too_large");

    // Refused by the HTTP parser itself: a target longer than it can hold, more
    // headers than it parses.
    let (a, _) = env
        .get(&format!("/v1/sessions/{}", "a".repeat(70_000)))
        .await;
    assert_eq!(a.status, 414, "{a:?}");
    assert_eq!(a.json()["error"]["code"], "uri_too_long");
    let mut s = env.tcp().await;
    let mut req = String::from("GET /healthz HTTP/1.1\r\nhost: localhost\r\n");
    for i in 0..200 {
        req.push_str(&format!("x-h{i}: v\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let a = read_answer(&mut s).await;
    assert_eq!(a.status, 431, "{a:?}");
    assert_eq!(a.json()["error"]["code"], "headers_too_large");
    assert_eq!(
        a.header("content-type").as_deref(),
        Some("application/json")
    );
}

/// The resident memory of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// The figure in docs/benchmarks.md: memory per open event stream, so how many one
/// scheduler holds in 1 GiB. Opens `AGENTQ_STREAMS` (default 4000) streams, one per
/// session, each a raw connection that has received one live event, and reports the
/// growth of this process's RSS (the client's sockets are in the same process: the
/// figure errs on the high side). Run with
/// `scripts/test -p agentq-scheduler --test serve stream_memory -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement, not a check"]
async fn stream_memory() {
    use agentq_core::EventStreams;
    use agentq_core::queue::EventRecord;

    let n: usize = std::env::var("AGENTQ_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let redis = RedisServer::start().unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
    let env = {
        let q = queue.clone();
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        settings.serve.max_connections = n + 100;
        settings.streams.total = n + 100;
        settings.streams.per_tenant = n + 100;
        let limits = settings.serve;
        let stop = CancellationToken::new();
        let state = Scheduler::new(store.clone(), q.clone(), settings).with_shutdown(stop.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, router(state), limits, stop.clone()));
        Env {
            addr,
            store,
            queue: q,
            stop,
            _redis: redis,
        }
    };
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(env.session().await);
    }
    // Warm up: one stream opened and closed, so lazily built parts are in the baseline.
    drop(env.get(&format!("/v1/sessions/{}/events", ids[0])).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss();
    let mut streams = Vec::with_capacity(n);
    for id in &ids {
        let (a, s) = env.get(&format!("/v1/sessions/{id}/events")).await;
        assert_eq!(a.status, 200, "{a:?}");
        streams.push(s);
    }
    let events: Vec<EventRecord> = ids
        .iter()
        .map(|id| EventRecord {
            session_id: id.clone(),
            id: String::new(),
            seq: 1,
            epoch: 1,
            data: r#"{"type":"text_delta","text":"hello"}"#.into(),
        })
        .collect();
    for chunk in events.chunks(500) {
        queue.append_events(chunk).await.unwrap();
    }
    let mut buf = [0u8; 4096];
    for s in &mut streams {
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("hello") {
            let k = tokio::time::timeout(PATIENCE, s.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(k > 0);
            got.extend_from_slice(&buf[..k]);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss();
    let per = after.saturating_sub(before) / n as u64;
    println!(
        "{n} streams: RSS {} MiB -> {} MiB, {per} bytes per stream, {} streams per GiB; \
         Redis connections: {}",
        before >> 20,
        after >> 20,
        (1u64 << 30) / per.max(1),
        env._redis.connected_clients().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_stops_reading_is_cut_by_the_write_timeout() {
    let env = Env::start(|s| {
        s.serve.max_connections = 1;
        s.serve.header_read_timeout = Duration::from_secs(600);
        s.serve.write_timeout = Duration::from_secs(1);
    })
    .await;
    let (big, _) = env
        .store
        .create_session(&NewSession::root(
            SessionSpec::new("a".repeat(1 << 20)),
            "default",
        ))
        .await
        .unwrap();
    // Pipelined requests for answers far larger than every socket buffer between them,
    // on a connection whose reader never reads: the server's writes block.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(env.addr).await.unwrap();
    let one = format!(
        "GET /v1/sessions/{} HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {ADMIN_KEY}\r\n\r\n",
        big.id
    );
    let burst = one.repeat(64);
    let (answering, answered) = tokio::sync::oneshot::channel();
    let writer = tokio::spawn(async move {
        let _ = s.write_all(burst.as_bytes()).await;
        // The first answer has begun (so the connection authenticated, and no newer one
        // may displace it); peeked at, never read.
        let mut first = [0u8; 1];
        let _ = s.peek(&mut first).await;
        let _ = answering.send(());
        // Held open, never read, until the test ends it.
        std::future::pending::<()>().await;
        drop(s);
    });
    tokio::time::timeout(PATIENCE, answered)
        .await
        .expect("no answer began")
        .unwrap();
    // The stuck connection holds the only slot until the server gives up on it.
    wait_until(
        "the server to give up on a client that never reads",
        PATIENCE,
        || async {
            let (a, _) = env.get("/healthz").await;
            assert!(matches!(a.status, 200 | 503), "{a:?}");
            a.status == 200
        },
    )
    .await;
    writer.abort();
}

/// Read `s` until `needle` arrives (bounded).
async fn read_until(s: &mut TcpStream, needle: &str) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(needle) {
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .expect("nothing arrived")
            .unwrap();
        assert!(n > 0, "closed before {needle:?} arrived");
        got.extend_from_slice(&buf[..n]);
    }
}

/// An event stream outlives the check of its key at the start: a key revoked while its
/// stream is open has the stream cut within the key cache's life, while another key's
/// stream of the same session goes on, and a new stream of the revoked key is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_keys_event_stream_is_cut() {
    use agentq_core::EventStreams;
    use agentq_core::queue::EventRecord;

    let env = Env::start(|s| s.auth.cache_ttl = Duration::from_secs(1)).await;
    let id = env.session().await;
    let path = format!("/v1/sessions/{id}/events");
    let doomed = env.key("default").await;
    let kept = env.key("default").await;
    let mut s1 = env.tcp().await;
    let a = Env::get_on(&mut s1, &path, &doomed).await;
    assert_eq!(a.status, 200, "{a:?}");
    let mut s2 = env.tcp().await;
    let a = Env::get_on(&mut s2, &path, &kept).await;
    assert_eq!(a.status, 200, "{a:?}");
    let revoked = env
        .store
        .revoke_key(auth::key_id(&doomed).unwrap())
        .await
        .unwrap();
    assert!(revoked.unwrap().revoked_at.is_some());
    assert!(
        closed_by_server(&mut s1, b"").await.is_some(),
        "the revoked key's stream stayed open"
    );
    env.queue
        .append_events(&[EventRecord {
            session_id: id.clone(),
            id: String::new(),
            seq: 1,
            epoch: 1,
            data: r#"{"type":"text_delta","text":"still-here"}"#.into(),
        }])
        .await
        .unwrap();
    read_until(&mut s2, "still-here").await;
    let mut s3 = env.tcp().await;
    let a = Env::get_on(&mut s3, &path, &doomed).await;
    assert_eq!(a.status, 401, "{a:?}");
}

/// A key that expires while its event stream is open has the stream cut at its expiry,
/// however long the key cache trusts the key's row.
#[tokio::test(flavor = "multi_thread")]
async fn an_expiring_keys_event_stream_is_cut_at_its_expiry() {
    let env = Env::start(|s| s.auth.cache_ttl = Duration::from_secs(3600)).await;
    let id = env.session().await;
    let (new, key) = auth::generate(
        "default",
        vec![Scope::SessionsRead],
        None,
        Some(chrono::Utc::now() + chrono::Duration::seconds(8)),
    )
    .unwrap();
    env.store.create_key(&new).await.unwrap();
    let mut s = env.tcp().await;
    let a = Env::get_on(&mut s, &format!("/v1/sessions/{id}/events"), &key).await;
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        closed_by_server(&mut s, b"").await.is_some(),
        "the expired key's stream stayed open"
    );
}

/// A revoked key's answer is cut however it is sent. A download the server hands to the
/// connection in one piece (a workspace file, read whole) used to be watched for its key
/// only when it had nothing ready, which it never has: a client reading it slowly went on
/// receiving it for as long as it liked after the key was revoked. The client here reads
/// 4 KiB at a time, pacing itself by a round trip on another connection, and is cut
/// before the end.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_keys_download_is_cut_while_a_slow_client_reads_it() {
    const SIZE: usize = 16 << 20;
    let env = Env::start(|s| {
        s.auth.cache_ttl = Duration::ZERO;
        s.serve.write_timeout = Duration::from_secs(600);
    })
    .await;
    let (row, _) = env
        .store
        .create_session(&NewSession {
            files: vec![InputFile {
                path: "big.bin".into(),
                data: vec![7u8; SIZE],
            }],
            ..NewSession::root(SessionSpec::new("hello"), "default")
        })
        .await
        .unwrap();
    let key = env.key("default").await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(env.addr).await.unwrap();
    let req = format!(
        "GET /v1/sessions/{}/files/big.bin HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {key}\r\n\r\n",
        row.id
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // The head, and whatever of the body came with it.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(PATIENCE, s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_string();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let mut body = got.len() - head_end;
    env.store
        .revoke_key(auth::key_id(&key).unwrap())
        .await
        .unwrap();
    let mut pace = env.tcp().await;
    // A slow client: 1 KiB between two other requests, so that reading the whole body
    // takes many times the key's re-check (a fast reader on an idle box used to finish
    // 16 MiB first).
    let mut slow = [0u8; 1024];
    let cut = loop {
        assert_eq!(healthz_on(&mut pace).await.status, 200);
        match tokio::time::timeout(PATIENCE, s.read(&mut slow)).await {
            Err(_) => panic!("nothing arrived and the connection stayed open"),
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => body += n,
        }
        if body >= SIZE {
            break false;
        }
    };
    assert!(
        cut,
        "the revoked key's download of {SIZE} bytes was read to its end"
    );
}

/// A connection from `ip` (a loopback address: each is another peer).
async fn tcp_from(env: &Env, ip: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    socket.connect(env.addr).await.unwrap()
}

/// `GET /healthz` (no key: the connection stays unauthenticated) on `s`.
async fn healthz_on(s: &mut TcpStream) -> Answer {
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    read_answer(s).await
}

/// One peer cannot hold more than `max_connections_per_peer` connections: each past it
/// closes the peer's oldest connection that never authenticated; once all of the peer's
/// connections authenticated, a new one is answered 503. Other peers are not affected.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_from_one_peer_are_capped() {
    let env = Env::start(|s| {
        s.serve.max_connections_per_peer = 3;
        s.serve.header_read_timeout = Duration::from_secs(600);
    })
    .await;
    let mut conns = Vec::new();
    for _ in 0..10 {
        conns.push(tcp_from(&env, "127.0.0.2").await);
    }
    // The seven oldest are closed for the newer ones; the three newest are served.
    for (i, s) in conns.iter_mut().enumerate().take(7) {
        assert!(
            closed_by_server(s, b"").await.is_some(),
            "idle connection {i} of one peer stayed open past the peer's cap"
        );
    }
    for s in conns.iter_mut().skip(7) {
        assert_eq!(healthz_on(s).await.status, 200);
    }
    // Three that authenticated cannot be displaced: a fourth is refused.
    let key = env.key("default").await;
    let mut keyed = Vec::new();
    for _ in 0..3 {
        let mut s = tcp_from(&env, "127.0.0.3").await;
        let a = Env::get_on(&mut s, "/v1/sessions?limit=1", &key).await;
        assert_eq!(a.status, 200, "{a:?}");
        keyed.push(s);
    }
    let mut fourth = tcp_from(&env, "127.0.0.3").await;
    let a = healthz_on(&mut fourth).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.header("retry-after").as_deref(), Some("1"));
    assert_eq!(a.json()["error"]["code"], "overloaded");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_connections_per_peer"),
        "{a:?}"
    );
    for s in &mut keyed {
        assert_eq!(
            Env::get_on(s, "/v1/sessions?limit=1", &key).await.status,
            200
        );
    }
    // Another peer is served all the while.
    let mut other = tcp_from(&env, "127.0.0.4").await;
    assert_eq!(healthz_on(&mut other).await.status, 200);
}

/// Unauthenticated idle connections from many peers fill the listener: a key holder's
/// new connection is still served (it displaces the oldest of them), and once it has
/// authenticated, no number of newer unauthenticated connections displaces it.
#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_request_is_served_when_unauthenticated_connections_fill_the_listener() {
    let env = Env::start(|s| {
        s.serve.max_connections = 6;
        s.serve.max_connections_per_peer = 2;
        s.serve.header_read_timeout = Duration::from_secs(600);
    })
    .await;
    let key = env.key("default").await;
    // Six connections from three peers, each served (so holding a slot) and idle.
    let mut attackers = Vec::new();
    for i in 0..6 {
        let mut s = tcp_from(&env, &format!("127.0.1.{}", 1 + i / 2)).await;
        assert_eq!(healthz_on(&mut s).await.status, 200);
        attackers.push(s);
    }
    let mut holder = tcp_from(&env, "127.0.2.1").await;
    let a = Env::get_on(&mut holder, "/v1/sessions?limit=1", &key).await;
    assert_eq!(a.status, 200, "{a:?}");
    // It took the place of the oldest.
    assert!(closed_by_server(&mut attackers[0], b"").await.is_some());
    // The attackers reconnect, from new addresses, many times over.
    for i in 0..20 {
        let mut s = tcp_from(&env, &format!("127.0.3.{}", 1 + i)).await;
        assert_eq!(healthz_on(&mut s).await.status, 200);
        attackers.push(s);
    }
    let a = Env::get_on(&mut holder, "/v1/sessions?limit=1", &key).await;
    assert_eq!(a.status, 200, "{a:?}");
    // And a second key holder still gets in.
    let mut second = tcp_from(&env, "127.0.2.2").await;
    let a = Env::get_on(&mut second, "/v1/sessions?limit=1", &key).await;
    assert_eq!(a.status, 200, "{a:?}");
}

/// A connection keeps its place only while its requests pass the key check. An attacker
/// who authenticated connections with a key used to keep them for good: after the key
/// was revoked (its requests now refused), or going on with requests that need no key
/// (`/healthz`, an unknown path) to stay clear of the idle timeout, they were never
/// displaced, and a key holder's new connection was answered 503. Now each is again the
/// oldest connection that did not authenticate, and makes way.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_whose_requests_stop_passing_the_key_check_makes_way() {
    let env = Env::start(|s| {
        s.serve.max_connections = 3;
        s.serve.header_read_timeout = Duration::from_secs(600);
        // Each request reads its key again: the revocation is seen at once.
        s.auth.cache_ttl = Duration::ZERO;
    })
    .await;
    let doomed = env.key("default").await;
    let pinger = env.key("default").await;
    let holder = env.key("default").await;
    let path = "/v1/sessions?limit=1";
    let mut held = Vec::new();
    for key in [&doomed, &pinger, &pinger] {
        let mut s = env.tcp().await;
        assert_eq!(Env::get_on(&mut s, path, key).await.status, 200);
        held.push(s);
    }
    let (a, _) = env.get("/healthz").await;
    assert_eq!(a.status, 503, "{a:?}");
    env.store
        .revoke_key(auth::key_id(&doomed).unwrap())
        .await
        .unwrap();
    // Each goes on without passing the key check.
    let a = Env::get_on(&mut held[0], path, &doomed).await;
    assert_eq!(a.status, 401, "{a:?}");
    assert_eq!(healthz_on(&mut held[1]).await.status, 200);
    held[2]
        .write_all(b"GET /no/such/route HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_answer(&mut held[2]).await.status, 404);
    // A key holder's connections take their places, one after the other.
    let mut holders = Vec::new();
    for _ in 0..3 {
        let mut s = env.tcp().await;
        let a = Env::get_on(&mut s, path, &holder).await;
        assert_eq!(a.status, 200, "{a:?}");
        holders.push(s);
    }
    for (i, s) in held.iter_mut().enumerate() {
        assert!(
            closed_by_server(s, b"").await.is_some(),
            "connection {i} kept its place"
        );
    }
    // Connections that authenticate again are kept: none of the holder's is displaced.
    for s in &mut holders {
        assert_eq!(Env::get_on(s, path, &holder).await.status, 200);
    }
}

/// A stored key of `tenant` that may create sessions.
async fn writer_key(env: &Env, tenant: &str) -> String {
    let (new, key) = auth::generate(tenant, vec![Scope::SessionsWrite], None, None).unwrap();
    env.store.create_key(&new).await.unwrap();
    key
}

/// A batch of one session whose body is exactly `len` bytes.
fn batch_of_len(len: usize) -> Vec<u8> {
    let shell = r#"[{"prompt":""}]"#;
    let body = format!(r#"[{{"prompt":"{}"}}]"#, "p".repeat(len - shell.len()));
    assert_eq!(body.len(), len);
    body.into_bytes()
}

/// The head of a batch of `len` bytes with `key`, asking to be told before the body is
/// sent (`Expect: 100-continue`): the server says `100 Continue` once it reads the body.
fn batch_head(key: &str, len: usize) -> String {
    format!(
        "POST /v1/sessions/batch HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {len}\r\nexpect: 100-continue\r\n\r\n"
    )
}

/// Batches being read and decoded hold `batch_decode_bytes` at most: one past it is
/// answered 503 with `Retry-After` before its body is read, a tenant holds at most half
/// of it (another tenant's batch still goes), a body larger than that half is a 413, and
/// the bytes are given back when a batch is done.
#[tokio::test(flavor = "multi_thread")]
async fn batches_past_the_decode_budget_get_a_503() {
    let env = Env::start(|s| {
        s.batch_decode_bytes = 200_000;
        s.serve.header_read_timeout = Duration::from_secs(600);
        s.serve.body_read_timeout = Duration::from_secs(600);
    })
    .await;
    let t1 = writer_key(&env, "t1").await;
    let t1_again = writer_key(&env, "t1").await;
    let t2 = writer_key(&env, "t2").await;
    let t3 = writer_key(&env, "t3").await;
    // A batch of t1 that the server started reading (it said `100 Continue`), held with
    // half of its body sent.
    let held = batch_of_len(60_000);
    let mut c1 = env.tcp().await;
    c1.write_all(batch_head(&t1, held.len()).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut c1).await.status, 100);
    c1.write_all(&held[..30_000]).await.unwrap();
    // Another of t1 would take the tenant past half the budget: 503, its body unread.
    let mut c2 = env.tcp().await;
    c2.write_all(batch_head(&t1_again, 60_000).as_bytes())
        .await
        .unwrap();
    let a = read_answer(&mut c2).await;
    assert_eq!(a.status, 503, "{a:?}");
    assert_eq!(a.header("retry-after").as_deref(), Some("1"));
    assert_eq!(a.json()["error"]["code"], "overloaded");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batch_decode_bytes"),
        "{a:?}"
    );
    // One larger than half the budget can never be read: 413.
    let mut big = env.tcp().await;
    big.write_all(batch_head(&t2, 100_001).as_bytes())
        .await
        .unwrap();
    let a = read_answer(&mut big).await;
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(a.json()["error"]["code"], "too_large");
    // Another tenant's goes, and one more of its own is held half sent...
    let mut c3 = env.tcp().await;
    let body = batch_of_len(60_000);
    c3.write_all(batch_head(&t2, body.len()).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut c3).await.status, 100);
    c3.write_all(&body).await.unwrap();
    let a = read_answer(&mut c3).await;
    assert_eq!(a.status, 201, "{a:?}");
    let held2 = batch_of_len(90_000);
    let mut c4 = env.tcp().await;
    c4.write_all(batch_head(&t2, held2.len()).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut c4).await.status, 100);
    // ...so that, with 150,000 of 200,000 bytes held, a third tenant's 60,000 are refused.
    let mut c5 = env.tcp().await;
    c5.write_all(batch_head(&t3, 60_000).as_bytes())
        .await
        .unwrap();
    let a = read_answer(&mut c5).await;
    assert_eq!(a.status, 503, "{a:?}");
    // The held batches complete and give their bytes back.
    c1.write_all(&held[30_000..]).await.unwrap();
    assert_eq!(read_answer(&mut c1).await.status, 201);
    c4.write_all(&held2).await.unwrap();
    assert_eq!(read_answer(&mut c4).await.status, 201);
    let body = batch_of_len(60_000);
    for key in [&t1_again, &t3] {
        let mut c = env.tcp().await;
        c.write_all(batch_head(key, body.len()).as_bytes())
            .await
            .unwrap();
        assert_eq!(read_answer(&mut c).await.status, 100);
        c.write_all(&body).await.unwrap();
        let a = read_answer(&mut c).await;
        assert_eq!(a.status, 201, "{a:?}");
    }
}

/// A batch sent in chunks, without a `Content-Length`, is held to the decode budget as it
/// arrives: past the tenant's half it is a 413 naming the setting, and the bytes it held
/// go back (a batch of the same tenant as large as that half is read next).
#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_batch_is_granted_as_it_arrives() {
    let env = Env::start(|s| {
        s.batch_decode_bytes = 200_000;
        s.serve.header_read_timeout = Duration::from_secs(600);
        s.serve.body_read_timeout = Duration::from_secs(600);
    })
    .await;
    let t1 = writer_key(&env, "t1").await;
    let mut c = env.tcp().await;
    let head = format!(
        "POST /v1/sessions/batch HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {t1}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    // 110,000 bytes of a batch that never ends, in chunks of 10,000.
    let body = batch_of_len(200_000);
    for piece in body.chunks(10_000).take(11) {
        let chunk = [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat();
        // The server may answer (and close) before the last chunk is sent.
        if c.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let a = read_answer(&mut c).await;
    assert_eq!(a.status, 413, "{a:?}");
    assert_eq!(a.json()["error"]["code"], "too_large");
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batch_decode_bytes"),
        "{a:?}"
    );
    // What it held was given back: the tenant's whole half is granted to the next one.
    let full = batch_of_len(100_000);
    let mut next = env.tcp().await;
    next.write_all(batch_head(&t1, full.len()).as_bytes())
        .await
        .unwrap();
    assert_eq!(read_answer(&mut next).await.status, 100);
    next.write_all(&full).await.unwrap();
    let a = read_answer(&mut next).await;
    assert_eq!(a.status, 201, "{a:?}");
}
