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

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Sessions run at once.
    #[arg(long, env = "AGENTQ_WORKER_CONCURRENCY", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// Queues to consume, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub queues: Vec<String>,
    /// Postgres URL.
    #[arg(long, env = "AGENTQ_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Redis URL.
    #[arg(long, env = "AGENTQ_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Seconds a lease lasts without a heartbeat.
    #[arg(long, env = "AGENTQ_LEASE_TTL_SECS", default_value_t = 6.0)]
    pub lease_ttl_secs: f64,
    #[arg(long, env = "AGENTQ_HEARTBEAT_SECS", default_value_t = 2.0)]
    pub heartbeat_secs: f64,
    /// Idle time after which another worker's entries are taken over.
    #[arg(long, env = "AGENTQ_RECLAIM_MIN_IDLE_SECS", default_value_t = 6.0)]
    pub reclaim_min_idle_secs: f64,
    #[arg(long, env = "AGENTQ_RECLAIM_INTERVAL_SECS", default_value_t = 2.0)]
    pub reclaim_interval_secs: f64,
    /// Deliveries of one session without finishing before it is dead-lettered.
    #[arg(long, env = "AGENTQ_MAX_ATTEMPTS", default_value_t = 5)]
    pub max_attempts: u32,
    /// Seconds running sessions get to reach a checkpoint on shutdown.
    #[arg(long, env = "AGENTQ_DRAIN_TIMEOUT_SECS", default_value_t = 30.0)]
    pub drain_timeout_secs: f64,
    #[arg(
        long,
        env = "AGENTQ_WORKSPACE_ROOT",
        default_value = "./agentq-workspaces"
    )]
    pub workspace_root: std::path::PathBuf,
    /// Provider for sessions that name none: openai, anthropic or scripted.
    #[arg(long, env = "AGENTQ_DEFAULT_PROVIDER", default_value = "scripted")]
    pub default_provider: String,
    #[arg(long, env = "AGENTQ_DEFAULT_MODEL")]
    pub default_model: Option<String>,
    /// JSON script for the scripted provider.
    #[arg(long, env = "AGENTQ_SCRIPT")]
    pub script: Option<std::path::PathBuf>,
    /// Let http_fetch reach these private hosts (host or host:port), comma-separated.
    #[arg(long, env = "AGENTQ_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Where `/metrics` is served (Prometheus text format).
    #[arg(long, env = "AGENTQ_METRICS_ADDR", default_value = "127.0.0.1:9464")]
    pub metrics_addr: String,
    /// Enable the shell tool.
    #[arg(long, env = "AGENTQ_SHELL_ENABLED")]
    pub enable_shell: bool,
}

fn secs(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if !(v.is_finite() && v > 0.0) {
        anyhow::bail!("--{flag}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let db = args
        .database_url
        .clone()
        .context("--database-url (or AGENTQ_DATABASE_URL) is required")?;
    let redis = args
        .redis_url
        .clone()
        .context("--redis-url (or AGENTQ_REDIS_URL) is required")?;
    let mut cfg = WorkerConfig {
        queues: args.queues.clone(),
        concurrency: args.concurrency as usize,
        lease_ttl: secs("lease-ttl-secs", args.lease_ttl_secs)?,
        heartbeat_interval: secs("heartbeat-secs", args.heartbeat_secs)?,
        reclaim_min_idle: secs("reclaim-min-idle-secs", args.reclaim_min_idle_secs)?,
        reclaim_interval: secs("reclaim-interval-secs", args.reclaim_interval_secs)?,
        max_attempts: args.max_attempts,
        drain_timeout: secs("drain-timeout-secs", args.drain_timeout_secs)?,
        workspace_root: args.workspace_root.clone(),
        default_provider: args.default_provider.clone(),
        default_model: args.default_model.clone(),
        ..WorkerConfig::default()
    };
    if let Some(path) = &args.script {
        cfg.providers.script = Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--script: cannot read {}", path.display()))?,
        );
    }
    cfg.tool_settings.allowed_hosts = args.allowed_hosts.clone();
    cfg.tool_settings.shell_enabled = args.enable_shell;
    let pool_size = (cfg.concurrency as u32 / 4).clamp(4, 64);
    let store = PgStore::connect(&db, pool_size)
        .await
        .with_context(|| format!("cannot connect to Postgres at {}", redact(&db)))?;
    let queue = RedisQueue::connect(&redis)
        .await
        .with_context(|| format!("cannot connect to Redis at {}", redact(&redis)))?;
    let worker = Worker::new(Arc::new(store), Arc::new(queue), cfg);
    let shutdown = CancellationToken::new();
    crate::signals::cancel_on_signal(shutdown.clone());
    let metrics_stop = CancellationToken::new();
    // Several workers on one host contend for the default port; a busy port costs the
    // metrics endpoint, not the worker.
    match tokio::net::TcpListener::bind(&args.metrics_addr).await {
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
        Err(e) => tracing::warn!(addr = %args.metrics_addr, error = %e, "cannot serve /metrics"),
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
