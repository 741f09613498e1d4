//! The worker holds every stored session to its tenant's policy before running it: a row
//! written straight into the store (as an older or compromised scheduler would) that asks
//! for more than the policy allows fails with the field named, before any LLM call or
//! tool. Real Postgres and Redis; the LLM is a local OpenAI-compatible fake.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::spec::SessionSpec;
use agentq_core::config::PolicySection;
use agentq_core::pg::PgStore;
use agentq_core::policy::Policy;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{EnqueueReason, NewSession, SessionRow, SessionStatus, SessionStore, WorkQueue};
use agentq_testkit::{FakeLlm, FakeResponse, RedisServer};
use agentq_worker::WorkerSettings;

fn openai_answer(text: &str) -> String {
    let chunk = |delta: Value, finish: Option<&str>| {
        let v = json!({
            "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        format!("data: {v}\n\n")
    };
    let mut s = chunk(json!({"role": "assistant", "content": text}), None);
    s += &chunk(json!({}), Some("stop"));
    s += "data: [DONE]\n\n";
    s
}

struct Env {
    store: Arc<PgStore>,
    queue: Arc<RedisQueue>,
    fake: FakeLlm,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        let (store, queue, redis) = common::setup().await;
        Env {
            store,
            queue,
            fake: FakeLlm::start().await.unwrap(),
            _redis: redis,
            _dir: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self, policy: PolicySection) -> WorkerSettings {
        let mut cfg = WorkerSettings {
            concurrency: 8,
            read_block: Duration::from_millis(200),
            heartbeat_interval: Duration::from_millis(300),
            lease_ttl: Duration::from_secs(2),
            reclaim_min_idle: Duration::from_secs(2),
            reclaim_interval: Duration::from_millis(500),
            workspace_root: self._dir.path().to_path_buf(),
            default_provider: Some("openai".into()),
            policy: Arc::new(Policy::from_section(&policy).unwrap()),
            ..WorkerSettings::default()
        };
        // The operator's endpoint and key: what a forbidden row would like to reach.
        cfg.providers.openai_base_url = Some(format!("{}/v1", self.fake.url));
        cfg.providers.openai_api_key = Some("sk-canary".into());
        cfg
    }

    /// Insert a row as anything with store access could, and put it on the queue.
    async fn insert(&self, spec: SessionSpec, depth: u32) -> String {
        let mut new = NewSession::root(spec, "default");
        new.depth = depth;
        let (row, _) = self.store.create_session(&new).await.unwrap();
        self.queue
            .enqueue("default", &row.id, EnqueueReason::New)
            .await
            .unwrap();
        row.id
    }

    async fn run_until_terminal(&self, cfg: WorkerSettings, ids: &[String]) -> Vec<SessionRow> {
        let (rows, _) =
            common::run_to_end(&self.store, &self.queue, cfg, ids, Duration::from_secs(60)).await;
        rows
    }
}

fn bounded() -> PolicySection {
    PolicySection {
        providers: vec!["openai".into()],
        models: vec!["gpt-4o*".into()],
        max_iterations: Some(10),
        max_tokens: Some(4096),
        token_budget: Some(10_000),
        tool_timeout_secs: Some(60),
        approval_timeout_secs: Some(60),
        timeout_secs: Some(600),
        max_depth: Some(1),
        ..PolicySection::default()
    }
}

/// A spec within [`bounded`].
fn within(prompt: &str) -> SessionSpec {
    let mut s = SessionSpec::new(prompt);
    s.max_iterations = 5;
    s.max_tokens = 1000;
    s.tool_timeout_secs = 30;
    s.approval_timeout_secs = 30;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_rows_beyond_policy_fail_naming_the_field_without_any_llm_call() {
    let env = Env::start().await;
    env.fake.push(FakeResponse::sse(openai_answer("fine"), 64));
    type Tweak = fn(&mut SessionSpec);
    let forbidden: Vec<(&str, Tweak, u32)> = vec![
        (
            "tools[1]",
            |s| s.tools = Some(vec!["read_file".into(), "write_file".into()]),
            0,
        ),
        // The operator's own endpoint named by the session: allowed only if listed.
        (
            "base_url",
            |s| s.base_url = Some("http://127.0.0.1:9/v1".into()),
            0,
        ),
        ("provider", |s| s.provider = Some("anthropic".into()), 0),
        ("model", |s| s.model = Some("gpt-5".into()), 0),
        ("max_iterations", |s| s.max_iterations = 11, 0),
        // The spec's default (8192) stored as is: a stored row cannot say it was unsent.
        ("max_tokens", |s| s.max_tokens = 8192, 0),
        ("token_budget", |s| s.token_budget = Some(10_001), 0),
        ("tool_timeout_secs", |s| s.tool_timeout_secs = 61, 0),
        (
            "approval_timeout_secs",
            |s| s.approval_timeout_secs = 300,
            0,
        ),
        ("timeout_secs", |s| s.timeout_secs = Some(601), 0),
        ("depth", |_| {}, 2),
    ];
    let mut ids = Vec::new();
    for (field, tweak, depth) in &forbidden {
        let mut spec = within(&format!("forbidden {field}"));
        tweak(&mut spec);
        ids.push(env.insert(spec, *depth).await);
    }
    // The control: the same worker runs a row within the policy against the fake.
    let ok = env.insert(within("allowed"), 0).await;
    ids.push(ok.clone());
    let rows = env.run_until_terminal(env.config(bounded()), &ids).await;

    for ((field, _, _), row) in forbidden.iter().zip(&rows) {
        assert_eq!(row.status, SessionStatus::Failed, "{field}: {row:?}");
        let error = row.error.clone().unwrap_or_default();
        assert!(
            error.contains("policy") && error.contains(&format!("{field}:")),
            "{field}: {error}"
        );
        assert_eq!(row.iteration, 0, "{field}");
        assert!(env.store.messages(&row.id).await.unwrap().len() <= 1);
    }
    let control = rows.last().unwrap();
    assert_eq!(control.status, SessionStatus::Completed, "{control:?}");
    assert_eq!(control.result.as_deref(), Some("fine"));
    // Only the control reached the model; the unset budget and deadline got the bounds.
    assert_eq!(env.fake.request_count(), 1);
    let body = env.fake.requests()[0].body.to_string();
    assert!(
        body.contains("allowed") && !body.contains("forbidden"),
        "{body}"
    );
}

/// The default policy: a session may name no base_url, and gets the read-only tools only;
/// a session that names none gets the worker's defaults the policy allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_refuses_base_urls_and_writing_tools() {
    let env = Env::start().await;
    let mut ids = Vec::new();
    for tweak in [
        (|s: &mut SessionSpec| s.base_url = Some("http://127.0.0.1:9/v1".into()))
            as fn(&mut SessionSpec),
        |s| s.tools = Some(vec!["shell".into()]),
        |s| s.tools = Some(vec!["http_fetch".into()]),
        |s| s.tools = Some(vec!["edit_file".into()]),
    ] {
        let mut spec = SessionSpec::new("escalate");
        tweak(&mut spec);
        ids.push(env.insert(spec, 0).await);
    }
    let rows = env
        .run_until_terminal(env.config(PolicySection::default()), &ids)
        .await;
    for (row, field) in rows
        .iter()
        .zip(["base_url", "tools[0]", "tools[0]", "tools[0]"])
    {
        assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
        let error = row.error.clone().unwrap_or_default();
        assert!(error.contains(&format!("{field}:")), "{error}");
    }
    assert_eq!(env.fake.request_count(), 0);
}

/// The worker applies the session's tenant's override, not the global rule: here the
/// tenant of these rows (`default`, until rows carry a tenant of their own) may use
/// `list_dir` only, though the global policy allows `read_file` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_tenant_override_replaces_the_global_rule() {
    let env = Env::start().await;
    env.fake
        .push(FakeResponse::sse(openai_answer("listed"), 64));
    let mut policy = PolicySection::default();
    policy.tenants.insert(
        agentq_core::policy::DEFAULT_TENANT.into(),
        agentq_core::config::TenantPolicySection {
            tools: Some(vec!["list_dir".into()]),
            ..Default::default()
        },
    );
    let mut read = SessionSpec::new("read");
    read.tools = Some(vec!["read_file".into()]);
    let mut list = SessionSpec::new("list");
    list.tools = Some(vec!["list_dir".into()]);
    let ids = vec![env.insert(read, 0).await, env.insert(list, 0).await];
    let rows = env.run_until_terminal(env.config(policy), &ids).await;
    assert_eq!(rows[0].status, SessionStatus::Failed, "{:?}", rows[0]);
    let error = rows[0].error.clone().unwrap_or_default();
    assert!(
        error.contains("tools[0]:") && error.contains("read_file"),
        "{error}"
    );
    assert_eq!(rows[1].status, SessionStatus::Completed, "{:?}", rows[1]);
    assert_eq!(env.fake.request_count(), 1);
}

/// Rows of two tenants, the same request: each runs under its own tenant's policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_runs_under_its_own_tenants_policy() {
    let env = Env::start().await;
    env.fake.push(FakeResponse::sse(openai_answer("read"), 64));
    let mut policy = PolicySection::default();
    for (tenant, tool) in [("acme", "read_file"), ("globex", "list_dir")] {
        policy.tenants.insert(
            tenant.into(),
            agentq_core::config::TenantPolicySection {
                tools: Some(vec![tool.into()]),
                ..Default::default()
            },
        );
    }
    let mut ids = Vec::new();
    for tenant in ["acme", "globex"] {
        let mut spec = SessionSpec::new("read");
        spec.tools = Some(vec!["read_file".into()]);
        let new = NewSession::root(spec, "default").with_tenant(tenant);
        let (row, _) = env.store.create_session(&new).await.unwrap();
        env.queue
            .enqueue("default", &row.id, EnqueueReason::New)
            .await
            .unwrap();
        ids.push(row.id);
    }
    let rows = env.run_until_terminal(env.config(policy), &ids).await;
    assert_eq!(rows[0].tenant, "acme");
    assert_eq!(rows[0].status, SessionStatus::Completed, "{:?}", rows[0]);
    assert_eq!(rows[1].tenant, "globex");
    assert_eq!(rows[1].status, SessionStatus::Failed, "{:?}", rows[1]);
    let error = rows[1].error.clone().unwrap_or_default();
    assert!(
        error.contains("tools[0]:") && error.contains("read_file"),
        "{error}"
    );
    assert_eq!(env.fake.request_count(), 1);
}

/// A row on a queue its tenant's policy does not list (written by anything with store
/// access) fails naming `queue` on the worker that consumes that queue, before any LLM
/// call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_rows_on_a_queue_beyond_policy_fail_naming_queue() {
    let env = Env::start().await;
    let id = env.insert(within("on the wrong pool"), 0).await;
    let policy = PolicySection {
        queues: vec!["public-*".into()],
        ..bounded()
    };
    let rows = env.run_until_terminal(env.config(policy), &[id]).await;
    let row = &rows[0];
    assert_eq!(row.status, SessionStatus::Failed, "{row:?}");
    let error = row.error.clone().unwrap_or_default();
    assert!(
        error.contains("policy") && error.contains("queue:"),
        "{error}"
    );
    assert_eq!(row.iteration, 0);
    assert_eq!(env.fake.request_count(), 0);
}
