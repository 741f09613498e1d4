//! `agentq scheduler` and `agentq migrate`: the server side of the HTTP API. Wiring only —
//! configuration, connections, schema check, signals; the scheduler itself is
//! `agentq_scheduler::run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use clap::Args;
use tokio_util::sync::CancellationToken;

use agentq_core::config::Settings;
use agentq_core::pg::{MIGRATOR, PgStore};
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{Error, Store};
use agentq_scheduler::SchedulerSettings;

use crate::process::{Start, Stop, stopped};
use crate::stack::connect_error;

/// Connections of the scheduler's pool: the API's queries are short.
const SCHEDULER_PG_CONNS: u32 = 16;

#[derive(Args, Debug)]
pub struct SchedulerArgs {
    /// Listen address (default: AGENTQ_API_ADDR, `api_addr` of agentq.toml, 127.0.0.1:7700).
    #[arg(long)]
    pub addr: Option<String>,
    /// Where `/metrics` is served, apart from the API (Prometheus text format;
    /// AGENTQ_METRICS_ADDR; default 127.0.0.1:9464). A port already in use is refused.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The shortest admin key accepted: it opens every tenant, so it must not be guessable.
pub const MIN_ADMIN_KEY_BYTES: usize = 32;

/// The operator's key (`AGENTQ_ADMIN_KEY`): every scope, every tenant. Unset or blank:
/// none (keys come from `agentq keys create` only). A key shorter than
/// [`MIN_ADMIN_KEY_BYTES`] is refused.
pub fn admin_key_from_env() -> anyhow::Result<Option<String>> {
    let Some(key) = std::env::var("AGENTQ_ADMIN_KEY")
        .ok()
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
    else {
        return Ok(None);
    };
    if key.len() < MIN_ADMIN_KEY_BYTES {
        anyhow::bail!(
            "AGENTQ_ADMIN_KEY is {} bytes long; an admin key opens every tenant and must be at \
             least {MIN_ADMIN_KEY_BYTES} (make one with `openssl rand -hex 32`)",
            key.len()
        );
    }
    Ok(Some(key))
}

#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

fn database_url(cfg: &Settings) -> anyhow::Result<&str> {
    cfg.database_url.as_deref().ok_or_else(|| {
        anyhow!("no database configured: set AGENTQ_DATABASE_URL (or database_url in agentq.toml)")
    })
}

/// `agentq migrate`: bring the Postgres schema up to this binary's version, on every
/// shard when `database_url` names several.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let cfg = Settings::resolve(args.config.as_deref(), |k| std::env::var(k).ok(), |_| {})?;
    database_url(&cfg)?;
    let urls = cfg.database_urls();
    let shards =
        crate::stack::open_shards(
            &urls,
            None,
            |u| async move { PgStore::connect(&u, 2).await },
        )
        .await?;
    let many = shards.len() > 1;
    for (i, store) in shards.iter().enumerate() {
        if many {
            println!("shard {i}:");
        }
        migrate_one(store).await?;
    }
    let recorded = agentq_core::pg::record_shard_map(&shards)
        .await
        .context("cannot record the shard map on the first database_url")?;
    if many {
        print_shard_map(&recorded);
    }
    Ok(ExitCode::SUCCESS)
}

/// The shard map as `agentq migrate` left it, each generation on a line.
fn print_shard_map(recorded: &agentq_core::pg::MapRecorded) {
    let generations = recorded.map.generations();
    for (g, generation) in generations.iter().enumerate() {
        let added = recorded.added.iter().any(|a| usize::from(*a) == g);
        println!(
            "shard map generation {g}: new trees over {} shard{}{}",
            generation.shards,
            if generation.shards == 1 { "" } else { "s" },
            if added { " (added now)" } else { "" }
        );
    }
}

