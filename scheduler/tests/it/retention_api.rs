//! Retention rules over the admin API, on Postgres: only an admin key reads or sets them
//! (a tenant's key is refused 403, no key 401); a bad body is a 422 naming its field (0,
//! negative, huge and fractional days, an unknown `keep`, an unknown field, no days); a
//! stored rule is listed over the configured one it replaces, and changes what the next
//! retention pass deletes; deleting it brings the configured rule back.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::config::{RetentionOverride, RetentionSection, WorkspaceSection};
use agentq_core::metrics::Metrics;
use agentq_core::retention::Keep;
use agentq_core::{NewSession, Store};
use agentq_scheduler::SchedulerSettings;
use agentq_scheduler::retention::Retention;
use agentq_scheduler::webhooks::ManualClock;

use common::{ADMIN_KEY, Served};

/// The served scheduler, and the calls these tests make of it.
struct Env {
    served: Served,
    store: Arc<dyn Store>,
    tenant_key: String,
}

impl Env {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new().request(method, format!("{}{path}", self.served.base));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        common::read(req.send().await.unwrap()).await
    }

    /// A call of the admin key, with no body.
    async fn admin(&self, method: reqwest::Method, path: &str) -> (u16, Value) {
        self.call(method, path, Some(ADMIN_KEY), None).await
    }

    async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::PUT, path, Some(ADMIN_KEY), Some(body))
            .await
    }
}

/// The configured retention: 30 days, acme's trees 7.
fn configured() -> RetentionSection {
    RetentionSection {
        days: Some(30),
        tenants: [(
            "acme".to_string(),
            RetentionOverride {
                days: Some(7),
                keep: None,
            },
        )]
        .into(),
        pause_ms: 0,
        ..RetentionSection::default()
    }
}

async fn start() -> Env {
    let settings = SchedulerSettings {
        retention: configured(),
        ..SchedulerSettings::default()
    };
    let served = Served::start(settings).await;
    Env {
        store: served.store.clone(),
        tenant_key: served.acme.clone(),
        served,
    }
}

/// A finished root session of `tenant` on `queue`; its id.
async fn finished(store: &dyn Store, tenant: &str, queue: &str) -> String {
    let new = NewSession::root(SessionSpec::new("old"), queue).with_tenant(tenant);
    let id = store.create_session(&new).await.unwrap().0.id;
    store.request_cancel(&id).await.unwrap();
    id
}

