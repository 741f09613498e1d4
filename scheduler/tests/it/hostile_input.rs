//! Hostile request input at the HTTP API, against a real Postgres and a real Redis: a NUL
//! character anywhere a client can put a string (body fields and keys, batch items, path
//! ids, query parameters, steering and approval bodies), a key repeated in one object,
//! numbers past the API's bounds and lists past their lengths are each a 422 naming the
//! field, and nothing is written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use serde_json::{Value, json};

use agentq_core::WorkQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::read;

const ADMIN_KEY: &str = "hostile-input-admin-key";

struct Env {
    base: String,
    http: reqwest::Client,
    db_url: String,
    _redis: RedisServer,
}

impl Env {
    async fn start() -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 4).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        queue.ensure_queue("default").await.unwrap();
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        let state = Scheduler::new(store.clone(), queue, settings);
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
            db_url,
            _redis: redis,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, serde_json::to_vec(body).unwrap()).await
    }

    /// A body as written, for what `serde_json::Value` cannot hold (a repeated key).
    async fn post_raw(&self, path: &str, body: impl Into<Vec<u8>>) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.into())
            .send()
            .await
            .unwrap();
        read(r).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        read(
            self.http
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    fn sql(&self, q: &str) -> String {
        shared_postgres().unwrap().psql(&self.db_url, q).unwrap()
    }

    fn row_count(&self) -> u64 {
        self.sql("SELECT count(*) FROM sessions").parse().unwrap()
    }

    async fn create(&self) -> String {
        let (s, b) = self.post("/v1/sessions", &json!({"prompt": "p"})).await;
        assert_eq!(s, 201, "{b}");
        b["id"].as_str().unwrap().to_string()
    }
}

