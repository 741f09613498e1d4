//! `agentq worker`: one worker process on Postgres and Redis, until SIGTERM/SIGINT.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_worker::{Worker, WorkerConfig};

/// Every flag overrides `agentq.toml`'s `[worker]` section (and its environment variable).
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Sessions run at once (default 256).
    #[arg(long, env = "AGENTQ_WORKER_CONCURRENCY", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: Option<u32>,
    /// Queues to consume, comma-separated (default: default).
    #[arg(long, value_delimiter = ',')]
    pub queues: Option<Vec<String>>,
    /// Postgres URL.
    #[arg(long, env = "AGENTQ_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Redis URL.
    #[arg(long, env = "AGENTQ_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Seconds a lease lasts without a heartbeat (default 6).
    #[arg(long, env = "AGENTQ_LEASE_TTL_SECS")]
    pub lease_ttl_secs: Option<f64>,
    /// Seconds between heartbeats (default 2).
    #[arg(long, env = "AGENTQ_HEARTBEAT_SECS")]
    pub heartbeat_secs: Option<f64>,
    /// Idle time after which another worker's entries are taken over (default 6).
    #[arg(long, env = "AGENTQ_RECLAIM_MIN_IDLE_SECS")]
    pub reclaim_min_idle_secs: Option<f64>,
    /// Seconds between looks for entries of dead workers (default 2).
    #[arg(long, env = "AGENTQ_RECLAIM_INTERVAL_SECS")]
    pub reclaim_interval_secs: Option<f64>,
    /// Deliveries of one session without finishing before it is dead-lettered (default 5).
    #[arg(long, env = "AGENTQ_MAX_ATTEMPTS")]
    pub max_attempts: Option<u32>,
    /// Seconds running sessions get to reach a checkpoint on shutdown (default 30).
    #[arg(long, env = "AGENTQ_DRAIN_TIMEOUT_SECS")]
    pub drain_timeout_secs: Option<f64>,
    /// Group commit: most checkpoints committed together (default 256).
    #[arg(long, env = "AGENTQ_CHECKPOINT_BATCH_MAX", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub checkpoint_batch_max: Option<u32>,
    /// Group commit: commits in flight at once, each on its own connection (default 2).
    #[arg(long, env = "AGENTQ_CHECKPOINT_WRITERS", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub checkpoint_writers: Option<u32>,
    /// Milliseconds the checkpoint of a response whose tool calls have no effect anywhere
    /// (read-only tools, no hook, no approval) may wait to share one commit with their
    /// results; 0 commits every response before its calls start (default 250).
    #[arg(long, env = "AGENTQ_WRITE_AHEAD_GRACE_MS", value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub write_ahead_grace_ms: Option<u64>,
    /// Per-tree workspaces live under here (default ./agentq-workspaces).
    #[arg(long, env = "AGENTQ_WORKSPACE_ROOT")]
    pub workspace_root: Option<std::path::PathBuf>,
    /// Provider for sessions that name none: openai, anthropic or scripted.
    #[arg(long, env = "AGENTQ_DEFAULT_PROVIDER")]
    pub default_provider: Option<String>,
    #[arg(long, env = "AGENTQ_DEFAULT_MODEL")]
    pub default_model: Option<String>,
    /// JSON script for the scripted provider.
    #[arg(long, env = "AGENTQ_SCRIPT")]
    pub script: Option<std::path::PathBuf>,
    /// Let http_fetch reach these private hosts (host or host:port), comma-separated.
    #[arg(long, env = "AGENTQ_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,
    /// Where `/metrics` is served (Prometheus text format; default 127.0.0.1:9464).
    #[arg(long, env = "AGENTQ_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// Enable the shell tool.
    #[arg(long, env = "AGENTQ_SHELL_ENABLED")]
    pub enable_shell: bool,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

