//! Sessions that wait without a lease, through the whole scheduler (`agentq_scheduler::run`,
//! as `agentq scheduler` and `agentq dev` run it) on a real Postgres and Redis: the API
//! shows what each waits for, `/metrics` counts them per reason, the sweeper puts a
//! rate-limited one back on its queue once its wake time has come and leaves a budget
//! one parked until its tenant's budget wakes it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    Claim, LeaseStore, NewSession, QueueHealth, SessionStatus, SessionStore, SweepStore, WaitReason,
};
use agentq_scheduler::SchedulerSettings;
use agentq_testkit::{RedisServer, shared_postgres};

use common::wait_until;

const ADMIN_KEY: &str = "test-admin-key";

async fn get(url: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(url)
        .bearer_auth(ADMIN_KEY)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Create a session, claim it and suspend it for `reason`.
async fn suspended(
    store: &PgStore,
    tenant: &str,
    reason: WaitReason,
    wake_at: Option<chrono::DateTime<chrono::Utc>>,
) -> String {
    let (row, _) = store
        .create_session(&NewSession::root(SessionSpec::new("wait"), "default").with_tenant(tenant))
        .await
        .unwrap();
    let Claim::Acquired { lease, row, .. } = store
        .claim(&row.id, "w", Duration::from_secs(30), 5)
        .await
        .unwrap()
    else {
        panic!("claim");
    };
    let now = store
        .suspend_for(&lease, row.wake_seq, reason, wake_at)
        .await
        .unwrap();
    assert_eq!(now.status, SessionStatus::Waiting);
    now.id
}

#[tokio::test]
async fn waits_show_and_the_sweeper_wakes_rate_limited_sessions() {
    let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = Arc::new(PgStore::connect(&db_url, 4).await.unwrap());
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
    let mut settings = SchedulerSettings {
        sweep_interval: Duration::from_millis(100),
        queues: vec!["default".into()],
        ..Default::default()
    };
    settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
    let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", api.local_addr().unwrap());
    let metrics_url = format!("http://{}/metrics", metrics.local_addr().unwrap());
    let token = CancellationToken::new();
    let server = tokio::spawn(agentq_scheduler::run(
        store.clone(),
        queue.clone(),
        settings,
        api,
        Some(metrics),
        token.clone(),
    ));

    // Far in the future: it stays while the others are looked at.
    let later = suspended(
        &store,
        "default",
        WaitReason::RateLimit,
        Some(chrono::Utc::now() + chrono::Duration::hours(1)),
    )
    .await;
    let parked = suspended(&store, "acme", WaitReason::Budget, None).await;
    let (status, v) = get(&format!("{base}/v1/sessions/{later}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "waiting");
    assert_eq!(v["wait_reason"], "rate_limit");
    assert!(v["wake_at"].is_string(), "{v}");
    assert!(v["lease_owner"].is_null(), "{v}");
    let (_, v) = get(&format!("{base}/v1/sessions/{parked}")).await;
    assert_eq!(v["wait_reason"], "budget");
    assert!(v["wake_at"].is_null(), "{v}");

    let text = reqwest::get(&metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("agentq_sessions_waiting{reason=\"rate_limit\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("agentq_sessions_waiting{reason=\"budget\"} 1"),
        "{text}"
    );

    // Due now: the sweeper queues it (an entry on its stream) and it shows no wait. The
    // stream is measured first: the sweeper may wake it as soon as it is stored.
    let before = queue.stats("default").await.map_or(0, |s| s.length);
    let due = suspended(
        &store,
        "default",
        WaitReason::RateLimit,
        Some(chrono::Utc::now()),
    )
    .await;
    wait_until(
        "the sweeper wakes the due session",
        Duration::from_secs(30),
        || async { store.get(&due).await.unwrap().unwrap().status == SessionStatus::Queued },
    )
    .await;
    wait_until("its entry", Duration::from_secs(30), || async {
        queue.stats("default").await.map_or(0, |s| s.length) > before
    })
    .await;
    let (_, v) = get(&format!("{base}/v1/sessions/{due}")).await;
    assert_eq!(v["status"], "queued");
    assert!(v["wait_reason"].is_null() && v["wake_at"].is_null(), "{v}");
    let claimed = store
        .claim(&due, "w2", Duration::from_secs(30), 5)
        .await
        .unwrap();
    assert!(matches!(claimed, Claim::Acquired { .. }), "{claimed:?}");

    // The others still wait: the parked one until its tenant's budget wakes it.
    assert_eq!(
        store.get(&later).await.unwrap().unwrap().status,
        SessionStatus::Waiting
    );
    assert_eq!(
        store.get(&parked).await.unwrap().unwrap().status,
        SessionStatus::Waiting
    );
    assert!(
        store
            .wake_budget_waiters("default", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.wake_budget_waiters("acme", 10).await.unwrap(),
        vec![agentq_core::Woken {
            id: parked.clone(),
            queue: "default".to_string(),
            held: false,
        }]
    );

    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("run stops on the token")
        .unwrap()
        .unwrap();
}