/// A 422 `invalid_field` naming `field`.
#[track_caller]
fn assert_refused(resp: &(u16, Value), field: &str) {
    let (s, v) = resp;
    assert_eq!(*s, 422, "{field}: {v}");
    assert_eq!(v["error"]["code"], "invalid_field", "{field}: {v}");
    assert_eq!(v["error"]["field"], field, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

#[tokio::test]
async fn a_nul_in_any_string_of_a_create_is_a_422_naming_it_and_stores_nothing() {
    let env = Env::start().await;
    let nul = "a\u{0}b";
    let cases = [
        (json!({"prompt": nul}), "prompt"),
        (json!({"prompt": "p", "system": nul}), "system"),
        (json!({"prompt": "p", "model": nul}), "model"),
        (
            json!({"prompt": "p", "tools": ["read_file", nul]}),
            "tools[1]",
        ),
        (
            json!({"prompt": "p", "sensitive_tools": [nul]}),
            "sensitive_tools[0]",
        ),
        (
            json!({"prompt": "p", "metadata": {"foo": nul}}),
            "metadata.foo",
        ),
        (
            json!({"prompt": "p", "metadata": {"a": [1, {"b": nul}]}}),
            "metadata.a[1].b",
        ),
        (
            json!({"prompt": "p", "metadata": {nul: 1}}),
            "metadata.a\\u0000b",
        ),
        (
            json!({"prompt": "p", "idempotency_key": nul}),
            "idempotency_key",
        ),
        (json!({"prompt": "p", "queue": nul}), "queue"),
        (json!({"prompt": "p", "base_url": nul}), "base_url"),
        (json!({"prompt": "p", "mode": nul}), "mode"),
    ];
    for (body, field) in &cases {
        assert_refused(&env.post("/v1/sessions", body).await, field);
    }
    let batch = json!([{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}, {"prompt": nul}]);
    assert_refused(&env.post("/v1/sessions/batch", &batch).await, "[3].prompt");
    let batch = json!([{"prompt": "a", "metadata": {"k": nul}}]);
    assert_refused(
        &env.post("/v1/sessions/batch", &batch).await,
        "[0].metadata.k",
    );
    // Written as the escape a client sends on the wire, not only as a raw byte.
    assert_refused(
        &env.post_raw("/v1/sessions", r#"{"prompt": "x\u0000y"}"#)
            .await,
        "prompt",
    );
    assert_eq!(env.row_count(), 0);
}

#[tokio::test]
async fn a_nul_in_a_path_id_or_a_query_parameter_is_a_422_not_a_503() {
    let env = Env::start().await;
    let id = env.create().await;
    for path in [
        "/v1/sessions/ab%00cd".to_string(),
        "/v1/sessions/ab%00cd/messages".into(),
        "/v1/sessions/ab%00cd/tree".into(),
        "/v1/sessions/ab%00cd/events".into(),
        format!("/v1/sessions/{id}%00"),
    ] {
        assert_refused(&env.get(&path).await, "id");
    }
    assert_refused(
        &env.post("/v1/sessions/ab%00cd/cancel", &json!({})).await,
        "id",
    );
    assert_refused(
        &env.post("/v1/sessions/ab%00cd/messages", &json!({"content": "x"}))
            .await,
        "id",
    );
    assert_refused(
        &env.post(
            "/v1/sessions/ab%00cd/approvals",
            &json!({"tool_call_id": "c", "approve": true}),
        )
        .await,
        "id",
    );
    for (query, field) in [
        ("cursor=a%00b", "cursor"),
        ("parent_id=a%00b", "parent_id"),
        ("status=queued%00", "status"),
        ("limit=1%00", "limit"),
    ] {
        assert_refused(&env.get(&format!("/v1/sessions?{query}")).await, field);
    }
    // The session itself is untouched and still reads.
    let (s, b) = env.get(&format!("/v1/sessions/{id}/messages")).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(env.row_count(), 1);
}

#[tokio::test]
async fn a_nul_in_a_steering_message_or_an_approval_is_a_422_and_is_not_delivered() {
    let env = Env::start().await;
    let id = env.create().await;
    let messages = format!("/v1/sessions/{id}/messages");
    assert_refused(
        &env.post(&messages, &json!({"content": "hi\u{0}"})).await,
        "content",
    );
    assert_refused(
        &env.post(
            &messages,
            &json!({"content": "hi", "strategy": "inject\u{0}"}),
        )
        .await,
        "strategy",
    );
    let approvals = format!("/v1/sessions/{id}/approvals");
    assert_refused(
        &env.post(
            &approvals,
            &json!({"tool_call_id": "c\u{0}", "approve": true}),
        )
        .await,
        "tool_call_id",
    );
    assert_refused(
        &env.post(
            &approvals,
            &json!({"tool_call_id": "c", "approve": false, "reason": "\u{0}"}),
        )
        .await,
        "reason",
    );
    assert_eq!(env.sql("SELECT count(*) FROM inbox"), "0");
    assert_eq!(env.sql("SELECT count(*) FROM approvals"), "0");
    let (s, b) = env.get(&format!("/v1/sessions/{id}/messages")).await;
    assert_eq!(s, 200, "{b}");
}

#[tokio::test]
async fn a_key_repeated_in_one_object_is_a_422_naming_it() {
    let env = Env::start().await;
    let cases = [
        (r#"{"prompt": "a", "prompt": "b"}"#, "prompt"),
        (r#"{"prompt": "a", "mode": "act", "mode": "plan"}"#, "mode"),
        (
            r#"{"prompt": "a", "metadata": {"x": 1, "y": {"z": 1, "z": 2}}}"#,
            "metadata.y.z",
        ),
        (
            r#"{"prompt": "a", "metadata": {"x": 1, "x": 2}}"#,
            "metadata.x",
        ),
        // The same key after unescaping is the same key.
        (r#"{"prompt": "a", "pr\u006fmpt": "b"}"#, "prompt"),
    ];
    for (body, field) in cases {
        assert_refused(&env.post_raw("/v1/sessions", body).await, field);
    }
    // The same key in two objects is no repeat.
    let (s, b) = env
        .post_raw(
            "/v1/sessions",
            r#"{"prompt": "a", "metadata": {"x": {"k": 1}, "y": {"k": 1}}}"#,
        )
        .await;
    assert_eq!(s, 201, "{b}");
    let batch = r#"[{"prompt": "a"}, {"prompt": "b", "queue": "q", "queue": "default"}]"#;
    assert_refused(
        &env.post_raw("/v1/sessions/batch", batch).await,
        "[1].queue",
    );
    let id = b["id"].as_str().unwrap();
    assert_refused(
        &env.post_raw(
            &format!("/v1/sessions/{id}/messages"),
            r#"{"content": "a", "content": "b"}"#,
        )
        .await,
        "content",
    );
    assert_refused(
        &env.post_raw(
            &format!("/v1/sessions/{id}/approvals"),
            r#"{"tool_call_id": "c", "approve": true, "approve": false}"#,
        )
        .await,
        "approve",
    );
    assert_eq!(env.row_count(), 1);
}

#[tokio::test]
async fn every_number_has_an_upper_bound_checked_at_submit() {
    let env = Env::start().await;
    let huge = 9_000_000_000_000_000u64;
    for field in [
        "timeout_secs",
        "approval_timeout_secs",
        "tool_timeout_secs",
        "token_budget",
        "history_window",
        "context_budget_chars",
        "tool_output_max_chars",
        "max_background_drain_rounds",
        "max_llm_retries",
        "retry_delay_ms",
        "max_repeated_calls",
        "warn_repeated_calls",
    ] {
        let mut body = json!({"prompt": "p"});
        body[field] = json!(huge);
        assert_refused(&env.post("/v1/sessions", &body).await, field);
        body[field] = json!(u64::MAX);
        assert_refused(&env.post("/v1/sessions", &body).await, field);
        let batch = json!([{"prompt": "p"}, body]);
        assert_refused(
            &env.post("/v1/sessions/batch", &batch).await,
            &format!("[1].{field}"),
        );
    }
    // Thirty days is the longest timeout; a second more is refused.
    let (s, b) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "timeout_secs": 2_592_000, "approval_timeout_secs": 2_592_000}),
        )
        .await;
    assert_eq!(s, 201, "{b}");
    assert_refused(
        &env.post(
            "/v1/sessions",
            &json!({"prompt": "p", "timeout_secs": 2_592_001}),
        )
        .await,
        "timeout_secs",
    );
    assert_refused(&env.get("/v1/sessions?limit=1001").await, "limit");
    assert_eq!(env.row_count(), 1);
}

#[tokio::test]
async fn lists_maps_and_strings_are_bounded() {
    let env = Env::start().await;
    let names: Vec<String> = (0..10_000).map(|i| format!("{i:0>256}")).collect();
    assert_refused(
        &env.post("/v1/sessions", &json!({"prompt": "p", "tools": names}))
            .await,
        "tools",
    );
    assert_refused(
        &env.post(
            "/v1/sessions",
            &json!({"prompt": "p", "sensitive_tools": vec!["shell"; 257]}),
        )
        .await,
        "sensitive_tools",
    );
    let entries = |n: usize| -> Value {
        Value::Object((0..n).map(|i| (format!("k{i}"), json!(0))).collect())
    };
    assert_refused(
        &env.post(
            "/v1/sessions",
            &json!({"prompt": "p", "metadata": entries(257)}),
        )
        .await,
        "metadata",
    );
    assert_refused(
        &env.post(
            "/v1/sessions",
            &json!({"prompt": "p", "metadata": {"a": entries(1001)}}),
        )
        .await,
        "metadata.a",
    );
    let id = env.create().await;
    assert_refused(
        &env.post(
            &format!("/v1/sessions/{id}/approvals"),
            &json!({"tool_call_id": "c".repeat(1025), "approve": true}),
        )
        .await,
        "tool_call_id",
    );
    assert_eq!(env.row_count(), 1);
}

/// One listing cannot be made as large as a tenant's sessions are: sessions of 1 MB
/// prompts (and systems) are listed a bounded number of bytes at a time, with a cursor to
/// the rest, where a `limit=1000` over such sessions used to load and answer gigabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_huge_sessions_is_cut_by_bytes() {
    let env = Env::start().await;
    let big = "p".repeat(900_000);
    let n = 24;
    for i in 0..n {
        let (status, v) = env
            .post(
                "/v1/sessions",
                &json!({"prompt": format!("{i} {big}"), "system": big}),
            )
            .await;
        assert_eq!(status, 201, "{v}");
    }
    let mut seen = 0;
    let mut pages = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/sessions?limit=1000&cursor={c}"),
            None => "/v1/sessions?limit=1000".to_string(),
        };
        let (status, v) = env.get(&path).await;
        assert_eq!(status, 200, "{v}");
        let page = v["sessions"].as_array().unwrap().len();
        assert!(page >= 1, "{v}");
        let bytes = serde_json::to_vec(&v).unwrap().len();
        assert!(
            bytes <= agentq_scheduler::LIST_MAX_BYTES + 4_000_000,
            "a page of {page} sessions is {bytes} bytes"
        );
        seen += page;
        pages += 1;
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages <= n, "no end to the pages");
    }
    assert_eq!(seen, n);
    assert!(pages > 1);
}
