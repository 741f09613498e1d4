//! The endpoints a console and a program read, against a real Postgres and Redis:
//! `GET /v1/approvals` (the caller's held calls across sessions: only its tenant's, with
//! its scope, every filter, paging across filters, bad values named, and the plan of its
//! read: the partial index of sessions awaiting approval, not a scan of every session),
//! the filters of `GET /v1/sessions` (each alone and together, with paging), the `status`
//! of a bulk retry, and the `arguments` of an approval (bounded, approvals only,
//! recorded).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;
use agentq_core::auth::{self, Scope};
use agentq_core::budget::{PriceEntry, Prices};
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    Claim, InboxStore, KeyStore, LeaseStore, NewSession, SessionStatus, SessionStore,
};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

struct Env {
    base: String,
    db_url: String,
    store: Arc<PgStore>,
    _redis: RedisServer,
}

impl Env {
    async fn start() -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let settings = SchedulerSettings {
            prices: Arc::new(
                Prices::new(&[PriceEntry {
                    model: "priced".into(),
                    input: 1.0,
                    output: 0.0,
                    ..Default::default()
                }])
                .unwrap(),
            ),
            ..Default::default()
        };
        let state = Scheduler::new(store.clone(), queue, settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        Env {
            base: format!("http://{addr}"),
            db_url,
            store,
            _redis: redis,
        }
    }

    async fn key(&self, tenant: &str, scopes: &[Scope]) -> String {
        let (new, key) = auth::generate(tenant, scopes.to_vec(), None, None).unwrap();
        self.store.create_key(&new).await.unwrap();
        key
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        self.call(Method::GET, path, key, None).await
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        self.call(Method::POST, path, key, Some(body)).await
    }

    fn sql(&self, q: &str) -> String {
        shared_postgres().unwrap().psql(&self.db_url, q).unwrap()
    }

    /// A session of `tenant` on `queue` (of `batch`, with `metadata`) that holds one call
    /// of each of `tools` for a decision; its id.
    async fn held(
        &self,
        tenant: &str,
        queue: &str,
        batch: Option<&str>,
        tools: &[&str],
        metadata: Value,
    ) -> String {
        let mut spec = SessionSpec::new("hold");
        spec.metadata = metadata;
        spec.approval_timeout_secs = APPROVAL_TIMEOUT as u64;
        let mut new = NewSession::root(spec, queue).with_tenant(tenant);
        new.sched.batch_id = batch.map(str::to_string);
        self.store.create_session(&new).await.unwrap();
        let Claim::Acquired { lease, state, .. } = self
            .store
            .claim(&new.id, "w", Duration::from_secs(30), 5)
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        let mut state: SessionState = *state;
        let from = state.messages.len();
        let mut held = Message::assistant("");
        held.tool_calls = tools
            .iter()
            .enumerate()
            .map(|(i, t)| ToolCall {
                id: format!("call_{i}"),
                name: t.to_string(),
                arguments: json!({"n": i}).into(),
            })
            .collect();
        state.not_started = held.tool_calls.iter().map(|c| c.id.clone()).collect();
        state.messages.push(held);
        self.store.checkpoint(&lease, &state, from).await.unwrap();
        let row = self.store.get(&new.id).await.unwrap().unwrap();
        // As a worker sets it: the session's approval timeout from when it suspends.
        let deadline = chrono::Utc::now() + chrono::TimeDelta::seconds(APPROVAL_TIMEOUT);
        self.store
            .suspend(
                &lease,
                SessionStatus::AwaitingApproval,
                row.wake_seq,
                Some(deadline),
            )
            .await
            .unwrap();
        new.id
    }
}

/// The approval timeout of every held session here.
const APPROVAL_TIMEOUT: i64 = 3600;

fn field(v: &Value) -> &str {
    v["error"]["field"].as_str().unwrap_or("")
}

