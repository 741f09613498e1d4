//! Scheduling across tenants, through the scheduler's API (in process: its HTTP routes,
//! dispatcher and sweeper, on the cluster's Postgres and Redis) to real worker processes:
//! a flood by one tenant does not starve a few sessions of another, priorities order the
//! backlog, caps on running sessions hold, and a Redis restart under a held backlog loses
//! and repeats nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_core::auth::{self, Scope};
use agentq_core::config::{SchedulingSection, TenantScheduling};
use agentq_core::{ListFilter, Queue, SessionRow, SessionStatus, Store};
use agentq_scheduler::SchedulerSettings;

use crate::common::{Cluster, ClusterOpts, Script, Sub, Turn, WorkerOpts, eventually, poll};

const T: Duration = Duration::from_secs(240);

/// The scheduler of a test, serving on a loopback port.
pub struct Api {
    pub url: String,
    pub http: reqwest::Client,
    pub keys: HashMap<String, String>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Api {
    pub async fn start(c: &Cluster, scheduling: SchedulingSection, tenants: &[&str]) -> Api {
        let store: Arc<dyn Store> = c.open_store(8).await;
        let queue: Arc<dyn Queue> = Arc::new(c.open_queue().await);
        let mut keys = HashMap::new();
        for t in tenants {
            let (new, key) = auth::generate(
                t,
                vec![Scope::SessionsWrite, Scope::SessionsRead],
                None,
                None,
            )
            .unwrap();
            store.create_key(&new).await.unwrap();
            keys.insert(t.to_string(), key);
        }
        let settings = SchedulerSettings {
            sweep_interval: Duration::from_millis(300),
            sweep_age: Duration::from_secs(1),
            scheduling,
            ..SchedulerSettings::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            agentq_scheduler::run(store, queue, settings, listener, None, token)
                .await
                .unwrap();
        });
        Api {
            url,
            http: reqwest::Client::new(),
            keys,
            stop,
            task,
        }
    }