/// One pass as the scheduler runs it, ten days on.
async fn pass_ten_days_on(store: Arc<dyn Store>) -> u64 {
    let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
    let clock = Arc::new(ManualClock::new(Utc::now() + TimeDelta::days(10)));
    let r = Retention::new(
        store,
        configured(),
        WorkspaceSection::default(),
        clock,
        metrics,
    )
    .unwrap();
    r.pass(&CancellationToken::new()).await.unwrap().trees
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_rules_over_the_admin_api() {
    let env = start().await;
    let body = json!({"days": 40, "keep": "result"});
    // Admin only.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/admin/retention"),
        (reqwest::Method::PUT, "/v1/admin/retention/tenants/acme"),
        (reqwest::Method::DELETE, "/v1/admin/retention/tenants/acme"),
        (reqwest::Method::PUT, "/v1/admin/retention/queues/default"),
        (
            reqwest::Method::DELETE,
            "/v1/admin/retention/queues/default",
        ),
    ] {
        let (status, v) = env
            .call(
                method.clone(),
                path,
                Some(&env.tenant_key),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, 403, "{method} {path}: {v}");
        let (status, v) = env
            .call(method.clone(), path, None, Some(body.clone()))
            .await;
        assert_eq!(status, 401, "{method} {path}: {v}");
    }
    // Bad bodies name their field.
    for (bad, field) in [
        (json!({"days": 0}), "days"),
        (json!({"days": -1}), "days"),
        (json!({"days": 36_501}), "days"),
        (json!({"days": 1_000_000_000_000u64}), "days"),
        (json!({"days": 1.5}), "days"),
        (json!({"days": "7"}), "days"),
        (json!({}), "days"),
        (json!({"days": 7, "keep": "transcript"}), "keep"),
        (json!({"days": 7, "keep": 1}), "keep"),
        (json!({"days": 7, "ttl": 3}), "ttl"),
    ] {
        for path in [
            "/v1/admin/retention/tenants/acme",
            "/v1/admin/retention/queues/q",
        ] {
            let (status, v) = env.put(path, bad.clone()).await;
            assert_eq!(status, 422, "{bad} at {path}: {v}");
            assert_eq!(v["error"]["field"], field, "{bad} at {path}: {v}");
        }
    }
    let (status, v) = env
        .put("/v1/admin/retention/queues/bad%20name", json!({"days": 7}))
        .await;
    assert_eq!(
        (status, &v["error"]["field"]),
        (422, &json!("queue")),
        "{v}"
    );
    let (status, v) = env
        .put("/v1/admin/retention/tenants/bad%20name", json!({"days": 7}))
        .await;
    assert_eq!(
        (status, &v["error"]["field"]),
        (422, &json!("tenant")),
        "{v}"
    );
    assert!(env.store.retention_rules().await.unwrap().is_empty());

    // The configured rules, listed; nothing of acme is due ten days on... but at 7 days
    // acme's old tree would go: the stored rule of 40 days keeps it.
    let acme = finished(env.store.as_ref(), "acme", "default").await;
    let globex = finished(env.store.as_ref(), "globex", "scratch").await;
    let (status, v) = env.admin(reqwest::Method::GET, "/v1/admin/retention").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((&v["days"], &v["keep"]), (&json!(30), &json!("none")));
    assert_eq!(v["tenants"][0]["source"], "config", "{v}");
    assert_eq!(v["tenants"][0]["days"], 7, "{v}");
    let (status, v) = env
        .put("/v1/admin/retention/tenants/acme", body.clone())
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["days"], &v["keep"], &v["source"]),
        (&json!(40), &json!("result"), &json!("stored"))
    );
    let (status, v) = env
        .put("/v1/admin/retention/queues/scratch", json!({"days": 2}))
        .await;
    assert_eq!((status, &v["keep"]), (200, &json!("none")), "{v}");
    let (status, v) = env.admin(reqwest::Method::GET, "/v1/admin/retention").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tenants"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(
        (&v["tenants"][0]["source"], &v["tenants"][0]["days"]),
        (&json!("stored"), &json!(40)),
        "{v}"
    );
    assert_eq!(
        (&v["queues"][0]["name"], &v["queues"][0]["days"]),
        (&json!("scratch"), &json!(2)),
        "{v}"
    );

    // Ten days on: the scratch queue's stored 2 days take globex's tree; acme's stored 40
    // keep its tree (its configured 7 would have taken it).
    assert_eq!(pass_ten_days_on(env.store.clone()).await, 1);
    assert!(env.store.get(&globex).await.unwrap().is_none());
    assert!(env.store.get(&acme).await.unwrap().is_some());

    // Deleted, acme's configured rule is in force again, and the next pass takes it.
    let (status, _) = env
        .admin(reqwest::Method::DELETE, "/v1/admin/retention/tenants/acme")
        .await;
    assert_eq!(status, 204);
    let (status, v) = env
        .admin(reqwest::Method::DELETE, "/v1/admin/retention/tenants/acme")
        .await;
    assert_eq!(status, 404, "{v}");
    let stored = env.store.retention_rules().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].name.as_str(), stored[0].keep),
        ("scratch", Keep::None)
    );
    assert_eq!(pass_ten_days_on(env.store.clone()).await, 1);
    assert!(env.store.get(&acme).await.unwrap().is_none());
}
