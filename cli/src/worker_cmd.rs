//! `agentq worker`: one worker process on Postgres and Redis, until SIGTERM/SIGINT.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

use agentq_core::config::Settings;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_worker::{Worker, WorkerSettings};

use crate::flags::WorkerFlags;
use crate::process::{Start, Stop, stopped};
use crate::stack::{connect_error, redact};

/// Every flag overrides its setting in `agentq.toml` and its environment variable.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// Postgres URL (AGENTQ_DATABASE_URL).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Redis URL (AGENTQ_REDIS_URL).
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Where `/metrics` is served (Prometheus text format; AGENTQ_METRICS_ADDR; default
    /// 127.0.0.1:9464). A port already in use is refused: give each worker on a host its
    /// own, or 127.0.0.1:0 for any free one.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

impl WorkerArgs {
    fn apply(&self, s: &mut Settings) {
        self.worker.apply(s);
        if let Some(v) = &self.database_url {
            s.database_url = Some(v.clone());
        }
        if let Some(v) = &self.redis_url {
            s.redis_url = Some(v.clone());
        }
        if let Some(v) = &self.metrics_addr {
            s.metrics_addr = v.clone();
        }
    }
}

/// The worker's settings (file, environment `env`, then the flags; validated), its
/// configuration, and the Postgres and Redis URLs it needs.
fn worker_config(
    args: &WorkerArgs,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<(Settings, WorkerSettings, String, String)> {
    let settings = Settings::resolve(args.config.as_deref(), env, |s| args.apply(s))?;
    let db = settings
        .database_url
        .clone()
        .context("--database-url (or AGENTQ_DATABASE_URL) is required")?;
    let redis = settings
        .redis_url
        .clone()
        .context("--redis-url (or AGENTQ_REDIS_URL) is required")?;
    let cfg = WorkerSettings::from_settings(&settings)?;
    Ok((settings, cfg, db, redis))
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let (settings, cfg, db, redis) = worker_config(&args, |k| std::env::var(k).ok())?;
    crate::process::warn_without_model("worker", &cfg);
    // First, so a second worker on a host refuses before it touches anything.
    let (metrics_listener, metrics_at) =
        crate::process::bind_metrics(&settings.metrics_addr).await?;
    let objects = agentq_core::blob::s3::from_workspace(&settings.workspace)?;
    let urls = settings.database_urls();
    let (conns, writers) = (cfg.pool_connections(), cfg.writer_connections());
    let shards = crate::stack::open_shards(&urls, objects, |u| async move {
        PgStore::connect_for_worker(&u, conns, writers).await
    })
    .await?;
    // Backends started under the first burst of sessions cost that burst about a third of
    // its rate. A schema that is not there yet is `Worker::run`'s to report.
    for shard in &shards {
        if agentq_core::Store::check_schema(shard).await.is_ok()
            && let Err(e) = shard.open_all().await
        {
            tracing::warn!(error = %e, "could not open the whole Postgres pool up front; it opens as sessions need it");
        }
    }
    let store = crate::stack::one_store(shards).await?;
    let queue = RedisQueue::connect_with(&redis, &settings.redis)
        .await
        .map_err(|e| connect_error(e, "Redis", &redis))?;
    let shutdown = CancellationToken::new();
    let mut cfg = cfg;
    cfg.limiter = agentq_core::admission::Limiter::connect_with(
        &redis,
        settings.redis.cluster,
        &settings.limiter,
        &settings.limits,
        shutdown.clone(),
    )
    .await
    .with_context(|| {
        format!(
            "cannot connect the rate limiter to Redis at {}",
            redact(&redis)
        )
    })?;
    let start = Start::for_workers("worker", cfg.consumer.clone(), &cfg).services(&db, &redis);
    let worker = Worker::new(store, Arc::new(queue), cfg);
    crate::signals::cancel_on_signal(shutdown.clone());
    let metrics_stop = CancellationToken::new();
    tracing::info!(addr = %metrics_at, "serving /metrics");
    tokio::spawn(agentq_core::metrics::serve_metrics(
        metrics_listener,
        Arc::new(|| agentq_core::metrics::global().render()),
        metrics_stop.clone(),
    ));
    Start {
        metrics: metrics_at.to_string(),
        ..start
    }
    .log();
    let result = worker.run(shutdown).await;
    metrics_stop.cancel();
    match result {
        Ok(drain) => {
            stopped(
                "worker",
                Stop::Drained {
                    finished: drain == agentq_worker::Drain::Finished,
                },
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let e = anyhow::Error::from(e);
            stopped("worker", Stop::Failed(&e));
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    fn parse(argv: &[&str]) -> WorkerArgs {
        Cli::try_parse_from(std::iter::once("worker").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    /// Flags beat the environment, which beats the defaults; the URLs are required.
    #[test]
    fn flags_over_environment() {
        let env = |k: &str| match k {
            "AGENTQ_DATABASE_URL" => Some("postgres://env/db".to_string()),
            "AGENTQ_REDIS_URL" => Some("redis://env".to_string()),
            "AGENTQ_HEARTBEAT_SECS" => Some("1".to_string()),
            "AGENTQ_DEFAULT_PROVIDER" => Some("anthropic".to_string()),
            _ => None,
        };
        let args = parse(&["--heartbeat-secs", "0.5", "--redis-url", "redis://flag"]);
        let (_, cfg, db, redis) = worker_config(&args, env).unwrap();
        assert_eq!(db, "postgres://env/db");
        assert_eq!(redis, "redis://flag");
        assert_eq!(
            cfg.heartbeat_interval,
            std::time::Duration::from_millis(500)
        );
        assert_eq!(cfg.default_provider.as_deref(), Some("anthropic"));

        let e = worker_config(&parse(&[]), |_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("AGENTQ_DATABASE_URL"), "{e}");
        let e = worker_config(&parse(&["--heartbeat-secs", "6"]), env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--heartbeat-secs"), "{e}");
    }

    /// A worker whose own defaults its policy forbids refuses to start, naming the
    /// setting; the policy it starts with is the configured one.
    #[test]
    fn the_policy_must_allow_the_workers_defaults() {
        let env = |tools: &'static str, provider: &'static str| {
            move |k: &str| match k {
                "AGENTQ_DATABASE_URL" => Some("postgres://env/db".to_string()),
                "AGENTQ_REDIS_URL" => Some("redis://env".to_string()),
                "AGENTQ_POLICY_TOOLS" => Some(tools.to_string()),
                "AGENTQ_DEFAULT_PROVIDER" => Some(provider.to_string()),
                _ => None,
            }
        };
        let e = worker_config(&parse(&[]), env("read_file", "scripted"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("worker.default_tools") && e.contains("list_dir"),
            "{e}"
        );
        let (_, cfg, _, _) = worker_config(
            &parse(&[]),
            env("read_file,list_dir,glob,grep,write_file", "scripted"),
        )
        .unwrap();
        let p = cfg.policy.for_tenant(agentq_core::policy::DEFAULT_TENANT);
        assert!(p.allows_tool("write_file") && !p.allows_tool("spawn_agent"));
    }
}