/// (session, call, tool) of each approval of a page.
fn held_of(page: &Value) -> Vec<(String, String, String)> {
    page["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["session_id"].as_str().unwrap().to_string(),
                a["tool_call_id"].as_str().unwrap().to_string(),
                a["tool"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Every approval of `query`, a page of `limit` at a time.
async fn all_pages(env: &Env, key: &str, query: &str, limit: u32) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/approvals?limit={limit}{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (s, page) = env.get(&path, key).await;
        assert_eq!(s, 200, "{path}: {page}");
        assert!(page["approvals"].as_array().unwrap().len() <= limit as usize);
        out.extend(held_of(&page));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
    panic!("the pages never end");
}

fn t(s: &str, c: usize, tool: &str) -> (String, String, String) {
    (s.to_string(), format!("call_{c}"), tool.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_across_sessions_are_the_callers_filtered_and_paged() {
    let env = Env::start().await;
    let reader = env.key("acme", &[Scope::SessionsRead]).await;
    let a = env
        .held(
            "acme",
            "default",
            Some("b1"),
            &["write_file", "shell"],
            json!({"user": "u1"}),
        )
        .await;
    let b = env
        .held("acme", "review", None, &["write_file"], json!({}))
        .await;
    let c = env
        .held("acme", "review", Some("b1"), &["shell"], json!({}))
        .await;
    let other = env
        .held("globex", "review", Some("b1"), &["shell"], json!({}))
        .await;
    // A session of acme that holds nothing is not listed.
    let idle = NewSession::root(SessionSpec::new("idle"), "default").with_tenant("acme");
    env.store.create_session(&idle).await.unwrap();

    // Oldest session first, each one's calls in the model's order; only acme's.
    let (s, page) = env.get("/v1/approvals", &reader).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(
        held_of(&page),
        [
            t(&a, 0, "write_file"),
            t(&a, 1, "shell"),
            t(&b, 0, "write_file"),
            t(&c, 0, "shell")
        ]
    );
    assert_eq!(page["next_cursor"], Value::Null);
    let first = &page["approvals"][0];
    assert_eq!(first["arguments"], json!({"n": 0}));
    assert_eq!(first["queue"], "default");
    assert_eq!(first["batch_id"], "b1");
    assert_eq!(first["metadata"], json!({"user": "u1"}));
    let requested: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(first["requested_at"].clone()).unwrap();
    let deadline: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(first["deadline"].clone()).unwrap();
    assert_eq!(
        deadline - requested,
        chrono::TimeDelta::seconds(APPROVAL_TIMEOUT)
    );
    assert!((chrono::Utc::now() - requested).num_seconds().abs() < 600);
    assert_eq!(page["approvals"][2]["batch_id"], Value::Null);

    // Each filter, and filters together, a page of one at a time.
    for (query, want) in [
        (
            "",
            vec![
                t(&a, 0, "write_file"),
                t(&a, 1, "shell"),
                t(&b, 0, "write_file"),
                t(&c, 0, "shell"),
            ],
        ),
        (
            "&queue=review",
            vec![t(&b, 0, "write_file"), t(&c, 0, "shell")],
        ),
        (
            "&batch_id=b1",
            vec![t(&a, 0, "write_file"), t(&a, 1, "shell"), t(&c, 0, "shell")],
        ),
        ("&tool=shell", vec![t(&a, 1, "shell"), t(&c, 0, "shell")]),
        (
            "&tool=shell&batch_id=b1&queue=review",
            vec![t(&c, 0, "shell")],
        ),
        ("&tool=write", vec![]),
        (
            &format!("&session_id={a}"),
            vec![t(&a, 0, "write_file"), t(&a, 1, "shell")],
        ),
        (
            &format!("&session_id={a}&tool=shell"),
            vec![t(&a, 1, "shell")],
        ),
    ] {
        for limit in [1, 2, 100] {
            assert_eq!(
                all_pages(&env, &reader, query, limit).await,
                want,
                "{query} by {limit}"
            );
        }
    }

    // Another tenant's session is a 404, as its approvals route answers; globex sees only
    // its own.
    let (s, v) = env
        .get(&format!("/v1/approvals?session_id={other}"), &reader)
        .await;
    assert_eq!(s, 404, "{v}");
    let globex = env.key("globex", &[Scope::SessionsRead]).await;
    let (_, page) = env.get("/v1/approvals", &globex).await;
    assert_eq!(held_of(&page), [t(&other, 0, "shell")]);
    let (s, v) = env
        .get(&format!("/v1/approvals?session_id={a}"), &globex)
        .await;
    assert_eq!(s, 404, "{v}");

    // The read scope is needed; deciding alone does not list.
    let approver = env.key("acme", &[Scope::ApprovalsWrite]).await;
    let (s, v) = env.get("/v1/approvals", &approver).await;
    assert_eq!(s, 403, "{v}");

    // Bad values name their parameter.
    for (query, name) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=x", "limit"),
        ("cursor=%%%", "cursor"),
        ("cursor=bm90IGEgY3Vyc29y%0A", "cursor"),
        ("status=failed", "status"),
        ("queue=a&queue=b", "queue"),
        (&format!("tool={}", "t".repeat(300)), "tool"),
    ] {
        let (s, v) = env.get(&format!("/v1/approvals?{query}"), &reader).await;
        assert!(s == 422 || s == 400, "{query}: {s} {v}");
        if s == 422 {
            assert_eq!(field(&v), name, "{query}: {v}");
        }
    }

    // A decision takes the call off the listing.
    let approve = env.key("acme", &[Scope::ApprovalsWrite]).await;
    let (s, v) = env
        .post(
            &format!("/v1/sessions/{b}/approvals"),
            &approve,
            &json!({"tool_call_id": "call_0", "approve": false}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, page) = env.get("/v1/approvals?queue=review", &reader).await;
    assert_eq!(held_of(&page), [t(&c, 0, "shell")]);
}

/// The listing reads the tenant's sessions awaiting approval through their partial
/// index, not every session: with many sessions in other states, the plan of its read is
/// an index scan of `sessions_awaiting_approval_idx`.
#[tokio::test(flavor = "multi_thread")]
async fn the_approvals_listing_reads_an_index_of_waiting_sessions() {
    let env = Env::start().await;
    let many: Vec<NewSession> = (0..3000)
        .map(|i| NewSession::root(SessionSpec::new(format!("s{i}")), "default").with_tenant("acme"))
        .collect();
    env.store.create_sessions(&many).await.unwrap();
    env.held("acme", "default", None, &["shell"], json!({}))
        .await;
    env.sql("ANALYZE sessions");
    // The statement the store builds for the listing (`statements::list`, oldest first).
    let plan = env.sql(
        "EXPLAIN SELECT id FROM sessions WHERE true AND tenant = 'acme' \
         AND status = 'awaiting_approval' ORDER BY id ASC LIMIT 51",
    );
    // Shown with `--nocapture`, for a reviewer.
    println!("{plan}");
    assert!(plan.contains("sessions_awaiting_approval_idx"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

#[tokio::test(flavor = "multi_thread")]
async fn edited_arguments_are_bounded_go_with_approvals_only_and_are_recorded() {
    let env = Env::start().await;
    let approve = env.key("acme", &[Scope::ApprovalsWrite]).await;
    let id = env
        .held("acme", "default", None, &["write_file", "shell"], json!({}))
        .await;
    let path = format!("/v1/sessions/{id}/approvals");
    for (body, status, name) in [
        (
            json!({"tool_call_id": "call_0", "approve": false, "arguments": {"a": 1}}),
            422,
            "arguments",
        ),
        (
            json!({"tool_call_id": "call_0", "approve": true, "arguments": "rm -rf"}),
            422,
            "arguments",
        ),
        (
            json!({"tool_call_id": "call_0", "approve": true, "arguments": [1]}),
            422,
            "arguments",
        ),
        (
            json!({"tool_call_id": "call_0", "approve": true,
                   "arguments": {"content": "x".repeat(256 * 1024)}}),
            413,
            "arguments",
        ),
    ] {
        let (s, v) = env.post(&path, &approve, &body).await;
        assert_eq!(s, status, "{v}");
        assert_eq!(field(&v), name, "{v}");
    }
    assert_eq!(env.sql("SELECT count(*) FROM approvals"), "0");
    // Another tenant's session: 404, nothing recorded.
    let globex = env.key("globex", &[Scope::ApprovalsWrite]).await;
    let (s, _) = env
        .post(
            &path,
            &globex,
            &json!({"tool_call_id": "call_0", "approve": true, "arguments": {"a": 1}}),
        )
        .await;
    assert_eq!(s, 404);
    assert_eq!(env.sql("SELECT count(*) FROM approvals"), "0");

    let (s, v) = env
        .post(
            &path,
            &approve,
            &json!({"tool_call_id": "call_0", "approve": true,
                    "arguments": {"path": "b.txt", "content": "edited"}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (approved, _, edited) = env.store.approval(&id, "call_0").await.unwrap().unwrap();
    assert!(approved);
    let edited: Value = serde_json::from_str(&edited.unwrap()).unwrap();
    assert_eq!(edited, json!({"path": "b.txt", "content": "edited"}));
}

/// Sessions of acme in every shape the filters tell apart; their ids, oldest first.
struct Shapes {
    completed: String,
    failed: String,
    rate_limited: String,
    awaiting: String,
    tagged: String,
    costly: String,
}

async fn shapes(env: &Env) -> Shapes {
    let make = |prompt: &str, queue: &str, metadata: Value| {
        let mut spec = SessionSpec::new(prompt);
        spec.metadata = metadata;
        NewSession::root(spec, queue).with_tenant("acme")
    };
    let completed = make("completed", "default", json!({"team": "a"}));
    let failed = make("failed", "bulk", json!({"team": "a", "n": 3}));
    let rate_limited = make("rate limited", "default", json!({}));
    let tagged = make("tagged", "default", json!({"team": "b", "flag": true}));
    let costly = make("costly", "bulk", json!({"team": "a"}));
    for n in [&completed, &failed, &rate_limited, &tagged, &costly] {
        env.store.create_session(n).await.unwrap();
    }
    let awaiting = env
        .held("acme", "default", None, &["shell"], json!({}))
        .await;
    env.sql(&format!(
        "UPDATE sessions SET status = 'completed', finish_reason = 'stop' WHERE id = '{}'",
        completed.id
    ));
    env.store.fail(&failed.id, "boom: disk full").await.unwrap();
    env.sql(&format!(
        "UPDATE sessions SET status = 'waiting', wait_reason = 'rate_limit' WHERE id = '{}'",
        rate_limited.id
    ));
    // 2M input tokens at $1/M: $2; the other priced one costs $0.50.
    env.sql(&format!(
        "UPDATE sessions SET model_used = 'priced', input_tokens = 2000000 WHERE id = '{}'",
        costly.id
    ));
    env.sql(&format!(
        "UPDATE sessions SET model_used = 'priced', input_tokens = 500000 WHERE id = '{}'",
        tagged.id
    ));
    // The first three were made a day ago.
    for id in [&completed.id, &failed.id, &rate_limited.id] {
        env.sql(&format!(
            "UPDATE sessions SET created_at = created_at - interval '1 day' WHERE id = '{id}'"
        ));
    }
    Shapes {
        completed: completed.id,
        failed: failed.id,
        rate_limited: rate_limited.id,
        awaiting,
        tagged: tagged.id,
        costly: costly.id,
    }
}

/// Every session id of `query`, newest first, `limit` at a time.
async fn listed(env: &Env, key: &str, query: &str, limit: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/sessions?limit={limit}{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (s, page) = env.get(&path, key).await;
        assert_eq!(s, 200, "{path}: {page}");
        out.extend(
            page["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["id"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return out,
        }
    }
    panic!("the pages never end");
}

#[tokio::test(flavor = "multi_thread")]
async fn session_listing_filters_each_and_together_with_paging() {
    let env = Env::start().await;
    let key = env
        .key("acme", &[Scope::SessionsRead, Scope::SessionsWrite])
        .await;
    let s = shapes(&env).await;
    // Another tenant's session matching every filter is never listed.
    let mut spec = SessionSpec::new("globex");
    spec.metadata = json!({"team": "a"});
    let other = NewSession::root(spec, "bulk").with_tenant("globex");
    env.store.create_session(&other).await.unwrap();
    env.sql(&format!(
        "UPDATE sessions SET model_used = 'priced', input_tokens = 2000000 WHERE id = '{}'",
        other.id
    ));

    let day_ago = (chrono::Utc::now() - chrono::TimeDelta::hours(12)).to_rfc3339();
    let enc = |t: &str| t.replace('+', "%2B");
    let cases: Vec<(String, Vec<&String>)> = vec![
        ("&finish_reason=stop".into(), vec![&s.completed]),
        ("&finish_reason=error".into(), vec![&s.failed]),
        ("&wait_reason=rate_limit".into(), vec![&s.rate_limited]),
        ("&wait_reason=approval".into(), vec![&s.awaiting]),
        ("&queue=bulk".into(), vec![&s.costly, &s.failed]),
        (
            "&metadata=team=a".into(),
            vec![&s.costly, &s.failed, &s.completed],
        ),
        ("&metadata=team=a&metadata=n=3".into(), vec![&s.failed]),
        ("&metadata=flag=true".into(), vec![&s.tagged]),
        (
            format!("&created_before={}", enc(&day_ago)),
            vec![&s.rate_limited, &s.failed, &s.completed],
        ),
        (
            format!("&created_after={}", enc(&day_ago)),
            vec![&s.awaiting, &s.costly, &s.tagged],
        ),
        ("&min_cost_usd=1".into(), vec![&s.costly]),
        ("&max_cost_usd=1".into(), vec![&s.tagged]),
        (
            "&min_cost_usd=0.1&max_cost_usd=5".into(),
            vec![&s.costly, &s.tagged],
        ),
        (
            format!(
                "&queue=bulk&metadata=team=a&created_after={}",
                enc(&day_ago)
            ),
            vec![&s.costly],
        ),
        (
            "&status=failed&queue=bulk&finish_reason=error".into(),
            vec![&s.failed],
        ),
        ("&queue=nowhere".into(), vec![]),
    ];
    for (query, want) in &cases {
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        for limit in [1, 2, 50] {
            assert_eq!(
                listed(&env, &key, query, limit).await,
                want,
                "{query} by {limit}"
            );
        }
    }

    // Bad values name their parameter.
    for (query, name) in [
        ("finish_reason=bored", "finish_reason"),
        ("wait_reason=coffee", "wait_reason"),
        ("created_after=yesterday", "created_after"),
        ("created_before=2026-13-01T00:00:00Z", "created_before"),
        ("min_cost_usd=-1", "min_cost_usd"),
        ("max_cost_usd=NaN", "max_cost_usd"),
        ("max_cost_usd=cheap", "max_cost_usd"),
        ("metadata=novalue", "metadata"),
        ("metadata==x", "metadata"),
        ("queue=a&queue=b", "queue"),
        ("costs=1", "costs"),
    ] {
        let (st, v) = env.get(&format!("/v1/sessions?{query}"), &key).await;
        assert_eq!(st, 422, "{query}: {v}");
        assert_eq!(field(&v), name, "{query}: {v}");
    }

    // A bulk retry by status: only a failed session can be retried.
    for bad in ["cancelled", "completed", "queued"] {
        let (st, v) = env
            .post("/v1/sessions/retry", &key, &json!({"status": bad}))
            .await;
        assert_eq!(st, 422, "{bad}: {v}");
        assert_eq!(field(&v), "status", "{v}");
    }
    let (st, v) = env
        .post("/v1/sessions/retry", &key, &json!({"status": "bogus"}))
        .await;
    assert_eq!((st, field(&v)), (422, "status"), "{v}");
    let (st, v) = env
        .post(
            "/v1/sessions/retry",
            &key,
            &json!({"status": "failed", "error_contains": "disk"}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["sessions"][0]["id"], s.failed.as_str(), "{v}");
    assert_eq!(v["sessions"].as_array().unwrap().len(), 1, "{v}");
    let (st, v) = env
        .post(
            "/v1/sessions/cancel",
            &key,
            &json!({"batch_id": "b", "status": "failed"}),
        )
        .await;
    assert_eq!((st, field(&v)), (422, "status"), "{v}");
}
