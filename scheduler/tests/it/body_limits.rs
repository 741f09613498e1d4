//! Every route that takes a JSON body answers a body past its limit with its 413, never
//! with a reset: declared too large (`content-length`), at once, before the client has sent
//! a byte of it (the client here sends the headers only, then reads); sent chunked, after
//! reading what the client still sends (a body just past the limit is read whole), so a
//! client that writes its whole body before reading gets the answer. The 413 is the
//! API's error body, naming the limit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use agentq_core::WorkQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_scheduler::{
    MAX_UPLOAD_BYTES, Scheduler, SchedulerSettings, body_limit, openapi_json, router,
};
use agentq_testkit::{RedisServer, shared_postgres};

const ADMIN_KEY: &str = "body-limits-admin-key";
/// Longest wait for an answer: a server that waits for a body it should have refused
/// fails the test here instead of hanging it.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// Every (method, path pattern) whose operation takes a JSON body, from the document.
fn json_routes() -> Vec<(Method, String)> {
    let doc: Value = serde_json::from_str(&openapi_json()).unwrap();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if op["requestBody"]["content"]["application/json"].is_object() {
                out.push((method.to_uppercase().parse().unwrap(), path.clone()));
            }
        }
    }
    out
}

/// A pattern's path with every parameter filled in (no such object: the body is refused
/// before anything is looked up).
fn concrete(pattern: &str) -> String {
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').unwrap() + start;
        out.push_str("acme");
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn head(method: &Method, path: &str, addr: &str, framing: &str, content_type: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {ADMIN_KEY}\r\n\
         content-type: {content_type}\r\n{framing}\r\n"
    )
}

/// One HTTP/1.1 answer read off `conn`: its status and its body as JSON.
async fn answer(conn: &mut TcpStream, what: &str) -> (u16, Value) {
    let mut buf = Vec::new();
    let read = async {
        let mut piece = [0u8; 8192];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    let status = head[9..12].parse().unwrap();
                    let body =
                        serde_json::from_slice(&buf[end + 4..end + 4 + len]).unwrap_or(Value::Null);
                    return (status, body);
                }
            }
            match conn.read(&mut piece).await {
                Ok(0) => panic!("{what}: the connection closed before the answer: {buf:?}"),
                Ok(n) => buf.extend_from_slice(&piece[..n]),
                Err(e) => panic!("{what}: reading the answer failed ({e}), not a 413"),
            }
        }
    };
    tokio::time::timeout(ANSWER_WITHIN, read)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {ANSWER_WITHIN:?}"))
}

fn assert_too_large(status: u16, body: &Value, limit: u64, what: &str) {
    assert_eq!(status, 413, "{what}: {body}");
    assert_eq!(body["error"]["code"], "too_large", "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&limit.to_string()),
        "{what}: the message names the limit {limit}: {body}"
    );
}

/// Headers declaring `limit + 1` bytes and nothing more: the answer comes without a byte
/// of the body.
async fn declared(addr: &str, method: &Method, path: &str, content_type: &str, limit: u64) {
    let what = format!("{method} {path} declaring {} bytes", limit + 1);
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let framing = format!("content-length: {}\r\n", limit + 1);
    conn.write_all(head(method, path, addr, &framing, content_type).as_bytes())
        .await
        .unwrap();
    let (status, body) = answer(&mut conn, &what).await;
    assert_too_large(status, &body, limit, &what);
}

/// `limit + 1` bytes sent chunked, all of them, before the answer is read.
async fn chunked(addr: &str, method: &Method, path: &str, limit: usize) {
    let what = format!("{method} {path} sending {} bytes chunked", limit + 1);
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let framing = "transfer-encoding: chunked\r\n";
    conn.write_all(head(method, path, addr, framing, "application/json").as_bytes())
        .await
        .unwrap();
    let piece = vec![b' '; 64 * 1024];
    let mut left = limit + 1;
    while left > 0 {
        let n = left.min(piece.len());
        let mut chunk = format!("{n:x}\r\n").into_bytes();
        chunk.extend_from_slice(&piece[..n]);
        chunk.extend_from_slice(b"\r\n");
        if let Err(e) = conn.write_all(&chunk).await {
            panic!("{what}: the server stopped reading before the end ({e}): a reset");
        }
        left -= n;
    }
    conn.write_all(b"0\r\n\r\n").await.unwrap();
    let (status, body) = answer(&mut conn, &what).await;
    assert_too_large(status, &body, limit as u64, &what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_route_answers_a_body_past_its_limit_with_its_413() {
    let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
    queue.ensure_queue("default").await.unwrap();
    let mut settings = SchedulerSettings::default();
    settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
    let state = Scheduler::new(Arc::new(store), queue, settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let app = router(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let routes = json_routes();
    for must in [
        "/v1/sessions",
        "/v1/batches",
        "/mcp",
        "/v1/webhooks/{id}/redrive",
    ] {
        assert!(
            routes.iter().any(|(_, p)| p == must),
            "{must} in {routes:?}"
        );
    }
    for (method, pattern) in &routes {
        let limit = body_limit(&state, method, pattern);
        let path = concrete(pattern);
        declared(&addr, method, &path, "application/json", limit as u64).await;
        chunked(&addr, method, &path, limit).await;
    }
    // A JSON Lines upload is held to its own bound as a whole.
    declared(
        &addr,
        &Method::POST,
        "/v1/batches",
        "application/x-ndjson",
        MAX_UPLOAD_BYTES,
    )
    .await;
}
