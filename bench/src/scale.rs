//! The scale part: the costs that decide how far one Postgres and one Redis carry a fleet,
//! each measured alone on this run's servers — a tenant budget's holds per second (one
//! tenant, many calls at once: every call of a tenant with a budget holds it), the WAL one
//! lease renewal writes, and the limiter's time per call under a rule with requests,
//! tokens and concurrency, on this Redis, on a cluster of one node and on a 3-master Redis
//! Cluster started for it — and the throughput workload on each layout: one Postgres or
//! two shards, one Redis or a cluster. On two cores none of these shows a gain from
//! scaling out; they show what one call costs, which is what docs/scale.md multiplies,
//! and what the routing itself costs: the layouts that keep the servers and change only
//! the routing (two shards as two databases of one Postgres, a cluster of one node) are
//! the ones that show it, since the others also split two cores among more servers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use agentq_agent::driver::{Admission, Admit, CallAsk, CallReport};
use agentq_agent::provider::HttpTimeouts;
use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::spec::SessionSpec;
use agentq_core::admission::Limiter;
use agentq_core::budget::BudgetStore;
use agentq_core::budget::{OnBudget, Period, Spend, TenantBudget, TenantHold};
use agentq_core::config::RedisSection;
use agentq_core::config::{LimitSettings, LimiterSection};
use agentq_core::pg::PgStore;
use agentq_core::{Claim, LeaseStore, NewSession, SessionStore};
use agentq_fixtures::{Durability, PostgresOptions, PostgresServer, RedisCluster, RedisServer};

use crate::env::Env;
use crate::report::{Results, RoutingFigure, ScaleFigures, ms, progress, quantile};
use crate::workload::{Routing, Workload, one_store, run_workload_on, throughput_workload};

/// Calls at once in the budget and limiter measures (as many as a worker's sessions).
const CONCURRENT: usize = 64;
/// Leases renewed, and how many times each, for the WAL figure.
const LEASES: usize = 500;
const RENEWALS: usize = 10;

pub async fn scale(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let mut f = ScaleFigures::default();
    // Each of the tasks makes as many calls, so the measured count is a multiple of them.
    let per_task = env.args.scale_calls as usize / CONCURRENT;
    let calls = per_task * CONCURRENT;
    progress(&format!(
        "scale: {calls} tenant-budget holds, {CONCURRENT} at once"
    ));
    let (per_s, p50, p99) = budget_holds(env, per_task).await?;
    f.budget_holds_per_s = per_s;
    f.budget_hold_p50_ms = p50;
    f.budget_hold_p99_ms = p99;
    progress(&format!("scale: {LEASES} leases renewed {RENEWALS} times"));
    f.heartbeat_wal_bytes_per_lease = heartbeat_wal(env).await?;
    progress(&format!(
        "scale: {calls} limiter calls, {CONCURRENT} at once, on this Redis"
    ));
    f.limiter_standalone = limiter_calls(&env.redis_url, false, per_task).await?;
    progress("scale: the same on a Redis Cluster of one node and on one of 3 masters");
    let clusters = tokio::task::spawn_blocking(|| {
        // Without an append-only file, as this run's Redis (and the layouts' below): the
        // figures compare the routing, not a disk sync per write.
        anyhow::Ok((
            RedisCluster::start_in_memory(1)?,
            RedisCluster::start_in_memory(3)?,
        ))
    })
    .await?
    .context("starting a Redis Cluster (redis-server and redis-cli on PATH)")?;
    f.limiter_one_node = limiter_calls(&clusters.0.url(), true, per_task).await?;
    f.limiter_cluster = limiter_calls(&clusters.1.url(), true, per_task).await?;
    f.routing = routing(env, &clusters).await?;
    r.scale = Some(f);
    Ok(())
}

