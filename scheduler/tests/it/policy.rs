//! The operator's policy at the HTTP API, against a real Postgres and a real Redis: every
//! request beyond it is a 422 naming the field (a batch item by its index), nothing is
//! written, and a default above a bound is stored as the bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use serde_json::{Value, json};

use agentq_core::config::PolicySection;
use agentq_core::pg::PgStore;
use agentq_core::policy::Policy;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{SessionStore, WorkQueue};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::bearer_client;

struct Env {
    base: String,
    http: reqwest::Client,
    store: Arc<PgStore>,
    db_url: String,
    _redis: RedisServer,
}

/// Requests of these tests act as the admin (tenant `default`); `tenants_get_their_own_policy`
/// uses keys of two tenants.
const ADMIN_KEY: &str = "policy-test-admin-key";

fn admin_client() -> reqwest::Client {
    bearer_client(ADMIN_KEY)
}

impl Env {
    async fn start(policy: PolicySection) -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 4).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        queue.ensure_queue("default").await.unwrap();
        let mut settings = SchedulerSettings {
            policy: Arc::new(Policy::from_section(&policy).unwrap()),
            ..SchedulerSettings::default()
        };
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        let state = Scheduler::new(store.clone(), queue, settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        Env {
            base: format!("http://{addr}"),
            http: admin_client(),
            store,
            db_url,
            _redis: redis,
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    fn row_count(&self) -> u64 {
        shared_postgres()
            .unwrap()
            .psql(&self.db_url, "SELECT count(*) FROM sessions")
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn bounded() -> PolicySection {
    PolicySection {
        providers: vec!["openai".into(), "scripted".into()],
        models: vec!["gpt-4o*".into()],
        base_urls: vec!["http://llm.internal:8000/v1".into()],
        tools: vec![
            "read_file".into(),
            "write_file".into(),
            "spawn_agent".into(),
            "mcp__time__*".into(),
        ],
        max_iterations: Some(10),
        max_tokens: Some(4096),
        token_budget: Some(10_000),
        tool_timeout_secs: Some(60),
        approval_timeout_secs: Some(120),
        timeout_secs: Some(600),
        max_children: Some(2),
        max_depth: Some(1),
        ..PolicySection::default()
    }
}

/// Each field with a value the bounded policy refuses, and the field the refusal names
/// (a tool by its place in the list).
fn refusals() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        ("provider", json!("anthropic"), "provider"),
        ("model", json!("gpt-5"), "model"),
        ("base_url", json!("http://llm.internal:8000/v2"), "base_url"),
        (
            "base_url",
            json!("http://llm.internal:8000/v1/chat"),
            "base_url",
        ),
        (
            "base_url",
            json!("https://llm.internal:8000/v1"),
            "base_url",
        ),
        ("base_url", json!("http://127.0.0.1:7852/v1"), "base_url"),
        ("tools", json!(["read_file", "shell"]), "tools[1]"),
        ("tools", json!(["http_fetch"]), "tools[0]"),
        // An MCP server's tools are tools like any other: the policy names them.
        ("tools", json!(["read_file", "mcp__tickets__*"]), "tools[1]"),
        ("tools", json!(["mcp__tickets__close"]), "tools[0]"),
        ("max_iterations", json!(11), "max_iterations"),
        ("max_tokens", json!(4097), "max_tokens"),
        ("token_budget", json!(10_001), "token_budget"),
        ("tool_timeout_secs", json!(61), "tool_timeout_secs"),
        ("approval_timeout_secs", json!(121), "approval_timeout_secs"),
        ("timeout_secs", json!(601), "timeout_secs"),
    ]
}

fn assert_refused(status: u16, body: &Value, field: &str) {
    assert_eq!(status, 422, "{field}: {body}");
    assert_eq!(body["error"]["code"], "invalid_field", "{body}");
    assert_eq!(body["error"]["field"], field, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("policy"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_a_422_naming_its_field_and_writes_nothing() {
    let env = Env::start(bounded()).await;
    for (field, value, named) in refusals() {
        let mut body = json!({"prompt": "p"});
        body[field] = value;
        let (status, answer) = env.post("/v1/sessions", &body).await;
        assert_refused(status, &answer, named);
    }
    assert_eq!(env.row_count(), 0);

    // Each value just within the policy is accepted, as sent.
    let (status, answer) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "provider": "openai", "model": "gpt-4o-mini",
                    "base_url": "http://LLM.Internal:8000/v1/",
                    "tools": ["write_file", "mcp__time__*", "mcp__time__get_current_time"],
                    "max_iterations": 10, "max_tokens": 4096, "token_budget": 10_000,
                    "tool_timeout_secs": 60, "approval_timeout_secs": 120, "timeout_secs": 600}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let row = env
        .store
        .get(answer["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.spec.max_iterations, 10);
    assert_eq!(
        row.spec.tools,
        Some(vec![
            "write_file".to_string(),
            "mcp__time__*".to_string(),
            "mcp__time__get_current_time".to_string()
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsent_limits_above_a_bound_are_stored_as_the_bound() {
    let env = Env::start(bounded()).await;
    let (status, answer) = env.post("/v1/sessions", &json!({"prompt": "p"})).await;
    assert_eq!(status, 201, "{answer}");
    let row = env
        .store
        .get(answer["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    // The spec's defaults (40 iterations, 8192 tokens, 300 s) are above the bounds.
    assert_eq!(row.spec.max_iterations, 10);
    assert_eq!(row.spec.max_tokens, 4096);
    assert_eq!(row.spec.tool_timeout_secs, 60);
    assert_eq!(row.spec.approval_timeout_secs, 120);
    // No budget or deadline sent: the bound applies.
    assert_eq!(row.spec.token_budget, Some(10_000));
    assert_eq!(row.spec.timeout_secs, Some(600));
    // Below the bounds, what was sent is kept.
    let (_, answer) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "max_iterations": 3, "token_budget": 5}),
        )
        .await;
    let row = env
        .store
        .get(answer["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.spec.max_iterations, 3);
    assert_eq!(row.spec.token_budget, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_item_beyond_policy_is_named_by_its_index_and_nothing_is_written() {
    let env = Env::start(bounded()).await;
    for (field, value, named) in refusals() {
        let mut bad = json!({"prompt": "bad"});
        bad[field] = value;
        let batch = json!([{"prompt": "a"}, {"prompt": "b"}, bad, {"prompt": "d"}]);
        let (status, answer) = env.post("/v1/sessions/batch", &batch).await;
        assert_refused(status, &answer, &format!("[2].{named}"));
    }
    assert_eq!(env.row_count(), 0);
    let (status, answer) = env
        .post(
            "/v1/sessions/batch",
            &json!([{"prompt": "a"}, {"prompt": "b", "max_iterations": 2}]),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(env.row_count(), 2);
    let first = env
        .store
        .get(answer["sessions"][0]["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.spec.max_iterations, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_refuses_any_base_url_and_tools_that_change_things() {
    let env = Env::start(PolicySection::default()).await;
    for (field, value, named) in [
        ("base_url", json!("http://127.0.0.1:7852/v1"), "base_url"),
        ("base_url", json!("https://api.openai.com/v1"), "base_url"),
        ("tools", json!(["write_file"]), "tools[0]"),
        ("tools", json!(["edit_file"]), "tools[0]"),
        ("tools", json!(["shell"]), "tools[0]"),
        ("tools", json!(["http_fetch"]), "tools[0]"),
        // No MCP server's tools unless the policy names them.
        ("tools", json!(["read_file", "mcp__time__*"]), "tools[1]"),
    ] {
        let mut body = json!({"prompt": "p"});
        body[field] = value;
        let (status, answer) = env.post("/v1/sessions", &body).await;
        assert_refused(status, &answer, named);
    }
    assert_eq!(env.row_count(), 0);
    let (status, answer) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "tools": ["read_file", "list_dir", "glob", "grep", "spawn_agent"],
                    "max_iterations": 10000}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
}

/// A request passes its tenant's override, which replaces the global fields it sets: here
/// the tenant of every request (`default`, until requests carry the caller's tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_tenant_override_replaces_the_global_rule() {
    let mut policy = bounded();
    policy.tenants.insert(
        agentq_core::policy::DEFAULT_TENANT.into(),
        agentq_core::config::TenantPolicySection {
            tools: Some(vec!["list_dir".into()]),
            max_iterations: Some(5),
            ..Default::default()
        },
    );
    let env = Env::start(policy).await;
    let (status, answer) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "tools": ["read_file"]}),
        )
        .await;
    assert_refused(status, &answer, "tools[0]");
    let (status, answer) = env
        .post("/v1/sessions", &json!({"prompt": "p", "max_iterations": 6}))
        .await;
    assert_refused(status, &answer, "max_iterations");
    let (status, answer) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "tools": ["list_dir"]}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let row = env
        .store
        .get(answer["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    // The tenant's bound for what it sets, the global one for the rest.
    assert_eq!(row.spec.max_iterations, 5);
    assert_eq!(row.spec.token_budget, Some(10_000));
}

/// Two tenants' keys, two policies: each request is held to its own key's tenant, and the
/// session is stored under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_is_held_to_its_own_policy() {
    use agentq_core::KeyStore;
    use agentq_core::auth::{Scope, generate};
    let mut policy = PolicySection::default();
    policy.tenants.insert(
        "acme".into(),
        agentq_core::config::TenantPolicySection {
            tools: Some(vec!["read_file".into(), "write_file".into()]),
            ..Default::default()
        },
    );
    policy.tenants.insert(
        "globex".into(),
        agentq_core::config::TenantPolicySection {
            tools: Some(vec!["list_dir".into()]),
            ..Default::default()
        },
    );
    let env = Env::start(policy).await;
    let mut keys = Vec::new();
    for tenant in ["acme", "globex"] {
        let (new, key) = generate(tenant, vec![Scope::SessionsWrite], None, None).unwrap();
        env.store.create_key(&new).await.unwrap();
        keys.push(bearer_client(&key));
    }
    let post = |client: &reqwest::Client, tools: &[&str]| {
        let req = client
            .post(format!("{}/v1/sessions", env.base))
            .json(&json!({"prompt": "p", "tools": tools}));
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let (status, answer) = post(&keys[0], &["write_file"]).await;
    assert_eq!(status, 201, "{answer}");
    let row = env
        .store
        .get(answer["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.tenant, "acme");
    let (status, answer) = post(&keys[1], &["write_file"]).await;
    assert_refused(status, &answer, "tools[0]");
    let (status, answer) = post(&keys[1], &["list_dir"]).await;
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = post(&keys[0], &["list_dir"]).await;
    assert_refused(status, &answer, "tools[0]");
    // The admin's own tenant (`default`) has the global policy: reads only.
    let (status, answer) = env
        .post(
            "/v1/sessions",
            &json!({"prompt": "p", "tools": ["write_file"]}),
        )
        .await;
    assert_refused(status, &answer, "tools[0]");
}

/// A tenant picks its session's `queue`, and so the worker pool that runs it (pools may
/// differ in what their tools may reach: one may allow the private network). A queue the
/// policy does not list is refused naming `queue`, for one request and a batch item, and
/// nothing is written.
#[tokio::test(flavor = "multi_thread")]
async fn queues_beyond_policy_are_refused() {
    let env = Env::start(PolicySection {
        queues: vec!["default".into(), "batch-*".into()],
        ..PolicySection::default()
    })
    .await;
    let (status, v) = env
        .post("/v1/sessions", &json!({"prompt": "p", "queue": "internal"}))
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "queue", "{v}");
    let (status, v) = env
        .post(
            "/v1/sessions/batch",
            &json!([{"prompt": "p"}, {"prompt": "p", "queue": "internal"}]),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], "[1].queue", "{v}");
    assert_eq!(env.row_count(), 0);
    let (status, v) = env.post("/v1/queues", &json!({"name": "batch-7"})).await;
    assert_eq!(status, 201, "{v}");
    for ok in [
        json!({"prompt": "p"}),
        json!({"prompt": "p", "queue": "batch-7"}),
    ] {
        let (status, v) = env.post("/v1/sessions", &ok).await;
        assert_eq!(status, 201, "{ok}: {v}");
    }
}

/// `GET /v1/queues` shows a tenant the queues it may put sessions on (its own policy's,
/// including the configured ones it allows), never another tenant's; the admin sees
/// every queue.
#[tokio::test]
async fn a_tenant_lists_only_the_queues_it_may_use() {
    use agentq_core::KeyStore;
    use agentq_core::auth::{self, Scope};
    use agentq_core::config::TenantPolicySection;

    let tenant = |queues: &[&str]| TenantPolicySection {
        queues: Some(queues.iter().map(|q| q.to_string()).collect()),
        ..TenantPolicySection::default()
    };
    let env = Env::start(PolicySection {
        queues: vec!["default".into()],
        tenants: [
            ("acme".to_string(), tenant(&["default", "acme-*"])),
            ("beta".to_string(), tenant(&["beta-*"])),
        ]
        .into(),
        ..PolicySection::default()
    })
    .await;
    for name in ["acme-gpu", "beta-gpu", "beta-cpu", "internal"] {
        let (status, v) = env.post("/v1/queues", &json!({"name": name})).await;
        assert_eq!(status, 201, "{v}");
    }
    let listed = |key: String| {
        let base = env.base.clone();
        async move {
            let r = bearer_client(&key)
                .get(format!("{base}/v1/queues"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            let names: Vec<String> = v["queues"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| q.as_str().unwrap().to_string())
                .collect();
            names
        }
    };
    let key = |t: &str| {
        let (new, key) = auth::generate(t, vec![Scope::SessionsRead], None, None).unwrap();
        (new, key)
    };
    let (acme_row, acme) = key("acme");
    let (beta_row, beta) = key("beta");
    let (other_row, other) = key("other");
    for row in [&acme_row, &beta_row, &other_row] {
        env.store.create_key(row).await.unwrap();
    }
    assert_eq!(listed(acme).await, ["default", "acme-gpu"]);
    assert_eq!(listed(beta).await, ["beta-gpu", "beta-cpu"]);
    // A tenant without a section of its own gets the global policy's.
    assert_eq!(listed(other).await, ["default"]);
    assert_eq!(
        listed(ADMIN_KEY.to_string()).await,
        ["default", "acme-gpu", "beta-gpu", "beta-cpu", "internal"]
    );
}
