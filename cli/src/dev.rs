//! `agentq dev`: the scheduler API and a few workers in one process, on the embedded
//! default (one SQLite file and the in-process queue) or, when `AGENTQ_DATABASE_URL` and
//! `AGENTQ_REDIS_URL` are set, on Postgres and Redis.
//!
//! This module also owns what `agentq dev` and `agentq demo` share: opening the backend
//! ([`Stack`]) — including the recovery step of the embedded mode, which puts every
//! session that was queued or running when the previous process died back on the queue —
//! and turning the file/environment configuration into a worker's configuration
//! ([`worker_config`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;

use agentq_core::WorkQueue;
use agentq_core::config::Config;
use agentq_core::mem_queue::MemQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::sqlite::{SqliteStore, requeue_runnable};
use agentq_core::{Queue, Store};
use agentq_scheduler::SchedulerSettings;
use agentq_worker::{Worker, WorkerConfig};

/// Connections of the Postgres pool shared by the API and the workers of one process.
const DEV_PG_CONNS: u32 = 16;
/// Past the workers' drain timeout, what the rest of a shutdown (scheduler, background
/// tasks, aborting sessions that did not reach a checkpoint) may take before `dev` exits
/// anyway.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(15);

#[derive(Args, Debug)]
pub struct DevArgs {
    /// The embedded database file (ignored when AGENTQ_DATABASE_URL and AGENTQ_REDIS_URL
    /// are set).
    #[arg(long, env = "AGENTQ_DB", default_value = "./agentq.db")]
    pub db: PathBuf,
    /// Listen address of the HTTP API (default: AGENTQ_API_ADDR, `api_addr` of
    /// agentq.toml, 127.0.0.1:7700).
    #[arg(long)]
    pub addr: Option<String>,
    /// In-process workers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Sessions each worker runs at once (default: `[worker] concurrency` of agentq.toml).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: Option<u32>,
    /// JSON script for the scripted provider (default: its built-in demo script).
    #[arg(long, env = "AGENTQ_SCRIPT")]
    pub script: Option<PathBuf>,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

/// A store and a queue, opened and ready for workers.
pub struct Stack {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    /// Set in the embedded mode (the demo reads its file directly).
    pub sqlite: Option<SqliteStore>,
    /// Set in the embedded mode (the demo follows completions on it).
    pub mem_queue: Option<Arc<MemQueue>>,
    /// One line for the user: where the data lives.
    pub description: String,
    /// Sessions put back on the queue at start (embedded mode: left over by a previous
    /// process that was killed).
    pub requeued: usize,
}

impl Stack {
    /// The embedded backend: the SQLite file at `path` (created and migrated as needed)
    /// and a fresh in-process queue with a group for each of `queues`. With `recover`,
    /// every session still queued or running in the file goes back on the queue — the
    /// queue lived in the memory of the process that wrote them.
    pub async fn embedded(path: &Path, queues: &[String], recover: bool) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let store = SqliteStore::open(path)
            .await
            .with_context(|| format!("cannot open the database {}", path.display()))?;
        store
            .migrate()
            .await
            .with_context(|| format!("cannot migrate the database {}", path.display()))?;
        let queue = Arc::new(MemQueue::new());
        for q in queues {
            queue.ensure_queue(q).await?;
        }
        let requeued = if recover {
            requeue_runnable(&store, queue.as_ref())
                .await
                .context("cannot re-enqueue the sessions of a previous run")?
        } else {
            0
        };
        Ok(Stack {
            store: Arc::new(store.clone()),
            queue: queue.clone(),
            sqlite: Some(store),
            mem_queue: Some(queue),
            description: format!("embedded store {}, in-process queue", path.display()),
            requeued,
        })
    }

    /// Postgres and Redis. The schema is brought up to date (this is a development
    /// command; the distributed deployment runs `agentq migrate` explicitly).
    /// `writers`: the worker's commits in flight, plus one for its heartbeat.
    pub async fn services(
        database_url: &str,
        redis_url: &str,
        writers: u32,
    ) -> anyhow::Result<Self> {
        let store = PgStore::connect_with_writers(database_url, DEV_PG_CONNS, writers)
            .await
            .with_context(|| {
                format!(
                    "cannot connect to Postgres at {}",
                    crate::worker_cmd::redact(database_url)
                )
            })?;
        store.migrate().await.context("migration failed")?;
        let queue = RedisQueue::connect(redis_url).await.with_context(|| {
            format!(
                "cannot connect to Redis at {}",
                crate::worker_cmd::redact(redis_url)
            )
        })?;
        Ok(Stack {
            store: Arc::new(store),
            queue: Arc::new(queue),
            sqlite: None,
            mem_queue: None,
            description: format!(
                "Postgres {}, Redis {}",
                crate::worker_cmd::redact(database_url),
                crate::worker_cmd::redact(redis_url)
            ),
            requeued: 0,
        })
    }
}