/// The throughput workload (`--sessions` × `--iterations`, `--workers` in-process workers)
/// on each layout a deployment may choose: one Postgres or two shards, one Redis or a
/// cluster. Every layout's servers are started for it with the same settings (durable
/// Postgres), and the same servers serve every layout that names them. Two layouts keep
/// the first layout's servers and change only the routing: two shards that are two
/// databases of its Postgres, and a cluster of one node beside its Redis. Iterations/s of
/// each round (`--scale-rounds`: each round runs every layout, so that a drift of the
/// machine touches every layout alike), per layout.
async fn routing(
    env: &Env,
    (one_node, cluster): &(RedisCluster, RedisCluster),
) -> anyhow::Result<Vec<RoutingFigure>> {
    let (servers, urls, admin) = layout_servers().await?;
    let redis = &servers.2;
    let standalone = (redis.url(), RedisSection::default());
    let clustered = |c: &RedisCluster| {
        (
            c.url(),
            RedisSection {
                cluster: true,
                ..RedisSection::default()
            },
        )
    };
    let (one_node, clustered) = (clustered(one_node), clustered(cluster));
    // The shards of each layout, as indices into `urls`.
    let (one, two_servers, two_in_one): (&[usize], &[usize], &[usize]) = (&[0], &[0, 1], &[0, 2]);
    // Each layout on a queue of its own, so that nothing the layout before left behind
    // on the same Redis (its workers' consumers, their pending entries) is measured in
    // the next one's rate.
    let layouts = [
        ("1 Postgres, 1 Redis", "scale-a", one, &standalone),
        (
            "2 shards in 1 Postgres, 1 Redis",
            "scale-b",
            two_in_one,
            &standalone,
        ),
        ("1 Postgres, cluster of 1 node", "scale-c", one, &one_node),
        (
            "2 Postgres shards, 1 Redis",
            "scale-d",
            two_servers,
            &standalone,
        ),
        ("1 Postgres, 3-master cluster", "scale-e", one, &clustered),
        (
            "2 Postgres shards, 3-master cluster",
            "scale-f",
            two_servers,
            &clustered,
        ),
    ];
    let rounds = env.args.scale_rounds;
    let mut figures: Vec<RoutingFigure> = layouts
        .iter()
        .map(|(name, ..)| RoutingFigure {
            layout: name,
            iterations_per_s: Vec::with_capacity(rounds as usize),
        })
        .collect();
    for round in 0..rounds {
        for ((name, part, shards, (redis_url, redis)), figure) in layouts.iter().zip(&mut figures) {
            progress(&format!(
                "scale: round {} of {rounds}: {} × {} on {name}",
                round + 1,
                env.args.sessions,
                env.args.iterations
            ));
            let chosen: Vec<PgStore> = shards.iter().map(|&i| admin[i].clone()).collect();
            let routing = Routing {
                db_urls: shards.iter().map(|&i| urls[i].clone()).collect(),
                redis_url: redis_url.clone(),
                redis: redis.clone(),
                store: one_store(&chosen)?,
                shards: chosen,
            };
            let ran = run_workload_on(env, &routing, &routing_workload(env, part)).await?;
            if ran.failed > 0 {
                bail!(
                    "scale: {} of the sessions on {name} did not complete",
                    ran.failed
                );
            }
            // Two shards where every tree landed on one would measure one shard's routing.
            for (i, shard) in routing.shards.iter().enumerate() {
                let (n,): (i64,) =
                    sqlx::query_as("SELECT count(*) FROM sessions WHERE id = ANY($1)")
                        .bind(&ran.ids)
                        .fetch_one(shard.pool())
                        .await?;
                if n == 0 {
                    bail!("scale: on {name}, shard {i} got none of the sessions");
                }
            }
            figure
                .iterations_per_s
                .push(ran.iterations / ran.elapsed.as_secs_f64());
        }
    }
    Ok(figures)
}

/// The servers of the layouts, started alike: two durable Postgres and a Redis; and the
/// Postgres databases the layouts name, migrated: each server's, and a second on the
/// first server (`urls` and `admin` in that order).
async fn layout_servers() -> anyhow::Result<(
    (PostgresServer, PostgresServer, RedisServer),
    [String; 3],
    Vec<PgStore>,
)> {
    progress("scale: starting two durable Postgres and a Redis for the layouts");
    let servers = tokio::task::spawn_blocking(|| {
        let options = || PostgresOptions {
            durability: Durability::Durable,
            max_connections: 400,
            shared_buffers_mb: 128,
        };
        anyhow::Ok((
            PostgresServer::start_with(options())?,
            PostgresServer::start_with(options())?,
            RedisServer::start()?,
        ))
    })
    .await??;
    let (pg_a, pg_b, _) = &servers;
    let beside = pg_a
        .create_database("second_shard")
        .context("creating a second database on a layout's Postgres")?;
    let urls = [
        pg_a.database_url("postgres"),
        pg_b.database_url("postgres"),
        beside,
    ];
    let mut admin = Vec::with_capacity(urls.len());
    for url in &urls {
        let store = PgStore::connect(url, 4)
            .await
            .context("connecting to a layout's Postgres")?;
        store
            .migrate()
            .await
            .context("migrating a layout's Postgres")?;
        admin.push(store);
    }
    Ok((servers, urls, admin))
}

/// The throughput workload under one of the scale part's names (its own queue).
fn routing_workload(env: &Env, part: &'static str) -> Workload {
    Workload {
        part,
        ..throughput_workload(env, env.tool())
    }
}

