//! `GET /v1/admin/limits` against a real Redis and Postgres: the rules configured, the
//! counts the workers' limiter keeps, the holds learned, admin only, and a Redis outage
//! answered as one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use agentq_agent::driver::{Admit, CallAsk, CallReport};
use agentq_agent::provider::scripted::ScriptedProvider;
use agentq_core::admission::Limiter;
use agentq_core::config::LimitSettings;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_scheduler::{LimitsAdmin, Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use common::wait_until;

const ADMIN_KEY: &str = "limits-admin-key";

#[tokio::test]
async fn the_admin_view_shows_rules_counts_and_holds() {
    let mut redis = RedisServer::start().unwrap();
    let rule = LimitSettings {
        provider: "scripted".into(),
        model: "*".into(),
        tenant: None,
        rpm: Some(60),
        tpm: None,
        concurrency: Some(4),
        window_secs: 60,
        reservation_ttl_secs: 300,
    };
    let mut settings = SchedulerSettings {
        limits: LimitsAdmin {
            configured: vec![rule.clone()],
            redis_url: Some(redis.url()),
            redis_cluster: false,
        },
        ..SchedulerSettings::default()
    };
    settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
    let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
    let state = Scheduler::new(Arc::new(store), queue, settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await });

    // One call in flight under the rule, one key held by a provider's refusal.
    let limiter = Limiter::connect(&redis.url(), &[rule], CancellationToken::new())
        .await
        .unwrap();
    let gate = limiter.for_session("default", &ScriptedProvider::demo());
    let ask = CallAsk {
        model: "m",
        input_tokens: 5,
        max_output_tokens: 5,
        web_searches: 0,
        max_wait: Duration::ZERO,
    };
    let Admit::Go(_in_flight) = gate.reserve(&ask).await else {
        panic!()
    };
    let refused = CallReport {
        rate_limited: Some(Some(Duration::from_secs(60))),
        ..Default::default()
    };
    let other = CallAsk {
        model: "other",
        ..ask.clone()
    };
    gate.settle(&other, Default::default(), &refused).await;

    let get = |key: &'static str| {
        let url = format!("{base}/v1/admin/limits");
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let view = wait_until("a hold to show", Duration::from_secs(10), || async {
        let (status, v) = get(ADMIN_KEY).await;
        assert_eq!(status, 200, "{v}");
        if v["holds"].as_array().is_some_and(|h| !h.is_empty()) {
            Ok(v)
        } else {
            Err(v)
        }
    })
    .await;
    assert_eq!(view["enabled"], true, "{view}");
    assert_eq!(view["configured"][0]["rpm"], 60);
    let rule = &view["rules"][0];
    assert_eq!(rule["requests_per_window"], 60, "{view}");
    assert_eq!(rule["concurrency"], 4);
    assert_eq!(rule["requests"], 1);
    assert_eq!(rule["in_flight"], 1);
    assert_eq!(rule["tokens"], 0, "no tpm rule: tokens are not counted");
    assert!(
        view["holds"][0]["key"]
            .as_str()
            .unwrap()
            .ends_with("|other"),
        "{view}"
    );

    // Not for a caller without the admin scope.
    let (status, v) = get("not-a-key").await;
    assert_eq!(status, 401, "{v}");

    // Redis gone: a 503 that says so, not a hang or a 500.
    redis.kill();
    let (status, v) = get(ADMIN_KEY).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "unavailable", "{v}");
}