    pub async fn post(&self, tenant: &str, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.keys[tenant])
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A batch of sessions of `tenant` playing `script`; their subs, in order.
    async fn batch(
        &self,
        c: &Cluster,
        tenant: &str,
        items: &[(Script, Option<u8>)],
        query: &str,
    ) -> Vec<Sub> {
        let mut tokens = Vec::new();
        let body: Vec<Value> = items
            .iter()
            .map(|(script, priority)| {
                let token = c.register(script.clone());
                let mut item = json!({
                    "prompt": format!("Follow the e2e script <<{token}>>."),
                    "retry_delay_ms": 50,
                });
                if let Some(p) = priority {
                    item["priority"] = json!(p);
                }
                tokens.push(token);
                item
            })
            .collect();
        let (status, answer) = self
            .post(tenant, &format!("/v1/sessions/batch{query}"), &json!(body))
            .await;
        assert_eq!(status, 201, "{answer}");
        answer["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(tokens)
            .map(|(s, token)| Sub {
                id: s["id"].as_str().unwrap().to_string(),
                token,
            })
            .collect()
    }

    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

fn one_turn() -> Script {
    Script::new(vec![Turn::text("done")])
}

/// One turn whose answer streams slowly, so that sessions are seen running.
fn slow_turn() -> Script {
    let mut s = one_turn();
    s.chunk_delay = Duration::from_millis(150);
    s
}

fn ids(subs: &[Sub]) -> Vec<String> {
    subs.iter().map(|s| s.id.clone()).collect()
}

async fn tenant_rows(c: &Cluster, tenant: &str) -> Vec<SessionRow> {
    c.store
        .list(&ListFilter {
            tenant: Some(tenant.into()),
            limit: 10_000,
            ..Default::default()
        })
        .await
        .unwrap()
}

pub fn scheduling(buffer: u32) -> SchedulingSection {
    SchedulingSection {
        buffer,
        dispatch_interval_ms: 50,
        ..SchedulingSection::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_does_not_starve_another_tenant() {
    const FLOOD: usize = 2_000;
    const FEW: usize = 10;
    let mut c = Cluster::start().await;
    let api = Api::start(&c, scheduling(16), &["flood", "few"]).await;
    // The flood first, all of it queued before the other tenant asks for anything; then
    // a few sessions of the other tenant, and only then the workers.
    let flood: Vec<(Script, Option<u8>)> = (0..FLOOD).map(|_| (one_turn(), None)).collect();
    let flood = api.batch(&c, "flood", &flood, "").await;
    let few: Vec<(Script, Option<u8>)> = (0..FEW).map(|_| (one_turn(), None)).collect();
    let few = api.batch(&c, "few", &few, "").await;
    for _ in 0..2 {
        c.spawn_worker(&WorkerOpts {
            concurrency: 8,
            ..WorkerOpts::default()
        });
    }
    let rows = c.wait_all_terminal(&ids(&few), T).await;
    let last_few = rows
        .iter()
        .map(|r| {
            assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
            r.finished_at.unwrap()
        })
        .max()
        .unwrap();
    // Finish order, not timings: how many of the flood finished before the last of the few.
    let flood_rows = tenant_rows(&c, "flood").await;
    assert_eq!(flood_rows.len(), FLOOD);
    let before = flood_rows
        .iter()
        .filter(|r| r.finished_at.is_some_and(|f| f < last_few))
        .count();
    eprintln!("{before} of {FLOOD} flood sessions finished before the last of {FEW}");
    assert!(
        before < FLOOD / 2,
        "{before} of the flood finished before the other tenant's {FEW}"
    );
    // Every one of the few was handed out among the first buffers: with equal weights,
    // the two tenants alternate while both wait.
    assert!(before <= 4 * FEW, "{before}");
    // Each ran once.
    for s in &few {
        assert_eq!(c.llm_requests_all(s), 1, "{}", s.id);
    }
    assert!(flood.len() == FLOOD);
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn priorities_order_the_backlog() {
    let mut c = Cluster::start().await;
    // A buffer of one and one worker slot: sessions leave the backlog one by one.
    let api = Api::start(&c, scheduling(1), &["p"]).await;
    let priorities: [u8; 8] = [1, 9, 5, 0, 9, 3, 7, 5];
    let items: Vec<(Script, Option<u8>)> =
        priorities.iter().map(|p| (one_turn(), Some(*p))).collect();
    let subs = api.batch(&c, "p", &items, "").await;
    c.spawn_worker(&WorkerOpts {
        concurrency: 1,
        ..WorkerOpts::default()
    });
    let mut rows = c.wait_all_terminal(&ids(&subs), T).await;
    for r in &rows {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
    }
    rows.sort_by_key(|r| r.finished_at);
    let order: Vec<u8> = rows.iter().map(|r| r.priority).collect();
    let mut sorted = order.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(order, sorted, "finished in priority order");
    // The view shows it.
    let resp = api
        .http
        .get(format!("{}/v1/sessions/{}", api.url, subs[1].id))
        .bearer_auth(&api.keys["p"])
        .send()
        .await
        .unwrap();
    let view: Value = resp.json().await.unwrap();
    assert_eq!(view["priority"], 9);
    assert!(view["batch_id"].is_string(), "{view}");
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caps_on_running_sessions_hold() {
    const TENANT_CAP: u32 = 3;
    const BATCH_CAP: usize = 2;
    let mut c = Cluster::start().await;
    let mut s = scheduling(50);
    s.tenants.insert(
        "capped".into(),
        TenantScheduling {
            weight: 1,
            max_running: Some(TENANT_CAP),
        },
    );
    let api = Api::start(&c, s, &["capped", "batched"]).await;
    let items: Vec<(Script, Option<u8>)> = (0..12).map(|_| (slow_turn(), None)).collect();
    let capped = api.batch(&c, "capped", &items, "").await;
    let batched = api
        .batch(&c, "batched", &items, &format!("?max_running={BATCH_CAP}"))
        .await;
    // Plenty of worker slots: only the caps limit what runs.
    c.spawn_worker(&WorkerOpts {
        concurrency: 32,
        ..WorkerOpts::default()
    });
    let all: Vec<String> = ids(&capped).into_iter().chain(ids(&batched)).collect();
    let (mut max_capped, mut max_batched) = (0usize, 0usize);
    // Sampled every 20 ms until all have ended: the caps hold at every sample.
    let ended = poll(Duration::from_millis(20), T, async || {
        let running = |rows: &[SessionRow]| {
            rows.iter()
                .filter(|r| r.status == SessionStatus::Running)
                .count()
        };
        let cr = tenant_rows(&c, "capped").await;
        let br = tenant_rows(&c, "batched").await;
        max_capped = max_capped.max(running(&cr));
        max_batched = max_batched.max(running(&br));
        assert!(running(&cr) <= TENANT_CAP as usize, "tenant cap: {cr:#?}");
        assert!(running(&br) <= BATCH_CAP, "batch cap: {br:#?}");
        cr.iter().chain(&br).all(|r| r.status.is_terminal())
    })
    .await;
    assert!(ended, "not all ended within {T:?}");
    eprintln!("most running: tenant {max_capped}, batch {max_batched}");
    assert!(max_capped >= 1 && max_batched >= 1);
    for r in c.wait_all_terminal(&all, T).await {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
    }
    api.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_restart_under_a_held_backlog_loses_and_repeats_nothing() {
    const N: usize = 150;
    let mut c = Cluster::start_with(ClusterOpts {
        persistent_redis: true,
        ..ClusterOpts::default()
    })
    .await;
    let api = Api::start(&c, scheduling(10), &["t"]).await;
    let items: Vec<(Script, Option<u8>)> = (0..N).map(|_| (slow_turn(), None)).collect();
    let subs = api.batch(&c, "t", &items, "").await;
    c.spawn_worker(&WorkerOpts {
        concurrency: 8,
        ..WorkerOpts::default()
    });
    let all = ids(&subs);
    eventually("some sessions finished", T, async || {
        tenant_rows(&c, "t")
            .await
            .iter()
            .filter(|r| r.status.is_terminal())
            .count()
            >= 10
    })
    .await;
    let held_before = tenant_rows(&c, "t")
        .await
        .iter()
        .filter(|r| r.status == SessionStatus::Queued)
        .count();
    assert!(held_before > 20, "the backlog drained before the restart");
    c.redis.server().kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| c.redis.server().restart()).expect("restarting redis");
    for r in c.wait_all_terminal(&all, T).await {
        assert_eq!(r.status, SessionStatus::Completed, "{r:?}");
    }
    // Nothing ran twice: one model request per session (each has one turn).
    for s in &subs {
        assert_eq!(c.llm_requests_all(s), 1, "{}", s.id);
    }
    api.stop().await;
}
