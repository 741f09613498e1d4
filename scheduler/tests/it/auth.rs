//! The trust boundary of the API, against a real Postgres and Redis: every route of the
//! router (enumerated from the table it is built from) refuses a request without a key
//! and with a bad key (401), with a key that lacks its scope (403 naming the scope), and
//! answers another tenant's session exactly as a missing one (404); the right key gets
//! through. Then tenants: listings and cursors never show another tenant's sessions,
//! idempotency keys are per tenant and bound to the request, a child inherits its
//! parent's tenant, the admin key sees every tenant, and revoked and expired keys are
//! refused (a revocation once the key cache's entry is stale).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use agentq_agent::spec::SessionSpec;
use agentq_core::auth::{self, Scope};
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{KeyStore, NewSession, SessionStatus, SessionStore};
use agentq_scheduler::{Access, Scheduler, SchedulerSettings, route_table, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::wait_until;

const ADMIN_KEY: &str = "auth-test-admin-key";

struct Env {
    base: String,
    db_url: String,
    store: Arc<PgStore>,
    _redis: RedisServer,
    routes: Vec<(Method, &'static str, Access)>,
}

impl Env {
    async fn start(cache_ttl: Duration) -> Env {
        Self::start_with(cache_ttl, |_| {}).await
    }

    async fn start_with(cache_ttl: Duration, tune: impl FnOnce(&mut SchedulerSettings)) -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        settings.auth.cache_ttl = cache_ttl;
        tune(&mut settings);
        let state = Scheduler::new(store.clone(), queue, settings);
        let routes = route_table();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        Env {
            base: format!("http://{addr}"),
            db_url,
            store,
            _redis: redis,
            routes,
        }
    }

    /// A key of `tenant` with `scopes`, stored; the key itself.
    async fn key(&self, tenant: &str, scopes: &[Scope]) -> String {
        let (new, key) = auth::generate(tenant, scopes.to_vec(), None, None).unwrap();
        self.store.create_key(&new).await.unwrap();
        key
    }

    async fn call(
        &self,
        method: &Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req =
            reqwest::Client::new().request(method.clone(), format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        // An event stream lasts as long as its session: its status is the answer.
        if headers
            .get("content-type")
            .is_some_and(|c| c.to_str().unwrap().starts_with("text/event-stream"))
        {
            return (status, Value::Null, headers);
        }
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        let (s, v, _) = self.call(&Method::POST, path, Some(key), Some(body)).await;
        (s, v)
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        let (s, v, _) = self.call(&Method::GET, path, Some(key), None).await;
        (s, v)
    }
}

fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// A request body a route accepts (its handler runs and answers 2xx).
fn body_for(method: &Method, path: &str, call_id: &str) -> Option<Value> {
    if method == Method::PUT && path == "/v1/admin/budgets/{tenant}" {
        return Some(json!({"period": "day", "tokens": 1000}));
    }
    if method == Method::PUT && path.starts_with("/v1/admin/retention/") {
        return Some(json!({"days": 30, "keep": "result"}));
    }
    if method != Method::POST {
        return None;
    }
    Some(match path {
        "/v1/sessions" => json!({"prompt": "hi"}),
        "/v1/sessions/batch" => json!([{"prompt": "a"}, {"prompt": "b"}]),
        "/v1/sessions/{id}/messages" => json!({"content": "more", "strategy": "enqueue"}),
        "/v1/sessions/{id}/approvals" => json!({"tool_call_id": call_id, "approve": true}),
        "/v1/sessions/{id}/cancel" => json!({}),
        "/v1/sessions/{id}/retry" => json!({}),
        "/v1/sessions/cancel" => json!({"batch_id": "b"}),
        "/v1/sessions/retry" => json!({}),
        "/v1/queues" => json!({"name": "made-by-the-auth-test"}),
        "/v1/batches" => json!({"requests": [{"prompt": "a"}], "metadata": {"k": "v"}}),
        "/v1/batches/{id}/cancel" => json!({}),
        // An address literal that is public: no resolver needed.
        "/v1/webhooks" => json!({"url": "http://93.184.215.14/in", "events": ["session.failed"]}),
        "/v1/webhooks/{id}/rotate" => json!({"overlap_secs": 60}),
        "/v1/webhooks/{id}/enable" => json!({}),
        "/v1/webhooks/{id}/redrive" => json!({}),
        "/v1/schedules" => json!({"every_secs": 3600, "session": {"prompt": "hi"}}),
        "/v1/schedules/{id}/pause" => json!({}),
        "/v1/schedules/{id}/resume" => json!({}),
        "/v1/schedules/{id}/trigger" => json!({}),
        "/v1/sessions/{id}/fork" => json!({"at_iteration": 0}),
        other => panic!("no request body for POST {other}: add one to this test"),
    })
}

/// A session of the tenant `acme` that holds a call for approval, so that every route,
/// approvals included, has something to succeed on.
async fn held_session(env: &Env, tenant: &str) -> (String, String) {
    use agentq_agent::schema::{Message, ToolCall};
    use agentq_agent::state::SessionState;
    use agentq_core::{Claim, LeaseStore, SessionStatus};

    let mut new = NewSession::root(SessionSpec::new("hold"), "default").with_tenant(tenant);
    new.files = vec![agentq_core::workspace::InputFile {
        path: HELD_FILE.into(),
        data: b"held".to_vec(),
    }];
    env.store.create_session(&new).await.unwrap();
    let Claim::Acquired { lease, state, .. } = env
        .store
        .claim(&new.id, "w", Duration::from_secs(30), 5)
        .await
        .unwrap()
    else {
        panic!("claim")
    };
    let mut state: SessionState = *state;
    let from = state.messages.len();
    let call = ToolCall {
        id: "call_1".into(),
        name: "write_file".into(),
        arguments: json!({}).into(),
    };
    let mut held = Message::assistant("");
    held.tool_calls = vec![call.clone()];
    state.messages.push(held);
    env.store.checkpoint(&lease, &state, from).await.unwrap();
    let row = env.store.get(&new.id).await.unwrap().unwrap();
    env.store
        .suspend(&lease, SessionStatus::AwaitingApproval, row.wake_seq, None)
        .await
        .unwrap();
    (new.id, call.id)
}

/// A batch of two sessions of `tenant`, made through the API; its id.
async fn batch_of(env: &Env, tenant: &str) -> String {
    let key = env.key(tenant, &[Scope::SessionsWrite]).await;
    let body = json!({"requests": [{"prompt": "a"}, {"prompt": "b", "custom_id": "b"}]});
    let (s, v) = env.post("/v1/batches", &key, &body).await;
    assert_eq!(s, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

/// A webhook endpoint of `tenant`, made in the store; its id.
async fn webhook_of(env: &Env, tenant: &str) -> String {
    use agentq_core::webhook::{NewWebhook, WebhookEvent, WebhookStore};

    let id = format!("wh_{}", uuid::Uuid::now_v7().simple());
    let new = NewWebhook {
        id: id.clone(),
        tenant: tenant.into(),
        url: "http://93.184.215.14/in".into(),
        events: vec![WebhookEvent::SessionFailed],
        queue: None,
        batch_id: None,
        description: None,
        secret_salt: "salt".into(),
        created_at: chrono::Utc::now(),
    };
    assert!(env.store.create_webhook(&new, 1_000).await.unwrap());
    id
}

/// A schedule of `tenant`, made in the store; its id.
async fn schedule_of(env: &Env, tenant: &str) -> String {
    use agentq_core::schedule::{NewSchedule, Overlap, ScheduleStore};

    let id = format!("sch_{}", uuid::Uuid::now_v7().simple());
    let now = chrono::Utc::now();
    let new = NewSchedule {
        id: id.clone(),
        tenant: tenant.into(),
        cron: None,
        timezone: "UTC".into(),
        every_secs: Some(3_600),
        template: r#"{"prompt":"hi"}"#.into(),
        overlap: Overlap::Skip,
        catchup_window_secs: 60,
        description: None,
        paused: false,
        next_fire_at: now + chrono::Duration::hours(1),
        created_at: now,
    };
    env.store.create_schedule(&new).await.unwrap();
    id
}

/// The file every held session's workspace holds, for the routes that read one.
const HELD_FILE: &str = "out/report.txt";

fn concrete(path: &str, id: &str) -> String {
    path.replace("{id}", id)
        .replace("{tenant}", "acme")
        .replace("{queue}", "default")
        .replace("{*path}", HELD_FILE)
        .replace("{file}", "app.js")
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_is_checked() {
    let env = Env::start(Duration::from_secs(30)).await;
    // The router has every route of the table and nothing is open but the probes, the
    // console's files (what they read needs a key) and the API's description.
    let open: Vec<&str> = env
        .routes
        .iter()
        .filter(|(_, _, a)| *a == Access::Open)
        .map(|(_, p, _)| *p)
        .collect();
    assert_eq!(
        open,
        [
            "/healthz",
            "/readyz",
            "/console",
            "/console/{file}",
            "/openapi.json"
        ]
    );
    assert!(env.routes.len() >= 12, "{:?}", env.routes);

    let bad = format!("aq_{}_{}", "0".repeat(12), "1".repeat(64));
    let other = env
        .key(
            "globex",
            &[
                Scope::SessionsRead,
                Scope::SessionsWrite,
                Scope::ApprovalsWrite,
                Scope::Webhooks,
            ],
        )
        .await;

    for (method, path, access) in env.routes.clone() {
        if access == Access::Key {
            // `/mcp`: the gate lets any valid key in and each tool checks the scope of its
            // REST route (tests/mcp.rs); without a valid key nothing gets through.
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
            let (s, v, h) = env.call(&method, path, None, Some(&body)).await;
            assert_eq!(s, 401, "{method} {path} without a key: {v}");
            assert_eq!(error_code(&v), "unauthorized", "{method} {path}: {v}");
            assert_eq!(h["www-authenticate"], "Bearer", "{method} {path}");
            for k in ["nonsense", bad.as_str()] {
                let (s, v, _) = env.call(&method, path, Some(k), Some(&body)).await;
                assert_eq!(s, 401, "{method} {path} with key {k}: {v}");
            }
            for scope in Scope::ALL {
                let key = env.key("acme", &[scope]).await;
                let (s, v, _) = env.call(&method, path, Some(&key), Some(&body)).await;
                assert!(
                    s != 401 && s != 403,
                    "{method} {path} with {scope}: {s} {v}"
                );
            }
            continue;
        }
        let Access::Scope(scope) = access else {
            let (s, _, _) = env.call(&method, &concrete(path, "none"), None, None).await;
            assert!(s == 200 || s == 503, "{method} {path}: {s}");
            continue;
        };
        // A fresh session per route: cancel and approvals change it.
        let (id, call_id) = held_session(&env, "acme").await;
        if path.ends_with("/retry") {
            // Only a failed session can be retried: dead-letter this one.
            env.store.fail(&id, "dead letter").await.unwrap();
        }
        // A batch's routes act on a batch of acme's (as a session's act on a session).
        let id = if path.starts_with("/v1/batches/{id}") {
            batch_of(&env, "acme").await
        } else if path.starts_with("/v1/webhooks/{id}") {
            webhook_of(&env, "acme").await
        } else if path.starts_with("/v1/schedules/{id}") {
            schedule_of(&env, "acme").await
        } else {
            id
        };
        let url = concrete(path, &id);
        let body = body_for(&method, path, &call_id);

        // No key.
        let (s, v, h) = env.call(&method, &url, None, body.as_ref()).await;
        assert_eq!(s, 401, "{method} {path} without a key: {v}");
        assert_eq!(error_code(&v), "unauthorized", "{method} {path}: {v}");
        assert_eq!(h["www-authenticate"], "Bearer", "{method} {path}");
        // A made-up key, a key-shaped one and another scheme.
        for k in ["nonsense", bad.as_str()] {
            let (s, v, _) = env.call(&method, &url, Some(k), body.as_ref()).await;
            assert_eq!(s, 401, "{method} {path} with key {k}: {v}");
            assert_eq!(error_code(&v), "unauthorized");
        }
        // A valid key with every scope but the one needed.
        let others: Vec<Scope> = Scope::ALL
            .into_iter()
            .filter(|s| *s != scope && *s != Scope::Admin)
            .collect();
        let lacking = env.key("acme", &others).await;
        let (s, v, _) = env.call(&method, &url, Some(&lacking), body.as_ref()).await;
        assert_eq!(s, 403, "{method} {path} without {scope}: {v}");
        assert_eq!(error_code(&v), "forbidden");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(scope.as_str()),
            "{v}"
        );
        // Another tenant's key with every session scope: the session does not exist for
        // it, exactly as a missing one does not.
        if path.contains("{id}") {
            let (s, v, _) = env.call(&method, &url, Some(&other), body.as_ref()).await;
            let missing = "00000000-0000-7000-8000-000000000000";
            let (ms, mv, _) = env
                .call(
                    &method,
                    &concrete(path, missing),
                    Some(&other),
                    body.as_ref(),
                )
                .await;
            assert_eq!(s, 404, "{method} {path} of another tenant: {v}");
            assert_eq!(ms, 404, "{method} {path} missing: {mv}");
            assert_eq!(
                v.to_string().replace(&id, missing),
                mv.to_string(),
                "{method} {path}: another tenant's session must look missing"
            );
        }
        // The right key: only the scope the route needs.
        let right = env.key("acme", &[scope]).await;
        let (s, v, _) = env.call(&method, &url, Some(&right), body.as_ref()).await;
        assert!(
            (200..300).contains(&s),
            "{method} {path} with {scope}: {s} {v}"
        );
    }

    // Nothing above may have touched acme's sessions through globex: none was cancelled,
    // decided or messaged by it (every route it called answered 404 first).
    let (_, list) = env.get("/v1/sessions?limit=1000", &other).await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0, "{list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_never_see_each_other() {
    let env = Env::start(Duration::from_secs(30)).await;
    let rw = [Scope::SessionsRead, Scope::SessionsWrite];
    let a = env.key("acme", &rw).await;
    let b = env.key("globex", &rw).await;
    let mut acme = Vec::new();
    for i in 0..5 {
        let (s, v) = env
            .post("/v1/sessions", &a, &json!({"prompt": format!("a{i}")}))
            .await;
        assert_eq!(s, 201, "{v}");
        acme.push(v["id"].as_str().unwrap().to_string());
    }
    let (s, v) = env
        .post(
            "/v1/sessions/batch",
            &b,
            &json!([{"prompt": "b0"}, {"prompt": "b1"}]),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let globex: Vec<String> = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    for id in acme.iter().chain(&globex) {
        let row = env.store.get(id).await.unwrap().unwrap();
        assert_eq!(
            row.tenant,
            if acme.contains(id) { "acme" } else { "globex" }
        );
    }

    // Paging through globex's listing with a cursor taken from acme's newest session.
    let (_, page) = env
        .get(&format!("/v1/sessions?limit=1&cursor={}", acme[4]), &b)
        .await;
    let ids: Vec<&str> = page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.iter().all(|id| globex.iter().any(|g| g == id)),
        "{page}"
    );
    // Every page of acme's listing holds acme's sessions only, and all of them.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/sessions?limit=2&cursor={c}"),
            None => "/v1/sessions?limit=2".into(),
        };
        let (s, page) = env.get(&q, &a).await;
        assert_eq!(s, 200, "{page}");
        for v in page["sessions"].as_array().unwrap() {
            seen.push(v["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut want = acme.clone();
    want.reverse();
    assert_eq!(seen, want);
    // Filtering by another tenant's parent finds nothing either.
    let (_, v) = env
        .get(&format!("/v1/sessions?parent_id={}", globex[0]), &a)
        .await;
    assert_eq!(v["sessions"], json!([]));

    // The admin key sees every tenant.
    let (_, all) = env.get("/v1/sessions?limit=100", ADMIN_KEY).await;
    assert_eq!(all["sessions"].as_array().unwrap().len(), 7, "{all}");
    let (s, _) = env
        .get(&format!("/v1/sessions/{}", globex[0]), ADMIN_KEY)
        .await;
    assert_eq!(s, 200);
    let (s, _) = env.get(&format!("/v1/sessions/{}", globex[0]), &a).await;
    assert_eq!(s, 404);

    // A verified key is served from the cache (30 s here) without asking the database:
    // its row deleted behind the scheduler's back, it still works until the entry ages.
    let id = auth::key_id(&a).unwrap();
    shared_postgres()
        .unwrap()
        .psql(
            &env.db_url,
            &format!("DELETE FROM api_keys WHERE id = '{id}'"),
        )
        .unwrap();
    assert!(env.store.key(id).await.unwrap().is_none());
    let (s, _) = env.get("/v1/sessions", &a).await;
    assert_eq!(s, 200, "the cached key needs no database read");
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotency_keys_are_per_tenant_and_bound_to_the_request() {
    let env = Env::start(Duration::from_secs(30)).await;
    let rw = [Scope::SessionsRead, Scope::SessionsWrite];
    let a = env.key("acme", &rw).await;
    let b = env.key("globex", &rw).await;
    let req = json!({"prompt": "ship order 42", "idempotency_key": "order-42"});
    let (s, first) = env.post("/v1/sessions", &a, &req).await;
    assert_eq!(s, 201, "{first}");
    // The same request again (fields in another order): the same session.
    let (s, again) = env
        .post(
            "/v1/sessions",
            &a,
            &json!({"idempotency_key": "order-42", "prompt": "ship order 42"}),
        )
        .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["id"], first["id"]);
    // The same key with another body: a conflict naming the key, no new session.
    let (s, v) = env
        .post(
            "/v1/sessions",
            &a,
            &json!({"prompt": "ship order 43", "idempotency_key": "order-42"}),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(error_code(&v), "conflict");
    assert_eq!(v["error"]["field"], "idempotency_key");
    let (s, v) = env
        .post(
            "/v1/sessions/batch",
            &a,
            &json!([{"prompt": "x"}, {"prompt": "other", "idempotency_key": "order-42"}]),
        )
        .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["field"], "[1].idempotency_key");
    // Another tenant's same key: a session of its own, and nothing of acme's leaks.
    let (s, theirs) = env.post("/v1/sessions", &b, &req).await;
    assert_eq!(s, 201, "{theirs}");
    assert_ne!(theirs["id"], first["id"]);
    let (s, _) = env
        .get(
            &format!("/v1/sessions/{}", first["id"].as_str().unwrap()),
            &b,
        )
        .await;
    assert_eq!(s, 404);
    let (s, v) = env.post("/v1/sessions", &b, &req).await;
    assert_eq!((s, &v["id"]), (200, &theirs["id"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn revoked_and_expired_keys_are_refused() {
    // A short cache, so the test sees a revocation take effect.
    let ttl = Duration::from_millis(100);
    let env = Env::start(ttl).await;
    let key = env.key("acme", &[Scope::SessionsRead]).await;
    let (s, _) = env.get("/v1/sessions", &key).await;
    assert_eq!(s, 200);
    let id = auth::key_id(&key).unwrap().to_string();
    let revoked = env.store.revoke_key(&id).await.unwrap().unwrap();
    assert!(revoked.revoked_at.is_some());
    // Refused once the cached entry is stale.
    let (s, v) = wait_until(
        "the revocation to take effect",
        Duration::from_secs(10),
        || async {
            let (s, v) = env.get("/v1/sessions", &key).await;
            if s == 200 { Err(v) } else { Ok((s, v)) }
        },
    )
    .await;
    assert_eq!(s, 401, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("revoked"),
        "{v}"
    );

    let (new, expired) = auth::generate(
        "acme",
        vec![Scope::SessionsRead],
        None,
        Some(chrono::Utc::now() + chrono::Duration::seconds(1)),
    )
    .unwrap();
    env.store.create_key(&new).await.unwrap();
    let (s, _) = env.get("/v1/sessions", &expired).await;
    assert_eq!(s, 200);
    // Expiry is checked on every request, cached row or not: refused once it passes.
    let (s, v) = wait_until("the key to expire", Duration::from_secs(10), || async {
        let (s, v) = env.get("/v1/sessions", &expired).await;
        if s == 200 { Err(v) } else { Ok((s, v)) }
    })
    .await;
    assert_eq!(s, 401, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("expired"),
        "{v}"
    );

    // A key with the right id and a wrong secret is not the key.
    let live = env.key("acme", &[Scope::SessionsRead]).await;
    let mut forged = live.clone();
    let last = if forged.ends_with('a') { "b" } else { "a" };
    forged.replace_range(forged.len() - 1.., last);
    let (s, _) = env.get("/v1/sessions", &forged).await;
    assert_eq!(s, 401);
    let (s, _) = env.get("/v1/sessions", &live).await;
    assert_eq!(s, 200);
}

/// A keyless server (`agentq dev` on loopback) takes no write a web page elsewhere can
/// make a browser send: a form or `text/plain` POST (no preflight needed) to `/cancel`
/// or `/retry`, or any write naming a foreign `Origin`, is a 403 naming the header, and
/// nothing changes; reads from anywhere, and JSON writes from local clients or the
/// server's own pages, are served.
#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_server_refuses_writes_a_web_page_could_send() {
    let env = Env::start_with(Duration::from_secs(30), |s| {
        s.auth.admin_key_hash = None;
        s.auth.keyless = true;
        s.auth.loopback_hosts_only = true;
    })
    .await;
    let (row, _) = env
        .store
        .create_session(&NewSession::root(SessionSpec::new("hello"), "default"))
        .await
        .unwrap();
    let id = row.id;
    let host = env.base.strip_prefix("http://").unwrap().to_string();
    let own = format!("http://{host}");
    let send =
        async |method: Method, path: &str, ct: Option<&str>, origin: Option<&str>, body: &str| {
            let mut req = reqwest::Client::new()
                .request(method, format!("{}{path}", env.base))
                .body(body.to_string());
            if let Some(ct) = ct {
                req = req.header("content-type", ct);
            }
            if let Some(o) = origin {
                req = req.header("origin", o);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
            )
        };
    let cancel = format!("/v1/sessions/{id}/cancel");
    let retry = format!("/v1/sessions/{id}/retry");
    let form = Some("application/x-www-form-urlencoded");
    let json_ct = Some("application/json");
    let https_own = format!("https://{host}");
    // (method, path, content type, origin, body)
    type Write<'a> = (Method, &'a str, Option<&'a str>, Option<&'a str>, &'a str);
    let refused: Vec<Write<'_>> = vec![
        (
            Method::POST,
            &cancel,
            form,
            Some("http://evil.example"),
            "a=b",
        ),
        (Method::POST, &cancel, form, None, "a=b"),
        (Method::POST, &cancel, Some("text/plain"), Some(&own), "{}"),
        (Method::POST, &cancel, None, None, ""),
        (
            Method::POST,
            &cancel,
            json_ct,
            Some("http://evil.example"),
            "{}",
        ),
        // Another local page is another origin.
        (
            Method::POST,
            &cancel,
            json_ct,
            Some("http://localhost:1"),
            "{}",
        ),
        (Method::POST, &cancel, json_ct, Some("null"), "{}"),
        (Method::POST, &cancel, json_ct, Some(&https_own), "{}"),
        (
            Method::POST,
            &retry,
            Some("multipart/form-data; boundary=x"),
            None,
            "",
        ),
        (
            Method::POST,
            &retry,
            Some("text/plain"),
            Some("http://evil.example"),
            "{}",
        ),
        (
            Method::POST,
            "/v1/sessions",
            Some("text/plain"),
            None,
            r#"{"prompt": "p"}"#,
        ),
        (
            Method::PUT,
            "/v1/admin/budgets/x",
            Some("text/plain"),
            None,
            "{}",
        ),
        (
            Method::DELETE,
            &cancel,
            None,
            Some("http://evil.example"),
            "",
        ),
    ];
    for (method, path, ct, origin, body) in refused {
        let what = format!("{method} {path} content-type {ct:?} origin {origin:?}");
        let (status, v) = send(method, path, ct, origin, body).await;
        assert_eq!(status, 403, "{what}: {v}");
        assert_eq!(v["error"]["code"], "forbidden", "{what}: {v}");
        let field = if origin.is_some_and(|o| o != own) {
            "Origin"
        } else {
            "Content-Type"
        };
        assert_eq!(v["error"]["field"], field, "{what}: {v}");
    }
    // Nothing was cancelled; reads are served whoever asks.
    let (status, v) = send(
        Method::GET,
        &format!("/v1/sessions/{id}"),
        None,
        Some("http://evil.example"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "queued", "{v}");
    // The CLI's way (JSON, no Origin) and the server's own page are served.
    let (status, v) = send(Method::POST, &cancel, json_ct, Some(&own), "{}").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "cancelled", "{v}");
    // (Reaching the handler: a cancelled session is not one to retry.)
    let (status, v) = send(Method::POST, &retry, json_ct, None, "{}").await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("not_failed")),
        "{v}"
    );
}

/// The ids of a batch answer's sessions, and its batch id.
fn batch_ids(v: &Value) -> (Vec<String>, String) {
    let ids = v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    (ids, v["batch_id"].as_str().unwrap().to_string())
}

fn listed(v: &Value) -> Vec<String> {
    v["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_is_out_of_another_tenants_reach() {
    let env = Env::start(Duration::from_secs(30)).await;
    let rw = [Scope::SessionsRead, Scope::SessionsWrite];
    let a = env.key("acme", &rw).await;
    let b = env.key("globex", &rw).await;
    let (s, v) = env
        .post(
            "/v1/sessions/batch",
            &a,
            &json!([{"prompt": "a0"}, {"prompt": "a1"}, {"prompt": "a2"}]),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (acme, batch) = batch_ids(&v);
    // Another tenant first: its listing, cancel, retry and join of acme's batch reach
    // nothing, exactly as for a batch that does not exist.
    let missing = "00000000-0000-7000-8000-000000000000";
    for id in [batch.as_str(), missing] {
        let (s, v) = env.get(&format!("/v1/sessions?batch_id={id}"), &b).await;
        assert_eq!((s, listed(&v).len()), (200, 0), "{v}");
        let (s, v) = env
            .post("/v1/sessions/cancel", &b, &json!({"batch_id": id}))
            .await;
        assert_eq!(
            (s, &v),
            (200, &json!({"sessions": [], "next_cursor": null}))
        );
        let (s, v) = env
            .post("/v1/sessions/retry", &b, &json!({"batch_id": id}))
            .await;
        assert_eq!(
            (s, &v),
            (200, &json!({"sessions": [], "next_cursor": null}))
        );
        let (s, v) = env
            .post(
                &format!("/v1/sessions/batch?batch_id={id}"),
                &b,
                &json!([{"prompt": "intruder"}]),
            )
            .await;
        assert_eq!(s, 422, "{v}");
        assert_eq!(v["error"]["field"], "batch_id", "{v}");
        assert_eq!(
            v["error"]["message"].as_str().unwrap().replace(id, "X"),
            "no batch \"X\" of yours"
        );
    }
    for id in &acme {
        let row = env.store.get(id).await.unwrap().unwrap();
        assert_eq!(row.status, SessionStatus::Queued, "{id}");
    }

    // Its own tenant joins the batch, lists it, and cancels it a page at a time.
    let (s, v) = env
        .post(
            &format!("/v1/sessions/batch?batch_id={batch}&max_running=2"),
            &a,
            &json!([{"prompt": "a3"}]),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (joined, same) = batch_ids(&v);
    assert_eq!(same, batch);
    let (_, other) = env
        .post("/v1/sessions/batch", &a, &json!([{"prompt": "x"}]))
        .await;
    assert_ne!(batch_ids(&other).1, batch);
    let mut all: Vec<String> = acme.iter().chain(&joined).cloned().collect();
    all.reverse();
    let (s, v) = env.get(&format!("/v1/sessions?batch_id={batch}"), &a).await;
    assert_eq!((s, listed(&v)), (200, all.clone()), "{v}");
    // The admin sees it too.
    let (_, v) = env
        .get(&format!("/v1/sessions?batch_id={batch}"), ADMIN_KEY)
        .await;
    assert_eq!(listed(&v), all);

    // A session of it that failed is retried by the batch's filter; one failed outside
    // it is not.
    env.store.fail(&acme[0], "dead letter: boom").await.unwrap();
    env.store
        .fail(&acme[1], "dead letter: other")
        .await
        .unwrap();
    let outsider = batch_ids(&other).0.remove(0);
    env.store
        .fail(&outsider, "dead letter: boom")
        .await
        .unwrap();
    let (s, v) = env
        .post(
            "/v1/sessions/retry",
            &a,
            &json!({"batch_id": batch, "error_contains": "boom"}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(listed(&v), [acme[0].clone()]);
    let (_, v) = env
        .get(&format!("/v1/sessions?batch_id={batch}&status=failed"), &a)
        .await;
    assert_eq!(listed(&v), [acme[1].clone()]);

    let mut cancelled = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut body = json!({"batch_id": batch, "limit": 2});
        if let Some(c) = &cursor {
            body["cursor"] = json!(c);
        }
        let (s, v) = env.post("/v1/sessions/cancel", &a, &body).await;
        assert_eq!(s, 200, "{v}");
        cancelled.extend(listed(&v));
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    // Every unfinished one (the failed one stays failed).
    let want: Vec<String> = all.iter().filter(|id| **id != acme[1]).cloned().collect();
    assert_eq!(cancelled, want);
    let (_, v) = env
        .get(
            &format!("/v1/sessions?batch_id={batch}&status=cancelled"),
            &a,
        )
        .await;
    assert_eq!(listed(&v), want);
    let row = env.store.get(&outsider).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::Failed);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_query_parameters_and_bad_filters_are_422s_naming_them() {
    let env = Env::start(Duration::from_secs(30)).await;
    let key = env
        .key("acme", &[Scope::SessionsRead, Scope::SessionsWrite])
        .await;
    let refused = |(s, v): (u16, Value), code: &str, field: &str| {
        assert_eq!(s, 422, "{field}: {v}");
        assert_eq!(v["error"]["code"], code, "{v}");
        assert_eq!(v["error"]["field"], field, "{v}");
    };
    // `batch` is not `batch_id`: refused, not ignored (which would list everything).
    refused(
        env.get("/v1/sessions?batch=x", &key).await,
        "unknown_field",
        "batch",
    );
    let (_, v) = env.get("/v1/sessions?batch=x", &key).await;
    assert!(
        v["error"]["message"].as_str().unwrap().contains("batch_id"),
        "{v}"
    );
    refused(
        env.get("/v1/sessions?status=failed&statuss=x", &key).await,
        "unknown_field",
        "statuss",
    );
    refused(
        env.get("/v1/sessions?status=failed&status=queued", &key)
            .await,
        "invalid_field",
        "status",
    );
    refused(
        env.get(&format!("/v1/sessions?batch_id={}", "x".repeat(200)), &key)
            .await,
        "invalid_field",
        "batch_id",
    );
    let (s, v) = env.get("/v1/sessions?batch_id=&limit=", &key).await;
    assert_eq!(s, 200, "empty parameters are absent: {v}");
    refused(
        env.post(
            "/v1/sessions/batch?max_runing=3",
            &key,
            &json!([{"prompt": "a"}]),
        )
        .await,
        "unknown_field",
        "max_runing",
    );
    // The bodies of the filtered actions.
    refused(
        env.post("/v1/sessions/cancel", &key, &json!({})).await,
        "invalid_field",
        "batch_id",
    );
    refused(
        env.post("/v1/sessions/cancel", &key, &json!({"batch": "b"}))
            .await,
        "unknown_field",
        "batch",
    );
    refused(
        env.post(
            "/v1/sessions/cancel",
            &key,
            &json!({"batch_id": "b", "error_contains": "x"}),
        )
        .await,
        "invalid_field",
        "error_contains",
    );
    for limit in [json!(0), json!(1001), json!("ten")] {
        refused(
            env.post("/v1/sessions/retry", &key, &json!({"limit": limit}))
                .await,
            "invalid_field",
            "limit",
        );
    }
    refused(
        env.post(
            "/v1/sessions/retry",
            &key,
            &json!({"finished_since": "yesterday"}),
        )
        .await,
        "invalid_field",
        "finished_since",
    );
}
