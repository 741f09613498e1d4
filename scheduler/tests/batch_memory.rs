//! A batch's memory: parsing holds about twice its body (the body and the requests built
//! from it), and the whole request through the API about four times (the statement's
//! arguments and the rows it answers on top) where it took seven. Measured as this
//! process's peak resident size (the kernel's high-water mark, reset through
//! `/proc/self/clear_refs`); the binary holds this one test so that nothing else
//! allocates meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use agentq_core::WorkQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_scheduler::request::{Limits, parse_batch_bytes};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::{reset_peak, status_kb};

/// `items` sessions of about `6 * size` bytes each.
fn big_batch(items: usize, size: usize) -> Vec<u8> {
    let mut body = String::with_capacity(61 * 1024 * 1024);
    body.push('[');
    for i in 0..items {
        if i > 0 {
            body.push(',');
        }
        let prompt = format!("{i} {}", "lorem ipsum ".repeat(size / 2));
        body.push_str(
            &serde_json::json!({
                "prompt": prompt,
                "system": "be brief",
                "mode": "act",
                "max_iterations": 5,
                "tools": ["read_file", "grep"],
                "metadata": {"user": format!("u{i}"), "tags": ["a", "b"]},
                "idempotency_key": format!("key-{i}"),
            })
            .to_string(),
        );
    }
    body.push(']');
    body.into_bytes()
}

#[tokio::test]
async fn a_batch_takes_about_twice_its_size_to_parse_and_four_times_to_create() {
    // As reported: 10,000 sessions of about 6 KB each, a 60 MB body.
    let items = 10_000;
    let body = big_batch(items, 1000);
    let body_kb = (body.len() / 1024) as u64;
    assert!(body_kb > 55 * 1024, "{body_kb} kB");
    let limits = Limits {
        max_prompt_bytes: 1_000_000,
        max_batch: items,
        files: agentq_core::workspace_path::FileLimits::DEFAULT,
    };
    let before = reset_peak();
    let reqs = parse_batch_bytes(&body, &limits).unwrap();
    let peak = status_kb("VmHWM:");
    assert_eq!(reqs.len(), items);
    assert_eq!(reqs[9_999].idempotency_key.as_deref(), Some("key-9999"));
    // The body is part of `before`: the parse adds about one body more (the requests
    // own copies of their strings), not several.
    let added = peak.saturating_sub(before);
    let ratio = (body_kb + added) as f64 / body_kb as f64;
    assert!(
        ratio <= 2.5,
        "parsing a {body_kb} kB batch peaked {added} kB above it: {ratio:.2}x the body"
    );
    drop(reqs);
    drop(body);

    // The whole request through the API, on a real Postgres and Redis (other processes:
    // their memory is not counted here), with the client in this process holding the
    // body already: a batch just under the body limit.
    let env = Env::start().await;
    let body = axum::body::Bytes::from(big_batch(items, 530));
    assert!(body.len() < agentq_scheduler::BATCH_BODY_LIMIT);
    let body_kb = (body.len() / 1024) as u64;
    let before = reset_peak();
    let r = env
        .http
        .post(format!("{}/v1/sessions/batch", env.base))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let answer: serde_json::Value = r.json().await.unwrap();
    let peak = status_kb("VmHWM:");
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["sessions"].as_array().unwrap().len(), items);
    let added = peak.saturating_sub(before);
    let ratio = (body_kb + added) as f64 / body_kb as f64;
    assert!(
        ratio <= 4.5,
        "creating a {body_kb} kB batch peaked {added} kB above it: {ratio:.2}x the body"
    );
}

const ADMIN_KEY: &str = "batch-memory-admin-key";

struct Env {
    base: String,
    http: reqwest::Client,
    _redis: RedisServer,
}

impl Env {
    async fn start() -> Env {
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
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {ADMIN_KEY}").parse().unwrap(),
        );
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap();
        Env {
            base: format!("http://{addr}"),
            http,
            _redis: redis,
        }
    }
}