/// A worker's configuration from the file/environment configuration: queues, limits,
/// timings, tools and providers. The consumer name is fresh (unique per call).
pub fn worker_config(cfg: &Config) -> WorkerConfig {
    let w = &cfg.worker;
    let secs = |s: u64| Duration::from_secs(s.max(1));
    let mut out = WorkerConfig {
        queues: w.queues.clone(),
        concurrency: w.concurrency.max(1),
        lease_ttl: secs(w.lease_ttl_secs),
        heartbeat_interval: secs(w.heartbeat_secs),
        reclaim_min_idle: secs(w.reclaim_min_idle_secs),
        reclaim_interval: secs(w.reclaim_interval_secs),
        max_attempts: w.max_attempts.max(1),
        drain_timeout: secs(w.drain_timeout_secs),
        workspace_root: w.workspace_root.clone(),
        default_provider: w.default_provider.clone(),
        default_model: w.default_model.clone(),
        providers: cfg.provider_settings(),
        sensitive_tools: w.sensitive_tools.clone(),
        checkpoint_batch_max: w.checkpoint_batch_max.max(1),
        checkpoint_writers: w.checkpoint_writers.max(1),
        write_ahead_grace: Duration::from_millis(w.write_ahead_grace_ms),
        ..WorkerConfig::default()
    };
    if let Some(tools) = &w.default_tools {
        out.default_tools = tools.clone();
    }
    out.tool_settings.shell_enabled = w.shell_enabled;
    out.tool_settings.allow_private_network = w.allow_private_network;
    out.tool_settings.allowed_hosts = w.allowed_hosts.clone();
    out
}

/// `agentq dev`: serve the API and run the workers until SIGTERM/SIGINT, then drain.
pub async fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(args.config.as_deref())?;
    let addr = args.addr.clone().unwrap_or_else(|| cfg.api_addr.clone());
    let mut wcfg = worker_config(&cfg);
    if let Some(c) = args.concurrency {
        wcfg.concurrency = c as usize;
    }
    if let Some(path) = &args.script {
        wcfg.providers.script = Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--script: cannot read {}", path.display()))?,
        );
    }
    let mut queues = cfg.scheduler.queues.clone();
    for q in &wcfg.queues {
        if !queues.contains(q) {
            queues.push(q.clone());
        }
    }
    let stack = match (cfg.database_url.as_deref(), cfg.redis_url.as_deref()) {
        (Some(db), Some(redis)) => Stack::services(db, redis, wcfg.writer_connections()).await?,
        (None, None) => Stack::embedded(&args.db, &queues, true).await?,
        (Some(_), None) => bail!(
            "AGENTQ_DATABASE_URL is set but AGENTQ_REDIS_URL is not: set both (Postgres and \
             Redis) or neither (the embedded store)"
        ),
        (None, Some(_)) => bail!(
            "AGENTQ_REDIS_URL is set but AGENTQ_DATABASE_URL is not: set both (Postgres and \
             Redis) or neither (the embedded store)"
        ),
    };
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().map_or(addr, |a| a.to_string());

    let shutdown = CancellationToken::new();
    crate::signals::cancel_on_signal(shutdown.clone());

    let drain_timeout = wcfg.drain_timeout;
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let mut c = wcfg.clone();
        c.consumer = format!("{}-dev{i}", agentq_worker::default_consumer_name());
        let worker = Worker::new(stack.store.clone(), stack.queue.clone(), c);
        let token = shutdown.clone();
        workers.push(tokio::spawn(async move { worker.run(token).await }));
    }
    let scheduler = tokio::spawn(agentq_scheduler::run(
        stack.store.clone(),
        stack.queue.clone(),
        SchedulerSettings::from(&cfg.scheduler),
        listener,
        shutdown.clone(),
    ));
    eprintln!("agentq dev: {}", stack.description);
    if stack.requeued > 0 {
        eprintln!(
            "agentq dev: {} session(s) of a previous run back on the queue (running ones resume \
             once their old lease expires)",
            stack.requeued
        );
    }
    eprintln!(
        "agentq dev: {} worker(s) × {} sessions; listening on http://{local}",
        args.workers, wcfg.concurrency
    );

    // Runs until a signal — or until a component stops on its own, which is an error.
    let mut failure: Option<anyhow::Error> = None;
    let mut scheduler = Some(scheduler);
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {}
        r = async { match scheduler.as_mut() { Some(s) => s.await, None => std::future::pending().await } } => {
            scheduler = None;
            // The server also ends by itself once a signal cancelled the token.
            if !shutdown.is_cancelled() {
                failure = Some(match r {
                    Ok(Ok(())) => anyhow!("the HTTP server stopped"),
                    Ok(Err(e)) => anyhow!(e),
                    Err(e) => anyhow!("the HTTP server task failed: {e}"),
                });
                shutdown.cancel();
            }
        }
    }
    eprintln!("agentq dev: shutting down (running sessions stop at their next checkpoint)");
    let finish = async {
        for w in workers {
            match w.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("agentq dev: worker: {e}"),
                Err(e) => eprintln!("agentq dev: worker task failed: {e}"),
            }
        }
        if let Some(s) = scheduler {
            match s.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("agentq dev: scheduler: {e}"),
                Err(e) => eprintln!("agentq dev: scheduler task failed: {e}"),
            }
        }
    };
    if tokio::time::timeout(drain_timeout + SHUTDOWN_SLACK, finish)
        .await
        .is_err()
    {
        eprintln!("agentq dev: shutdown took too long; exiting anyway");
    }
    if let Some(sqlite) = &stack.sqlite
        && tokio::time::timeout(Duration::from_secs(5), sqlite.close())
            .await
            .is_err()
    {
        eprintln!("agentq dev: the database did not close in time");
    }
    if let Some(e) = failure {
        return Err(e);
    }
    eprintln!("agentq dev: stopped");
    Ok(ExitCode::SUCCESS)
}
