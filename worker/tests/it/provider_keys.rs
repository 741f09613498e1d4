//! The worker's provider keys against a session that names its own `base_url`, in process
//! on real Postgres and Redis: for both HTTP providers the session's listener never sees
//! the worker's key, a redirect from the configured endpoint is not followed, and a tenant
//! with keys of its own sends those, never the shared ones.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::provider::factory::ProviderSettings;
use agentq_agent::spec::SessionSpec;
use agentq_core::config::PolicySection;
use agentq_core::pg::PgStore;
use agentq_core::policy::Policy;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{SessionRow, SessionStatus};
use agentq_testkit::{FakeLlm, FakeResponse, RecordedRequest, fixture};
use agentq_worker::WorkerSettings;

use common::setup;

const OPENAI_CANARY: &str = "sk-canary-worker-openai";
const ANTHROPIC_CANARY: &str = "sk-ant-canary-worker";

/// A worker whose configuration holds canary keys for `configured`, and whose policy
/// lets sessions name `allowed` as their base URL: an operator allowing an endpoint does
/// not give it the keys.
fn config(dir: &std::path::Path, configured: &FakeLlm, allowed: &[String]) -> WorkerSettings {
    let policy = PolicySection {
        base_urls: allowed.to_vec(),
        ..PolicySection::default()
    };
    WorkerSettings {
        policy: Arc::new(Policy::from_section(&policy).unwrap()),
        read_block: Duration::from_millis(200),
        workspace_root: dir.to_path_buf(),
        providers: ProviderSettings {
            openai_base_url: Some(format!("{}/v1", configured.url)),
            openai_api_key: Some(OPENAI_CANARY.into()),
            anthropic_base_url: Some(configured.url.clone()),
            anthropic_api_key: Some(ANTHROPIC_CANARY.into()),
            script: None,
            transport: Default::default(),
        },
        ..WorkerSettings::default()
    }
}

fn base(provider: &str, fake: &FakeLlm) -> String {
    match provider {
        "anthropic" => fake.url.clone(),
        _ => format!("{}/v1", fake.url),
    }
}

fn answer(provider: &str) -> FakeResponse {
    match provider {
        "anthropic" => {
            FakeResponse::sse(fixture("anthropic_stream_after_tool_result_padded.sse"), 64)
        }
        _ => FakeResponse::sse(fixture("openai_stream_text_usage.sse"), 64),
    }
}

fn spec(provider: &str, base_url: Option<String>) -> SessionSpec {
    let mut s = SessionSpec::new("hi");
    s.provider = Some(provider.into());
    s.model = Some("m".into());
    s.base_url = base_url;
    s.tools = Some(Vec::new());
    s.max_iterations = 1;
    s
}

/// Run one session on a worker with `cfg` until it is terminal.
async fn run_one(
    store: &Arc<PgStore>,
    queue: &Arc<RedisQueue>,
    cfg: WorkerSettings,
    spec: SessionSpec,
) -> SessionRow {
    common::run_one(store, queue, cfg, spec).await.0
}

fn assert_no_key(req: &RecordedRequest, keys: &[&str]) {
    for (name, value) in &req.headers {
        assert!(
            !keys.iter().any(|k| value.contains(k)),
            "header {name} carries a key: {req:?}"
        );
    }
    assert_eq!(req.header("authorization"), None, "{req:?}");
    assert_eq!(req.header("x-api-key"), None, "{req:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_base_url_never_receives_the_workers_key() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    for provider in ["openai", "anthropic"] {
        let configured = FakeLlm::start().await.unwrap();
        let attacker = FakeLlm::start().await.unwrap();
        attacker.push(answer(provider));
        let row = run_one(
            &store,
            &queue,
            config(dir.path(), &configured, &[base(provider, &attacker)]),
            spec(provider, Some(base(provider, &attacker))),
        )
        .await;
        assert_eq!(row.status, SessionStatus::Completed, "{provider}: {row:?}");
        let seen = attacker.requests();
        assert_eq!(seen.len(), 1, "{provider}");
        assert_no_key(&seen[0], &[OPENAI_CANARY, ANTHROPIC_CANARY]);
        assert_eq!(configured.request_count(), 0, "{provider}");
    }
}

/// The configured endpoint gets the key and answers 307 to a second listener: the worker
/// does not follow, the second listener is never contacted, and the session fails saying
/// why (no retries: the same request would get the same answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_from_the_configured_endpoint_is_not_followed() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    for provider in ["openai", "anthropic"] {
        let configured = FakeLlm::start().await.unwrap();
        let elsewhere = FakeLlm::start().await.unwrap();
        let ok = answer(provider);
        elsewhere.set_handler(move |_| Some(ok.clone()));
        let target = format!("{}/anything", elsewhere.url);
        configured.set_handler(move |_| {
            Some(FakeResponse::json(307, "").with_header("location", &target))
        });
        let row = run_one(
            &store,
            &queue,
            config(dir.path(), &configured, &[]),
            spec(provider, None),
        )
        .await;
        assert_eq!(row.status, SessionStatus::Failed, "{provider}: {row:?}");
        let error = row.error.clone().unwrap_or_default();
        assert!(error.contains("redirect"), "{provider}: {error}");
        assert_eq!(elsewhere.request_count(), 0, "{provider}");
        assert_eq!(configured.request_count(), 1, "{provider}");
        // The configured endpoint is the one place the key goes.
        let first = &configured.requests()[0];
        let sent = first
            .header("x-api-key")
            .or(first.header("authorization"))
            .unwrap_or_default();
        assert!(sent.contains("canary-worker"), "{provider}: {first:?}");
    }
}

/// A tenant with its own `[providers.tenants.<name>]` keys sends those to the endpoint,
/// never the shared keys; and a session of that tenant naming another URL gets neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_its_own_keys_never_sends_the_shared_ones() {
    let (store, queue, _redis) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let configured = FakeLlm::start().await.unwrap();
    let attacker = FakeLlm::start().await.unwrap();
    configured.push(answer("openai"));
    attacker.push(answer("openai"));
    let mut cfg = config(dir.path(), &configured, &[base("openai", &attacker)]);
    let mut own = cfg.providers.clone();
    own.openai_api_key = Some("sk-tenant-own".into());
    own.anthropic_api_key = None;
    cfg.tenant_providers.insert("default".into(), own);

    let row = run_one(&store, &queue, cfg.clone(), spec("openai", None)).await;
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_eq!(
        configured.requests()[0].header("authorization"),
        Some("Bearer sk-tenant-own")
    );
    let row = run_one(
        &store,
        &queue,
        cfg,
        spec("openai", Some(base("openai", &attacker))),
    )
    .await;
    assert_eq!(row.status, SessionStatus::Completed, "{row:?}");
    assert_no_key(
        &attacker.requests()[0],
        &[OPENAI_CANARY, ANTHROPIC_CANARY, "sk-tenant-own"],
    );
}