fn secs(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        anyhow::bail!("--{flag}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let file = agentq_core::config::Config::load(args.config.as_deref())?;
    let db = args
        .database_url
        .clone()
        .or_else(|| file.database_url.clone())
        .context("--database-url (or AGENTQ_DATABASE_URL) is required")?;
    let redis = args
        .redis_url
        .clone()
        .or_else(|| file.redis_url.clone())
        .context("--redis-url (or AGENTQ_REDIS_URL) is required")?;
    let mut cfg: WorkerConfig = crate::dev::worker_config(&file);
    if let Some(n) = args.concurrency {
        cfg.concurrency = n as usize;
    }
    if let Some(q) = &args.queues {
        cfg.queues = q.clone();
    }
    if let Some(v) = args.lease_ttl_secs {
        cfg.lease_ttl = secs("lease-ttl-secs", v)?;
    }
    if let Some(v) = args.heartbeat_secs {
        cfg.heartbeat_interval = secs("heartbeat-secs", v)?;
    }
    if let Some(v) = args.reclaim_min_idle_secs {
        cfg.reclaim_min_idle = secs("reclaim-min-idle-secs", v)?;
    }
    if let Some(v) = args.reclaim_interval_secs {
        cfg.reclaim_interval = secs("reclaim-interval-secs", v)?;
    }
    if let Some(v) = args.max_attempts {
        cfg.max_attempts = v.max(1);
    }
    if let Some(v) = args.drain_timeout_secs {
        cfg.drain_timeout = secs("drain-timeout-secs", v)?;
    }
    if let Some(v) = args.checkpoint_batch_max {
        cfg.checkpoint_batch_max = v as usize;
    }
    if let Some(v) = args.checkpoint_writers {
        cfg.checkpoint_writers = v as usize;
    }
    if let Some(v) = args.write_ahead_grace_ms {
        cfg.write_ahead_grace = Duration::from_millis(v);
    }
    if let Some(v) = &args.workspace_root {
        cfg.workspace_root = v.clone();
    }
    if let Some(v) = &args.default_provider {
        cfg.default_provider = v.clone();
    }
    if args.default_model.is_some() {
        cfg.default_model = args.default_model.clone();
    }
    if let Some(path) = &args.script {
        cfg.providers.script = Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--script: cannot read {}", path.display()))?,
        );
    }
    if let Some(h) = &args.allowed_hosts {
        cfg.tool_settings.allowed_hosts = h.clone();
    }
    if args.enable_shell {
        cfg.tool_settings.shell_enabled = true;
    }
    if cfg.heartbeat_interval >= cfg.lease_ttl {
        anyhow::bail!(
            "--heartbeat-secs: must be shorter than the lease TTL, or leases expire between heartbeats"
        );
    }
    let metrics_addr = args
        .metrics_addr
        .clone()
        .unwrap_or_else(|| file.metrics_addr.clone());
    let store = PgStore::connect_for_worker(&db, cfg.pool_connections(), cfg.writer_connections())
        .await
        .with_context(|| format!("cannot connect to Postgres at {}", redact(&db)))?;
    // Backends started under the first burst of sessions cost that burst about a third of
    // its rate. A schema that is not there yet is `Worker::run`'s to report.
    if agentq_core::Store::check_schema(&store).await.is_ok()
        && let Err(e) = store.open_all().await
    {
        tracing::warn!(error = %e, "could not open the whole Postgres pool up front; it opens as sessions need it");
    }
    let queue = RedisQueue::connect(&redis)
        .await
        .with_context(|| format!("cannot connect to Redis at {}", redact(&redis)))?;
    let worker = Worker::new(Arc::new(store), Arc::new(queue), cfg);
    let shutdown = CancellationToken::new();
    crate::signals::cancel_on_signal(shutdown.clone());
    let metrics_stop = CancellationToken::new();
    // Several workers on one host contend for the default port; a busy port costs the
    // metrics endpoint, not the worker.
    match tokio::net::TcpListener::bind(&metrics_addr).await {
        Ok(listener) => {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving /metrics");
            }
            tokio::spawn(agentq_core::metrics::serve_metrics(
                listener,
                Arc::new(|| agentq_core::metrics::global().render()),
                metrics_stop.clone(),
            ));
        }
        Err(e) => tracing::warn!(addr = %metrics_addr, error = %e, "cannot serve /metrics"),
    }
    worker.run(shutdown).await?;
    metrics_stop.cancel();
    Ok(ExitCode::SUCCESS)
}

/// Hide the password of a URL in messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}