/// One tenant's calls, each a hold then its settlement, [`CONCURRENT`] tasks of
/// `per_task` calls under a
/// budget they never reach: holds/s over the run, and each hold's p50/p99.
async fn budget_holds(env: &Env, per_task: usize) -> anyhow::Result<(f64, f64, f64)> {
    let store = Arc::new(
        PgStore::connect(&env.db_url, CONCURRENT as u32)
            .await
            .context("connecting for the budget holds")?,
    );
    let tenant = format!("bench-{}-tenant", env.run);
    let budgets = Arc::new(vec![TenantBudget {
        tenant: tenant.clone(),
        period: Period::Month,
        tokens: Some(i64::MAX as u64 / 2),
        usd_nanos: None,
        on_budget: OnBudget::Fail,
    }]);
    let day = agentq_core::budget::day_key(chrono::Utc::now().date_naive());
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(CONCURRENT);
    for _ in 0..CONCURRENT {
        let (store, budgets, tenant, day) =
            (store.clone(), budgets.clone(), tenant.clone(), day.clone());
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let hold = TenantHold {
                    id: uuid::Uuid::now_v7().to_string(),
                    tenant: tenant.clone(),
                    worst: Spend {
                        tokens: 4_000,
                        cost_nanos: 0,
                    },
                    ttl: Duration::from_secs(600),
                };
                let t = Instant::now();
                if let Some(refused) = store
                    .hold_tenant_spend(&hold, &budgets, chrono::Utc::now())
                    .await?
                {
                    bail!("scale: a hold was refused: {}", refused.message);
                }
                times.push(t.elapsed());
                let spent = Spend {
                    tokens: 1_000,
                    cost_nanos: 0,
                };
                store
                    .settle_tenant_hold(&hold.id, &tenant, &day, spent)
                    .await?;
            }
            Ok(times)
        }));
    }
    let mut times = Vec::with_capacity(per_task * CONCURRENT);
    for t in tasks {
        times.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    times.sort();
    let q = |x: f64| quantile(&times, x).map_or(0.0, ms);
    Ok((times.len() as f64 / elapsed, q(0.5), q(0.99)))
}

/// WAL bytes per renewed lease: [`LEASES`] sessions claimed, then renewed together
/// [`RENEWALS`] times, as a worker's heartbeat does.
async fn heartbeat_wal(env: &Env) -> anyhow::Result<f64> {
    let store = &env.store;
    let queue = env.queue("scale");
    let owner = format!("bench-{}-beats", env.run);
    let new: Vec<NewSession> = (0..LEASES)
        .map(|_| NewSession::root(SessionSpec::new("bench"), queue.clone()))
        .collect();
    let mut leases = Vec::with_capacity(LEASES);
    for (row, _) in store.create_sessions(&new).await? {
        match store
            .claim(&row.id, &owner, Duration::from_secs(600), 10)
            .await?
        {
            Claim::Acquired { lease, .. } => leases.push(lease),
            other => bail!("scale: cannot claim {}: {other:?}", row.id),
        }
    }
    let before: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(store.pool())
        .await?;
    for _ in 0..RENEWALS {
        store
            .heartbeat(&owner, &leases, Duration::from_secs(600))
            .await?;
    }
    let bytes: f64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(&before)
            .fetch_one(store.pool())
            .await?;
    Ok(bytes / (LEASES * RENEWALS) as f64)
}

/// The limiter's calls per second and each reservation's p50 (ms), [`CONCURRENT`] at once
/// under a rule of requests, tokens and concurrency that none of them reaches.
async fn limiter_calls(url: &str, cluster: bool, per_task: usize) -> anyhow::Result<(f64, f64)> {
    let rule: LimitSettings = serde_json::from_value(json!({
        "provider": "openai",
        "rpm": 1_000_000_000u64,
        "tpm": 1_000_000_000_000u64,
        "concurrency": 100_000u64,
    }))?;
    let cancel = CancellationToken::new();
    let limiter = Limiter::connect_with(
        url,
        cluster,
        &LimiterSection::default(),
        &[rule],
        cancel.clone(),
    )
    .await
    .with_context(|| format!("connecting the limiter to {url}"))?;
    let provider = OpenAiProvider::new(OpenAiConfig {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: Some("bench-key".into()),
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    })?;
    let gate = limiter.for_session("bench", &provider);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(CONCURRENT);
    for _ in 0..CONCURRENT {
        let gate = gate.clone();
        tasks.push(tokio::spawn(
            async move { calls(gate.as_ref(), per_task).await },
        ));
    }
    let mut times = Vec::with_capacity(per_task * CONCURRENT);
    for t in tasks {
        times.extend(t.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    cancel.cancel();
    times.sort();
    Ok((
        times.len() as f64 / elapsed,
        quantile(&times, 0.5).map_or(0.0, ms),
    ))
}

async fn calls(gate: &dyn Admission, per_task: usize) -> anyhow::Result<Vec<Duration>> {
    let ask = CallAsk {
        model: "gpt-4o",
        input_tokens: 1_000,
        max_output_tokens: 500,
        web_searches: 0,
        max_wait: Duration::ZERO,
    };
    let mut times = Vec::with_capacity(per_task);
    for _ in 0..per_task {
        let t = Instant::now();
        let permit = match gate.reserve(&ask).await {
            Admit::Go(p) => p,
            other => bail!("scale: a limiter call under a rule it cannot reach: {other:?}"),
        };
        times.push(t.elapsed());
        gate.settle(&ask, permit, &CallReport::default()).await;
    }
    Ok(times)
}