async fn migrate_one(store: &PgStore) -> anyhow::Result<()> {
    let latest = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    let current = match store.check_schema().await {
        Ok(()) => {
            println!("database schema is up to date (version {latest})");
            return Ok(());
        }
        Err(Error::SchemaBehind { current, .. }) => current,
        Err(e) => return Err(anyhow!(e).context("cannot read the schema version")),
    };
    store.migrate().await.context("migration failed")?;
    for m in MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .filter(|m| current.is_none_or(|c| m.version > c))
    {
        println!("applied {} {}", m.version, m.description);
    }
    match current {
        Some(c) => println!("database schema migrated from version {c} to {latest}"),
        None => println!("database schema created (version {latest})"),
    }
    Ok(())
}

/// `agentq scheduler`: serve the HTTP API and sweep until SIGTERM/SIGINT.
pub async fn scheduler(args: SchedulerArgs) -> anyhow::Result<ExitCode> {
    let cfg = Settings::resolve(
        args.config.as_deref(),
        |k| std::env::var(k).ok(),
        |s| {
            if let Some(addr) = &args.addr {
                s.api_addr = addr.clone();
            }
            if let Some(addr) = &args.metrics_addr {
                s.metrics_addr = addr.clone();
            }
        },
    )?;
    let addr = cfg.api_addr.clone();
    // Before anything is bound or connected: a bad key is the operator's to fix first.
    let admin_key = admin_key_from_env()?;
    // First, so a port already taken is refused before anything connects.
    let (metrics, metrics_at) = crate::process::bind_metrics(&cfg.metrics_addr).await?;
    eprintln!("agentq scheduler: /metrics on http://{metrics_at}");
    let redis_url = cfg.redis_url.as_deref().ok_or_else(|| {
        anyhow!("no Redis configured: set AGENTQ_REDIS_URL (or redis_url in agentq.toml)")
    })?;
    let objects = agentq_core::blob::s3::from_workspace(&cfg.workspace)?;
    database_url(&cfg)?;
    let shards = crate::stack::open_shards(&cfg.database_urls(), objects, |u| async move {
        PgStore::connect(&u, SCHEDULER_PG_CONNS).await
    })
    .await?;
    let store = crate::stack::one_store(shards).await?;
    match store.check_schema().await {
        Ok(()) => {}
        Err(e @ Error::SchemaBehind { .. }) => return Err(anyhow!(e)),
        Err(e) => return Err(anyhow!(e).context("cannot check the database schema")),
    }
    let queue = RedisQueue::connect_with(redis_url, &cfg.redis)
        .await
        .map_err(|e| connect_error(e, "Redis", redis_url))?;
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().map_or(addr, |a| a.to_string());

    let mut settings = SchedulerSettings::from_settings(&cfg)?;
    match admin_key {
        Some(key) => settings.auth = settings.auth.with_admin_key(&key),
        None => eprintln!(
            "agentq scheduler: AGENTQ_ADMIN_KEY is not set; only keys from `agentq keys create` \
             are accepted"
        ),
    }
    let shutdown = CancellationToken::new();
    crate::signals::cancel_on_signal(shutdown.clone());
    eprintln!("agentq scheduler: listening on http://{local}");
    Start {
        command: "scheduler",
        id: agentq_worker::default_consumer_name(),
        queues: settings.queues.clone(),
        concurrency: "-".into(),
        provider: "-".into(),
        model: "-".into(),
        key_set: false,
        store: String::new(),
        queue: String::new(),
        api: local,
        metrics: metrics_at.to_string(),
    }
    .services(database_url(&cfg)?, redis_url)
    .log();
    let result = agentq_scheduler::run(
        store,
        Arc::new(queue),
        settings,
        listener,
        Some(metrics),
        shutdown,
    )
    .await;
    if let Err(e) = result {
        let e = anyhow!(e);
        stopped("scheduler", Stop::Failed(&e));
        return Err(e);
    }
    stopped("scheduler", Stop::Drained { finished: true });
    eprintln!("agentq scheduler: stopped");
    Ok(ExitCode::SUCCESS)
}
