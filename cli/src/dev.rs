//! `agentq dev`: the scheduler API and a few workers in one process, on the embedded
//! default (one SQLite file and the in-process queue) or, when `AGENTQ_DATABASE_URL` and
//! `AGENTQ_REDIS_URL` are set, on Postgres and Redis. Its workers are configured exactly
//! as `agentq worker` is ([`dev_config`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use agentq_core::config::Settings;
use agentq_scheduler::{AuthSettings, SchedulerSettings};
use agentq_worker::{Drain, Worker, WorkerSettings};

use crate::flags::WorkerFlags;
use crate::process::{Start, Stop, stopped};
// `agentq demo` opens its backend through here too.
pub use crate::stack::Stack;

/// Past the workers' drain timeout, what the rest of a shutdown (scheduler, background
/// tasks, aborting sessions that did not reach a checkpoint) may take before `dev` exits
/// anyway.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(15);

/// Every flag overrides its setting in `agentq.toml` and its environment variable.
#[derive(Args, Debug)]
pub struct DevArgs {
    #[command(flatten)]
    pub worker: WorkerFlags,
    /// The embedded database file, used unless AGENTQ_DATABASE_URL and AGENTQ_REDIS_URL
    /// are set (AGENTQ_DB; default ./agentq.db).
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Listen address of the HTTP API (AGENTQ_API_ADDR; default 127.0.0.1:7700).
    #[arg(long)]
    pub addr: Option<String>,
    /// Where `/metrics` is served (AGENTQ_METRICS_ADDR; default 127.0.0.1:9464). A port
    /// already in use is refused; 127.0.0.1:0 takes any free one.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// In-process workers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Configuration file (default: ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

impl DevArgs {
    fn apply(&self, s: &mut Settings) {
        self.worker.apply(s);
        if let Some(db) = &self.db {
            s.sqlite_path = db.clone();
        }
        if let Some(addr) = &self.addr {
            s.api_addr = addr.clone();
        }
        if let Some(addr) = &self.metrics_addr {
            s.metrics_addr = addr.clone();
        }
    }
}

/// Dev's settings and its workers' configuration: the same settings tree, rules and
/// worker configuration as `agentq worker` (file, environment `env`, then dev's flags),
/// so dev honours every setting the worker does.
pub fn dev_config(
    args: &DevArgs,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<(Settings, WorkerSettings)> {
    let settings = Settings::resolve(args.config.as_deref(), env, |s| args.apply(s))?;
    let wcfg = WorkerSettings::from_settings(&settings)?;
    Ok((settings, wcfg))
}

/// How dev's API authenticates. On a loopback address it may run keyless (the tenant
/// `default`, for the two-command start) but answers only loopback `Host` names, so a web
/// page that rebinds its name to 127.0.0.1 gets nothing. Any other address is reachable
/// from elsewhere: it needs `AGENTQ_ADMIN_KEY` and then checks keys as the scheduler does.
pub fn dev_auth(
    bound: std::net::SocketAddr,
    admin_key: Option<&str>,
    cfg: &Settings,
) -> anyhow::Result<AuthSettings> {
    let mut auth = SchedulerSettings::from(&cfg.scheduler).auth;
    if let Some(key) = admin_key {
        auth = auth.with_admin_key(key);
    }
    if bound.ip().is_loopback() {
        auth.keyless = admin_key.is_none();
        auth.loopback_hosts_only = true;
    } else if admin_key.is_none() {
        bail!(
            "--addr {bound} is not a loopback address: anyone who can reach it could run \
             sessions. Set AGENTQ_ADMIN_KEY (and give clients keys from `agentq keys create`) \
             or listen on 127.0.0.1"
        );
    }
    Ok(auth)
}

/// `agentq dev`: serve the API and run the workers until SIGTERM/SIGINT, then drain.
pub async fn dev(args: DevArgs) -> anyhow::Result<ExitCode> {
    let (cfg, mut wcfg) = dev_config(&args, |k| std::env::var(k).ok())?;
    crate::process::warn_without_model("dev", &wcfg);
    // Before anything is bound or opened: a bad key is the operator's to fix first.
    let admin_key = crate::scheduler::admin_key_from_env()?;
    // First, so a port already taken is refused before the database is opened.
    let (metrics, metrics_at) = crate::process::bind_metrics(&cfg.metrics_addr).await?;
    eprintln!("agentq dev: /metrics on http://{metrics_at}");
    let stack = open_stack(&cfg, &wcfg).await?;
    let addr = cfg.api_addr.clone();
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener
        .local_addr()
        .context("cannot read the listen address")?;
    let auth = dev_auth(bound, admin_key.as_deref(), &cfg)?;
    let local = bound.to_string();

    let shutdown = CancellationToken::new();
    crate::signals::cancel_on_signal(shutdown.clone());
    connect_limiter(&cfg, &mut wcfg, &shutdown).await?;

    let drain_timeout = wcfg.drain_timeout;
    let id = format!("{}-dev", agentq_worker::default_consumer_name());
    let workers = spawn_workers(&id, args.workers, &wcfg, &stack, &shutdown);
    let mut scheduler_settings = SchedulerSettings::from_settings(&cfg)?;
    scheduler_settings.auth = auth;
    // Sessions may name every queue dev's own workers read (`--queues`).
    for q in &wcfg.queues {
        if !scheduler_settings.queues.contains(q) {
            scheduler_settings.queues.push(q.clone());
        }
    }
    let scheduler = tokio::spawn(agentq_scheduler::run(
        stack.store.clone(),
        stack.queue.clone(),
        scheduler_settings,
        listener,
        Some(metrics),
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
    Start {
        id: match args.workers {
            1 => format!("{id}0"),
            n => format!("{id}0..{id}{}", n - 1),
        },
        store: stack.store_url.clone(),
        queue: stack.queue_url.clone(),
        api: local,
        metrics: metrics_at.to_string(),
        ..Start::for_workers("dev", String::new(), &wcfg)
    }
    .log();

    let (scheduler, failure) = run_until_stopped(scheduler, &shutdown).await;
    eprintln!("agentq dev: shutting down (running sessions stop at their next checkpoint)");
    let finished = tokio::time::timeout(drain_timeout + SHUTDOWN_SLACK, finish(workers, scheduler))
        .await
        .unwrap_or(false);
    if !finished {
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
        stopped("dev", Stop::Failed(&e));
        return Err(e);
    }
    stopped("dev", Stop::Drained { finished });
    eprintln!("agentq dev: stopped");
    Ok(ExitCode::SUCCESS)
}

/// The backend dev runs on: Postgres and Redis when both URLs are set, the embedded store
/// (serving the scheduler's queues and the workers') when neither is.
async fn open_stack(cfg: &Settings, wcfg: &WorkerSettings) -> anyhow::Result<Stack> {
    let mut queues = cfg.scheduler.queues.clone();
    for q in &wcfg.queues {
        if !queues.contains(q) {
            queues.push(q.clone());
        }
    }
    let objects = agentq_core::blob::s3::from_workspace(&cfg.workspace)?;
    Ok(
        match (cfg.database_url.as_deref(), cfg.redis_url.as_deref()) {
            (Some(db), Some(redis)) => {
                Stack::services(db, redis, wcfg.writer_connections(), objects).await?
            }
            (None, None) => Stack::embedded(&cfg.sqlite_path, &queues, true, objects).await?,
            (Some(_), None) => bail!(
                "AGENTQ_DATABASE_URL is set but AGENTQ_REDIS_URL is not: set both (Postgres and \
                 Redis) or neither (the embedded store)"
            ),
            (None, Some(_)) => bail!(
                "AGENTQ_REDIS_URL is set but AGENTQ_DATABASE_URL is not: set both (Postgres and \
                 Redis) or neither (the embedded store)"
            ),
        },
    )
}

/// With Redis the workers share the fleet's rate limiter, as `agentq worker` does; the
/// embedded mode has nothing to share it through.
async fn connect_limiter(
    cfg: &Settings,
    wcfg: &mut WorkerSettings,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    match cfg.redis_url.as_deref() {
        Some(redis) => {
            wcfg.limiter =
                agentq_core::admission::Limiter::connect(redis, &cfg.limits, shutdown.clone())
                    .await
                    .with_context(|| {
                        format!(
                            "cannot connect the rate limiter to Redis at {}",
                            crate::stack::redact(redis)
                        )
                    })?;
        }
        None if !cfg.limits.is_empty() => eprintln!(
            "agentq dev: the [[limits]] of the configuration are not enforced on the embedded \
             store (they are counted in Redis: set AGENTQ_DATABASE_URL and AGENTQ_REDIS_URL)"
        ),
        None => {}
    }
    Ok(())
}

/// `count` workers on the stack, each its own consumer (`id` and its number).
fn spawn_workers(
    id: &str,
    count: u32,
    wcfg: &WorkerSettings,
    stack: &Stack,
    shutdown: &CancellationToken,
) -> Vec<JoinHandle<agentq_worker::Result<Drain>>> {
    (0..count)
        .map(|i| {
            let mut c = wcfg.clone();
            c.consumer = format!("{id}{i}");
            let worker = Worker::new(stack.store.clone(), stack.queue.clone(), c);
            let token = shutdown.clone();
            tokio::spawn(async move { worker.run(token).await })
        })
        .collect()
}

type SchedulerTask = JoinHandle<Result<(), agentq_scheduler::RunError>>;

/// Runs until a signal — or until a component stops on its own, which is an error. Gives
/// back the scheduler's task if it is still running, and the failure if there was one.
async fn run_until_stopped(
    scheduler: SchedulerTask,
    shutdown: &CancellationToken,
) -> (Option<SchedulerTask>, Option<anyhow::Error>) {
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
    (scheduler, failure)
}

/// Wait for the workers and the scheduler to end, saying how any of them failed.
/// Wait for the workers and the scheduler to end; whether every worker drained in time.
async fn finish(
    workers: Vec<JoinHandle<agentq_worker::Result<Drain>>>,
    scheduler: Option<SchedulerTask>,
) -> bool {
    let mut drained = true;
    for w in workers {
        match w.await {
            Ok(Ok(Drain::Finished)) => {}
            Ok(Ok(Drain::TimedOut)) => drained = false,
            Ok(Err(e)) => {
                drained = false;
                eprintln!("agentq dev: worker: {e}")
            }
            Err(e) => {
                drained = false;
                eprintln!("agentq dev: worker task failed: {e}")
            }
        }
    }
    if let Some(s) = scheduler {
        match s.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("agentq dev: scheduler: {e}"),
            Err(e) => eprintln!("agentq dev: scheduler task failed: {e}"),
        }
    }
    drained
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: DevArgs,
    }

    fn parse(argv: &[&str]) -> DevArgs {
        Cli::try_parse_from(std::iter::once("dev").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    /// `agentq dev` once left its sessions on the scripted model whatever
    /// AGENTQ_DEFAULT_PROVIDER said: its workers take the provider, model, endpoint,
    /// timings, tools and limits from the environment like `agentq worker`.
    #[test]
    fn dev_uses_the_default_provider_and_everything_else_from_the_environment() {
        let (settings, wcfg) = dev_config(
            &parse(&["--concurrency", "3"]),
            env(&[
                ("AGENTQ_DEFAULT_PROVIDER", "openai"),
                ("AGENTQ_DEFAULT_MODEL", "gpt-test"),
                ("OPENAI_BASE_URL", "http://llm:8000/v1"),
                ("OPENAI_API_KEY", "sk-dev"),
                ("AGENTQ_LEASE_TTL_SECS", "3"),
                ("AGENTQ_HEARTBEAT_SECS", "1"),
                ("AGENTQ_RECLAIM_MIN_IDLE_SECS", "4"),
                ("AGENTQ_ALLOWED_HOSTS", "localhost:9000"),
                ("AGENTQ_SHELL_ENABLED", "true"),
                ("AGENTQ_MAX_ATTEMPTS", "2"),
                ("AGENTQ_WORKER_CONCURRENCY", "50"),
                ("AGENTQ_DB", "/tmp/dev-test.db"),
            ]),
        )
        .unwrap();
        assert_eq!(wcfg.default_provider.as_deref(), Some("openai"));
        assert_eq!(wcfg.default_model.as_deref(), Some("gpt-test"));
        assert_eq!(
            wcfg.providers.openai_base_url.as_deref(),
            Some("http://llm:8000/v1")
        );
        assert_eq!(wcfg.providers.openai_api_key.as_deref(), Some("sk-dev"));
        assert_eq!(wcfg.lease_ttl, Duration::from_secs(3));
        assert_eq!(wcfg.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(wcfg.reclaim_min_idle, Duration::from_secs(4));
        assert_eq!(wcfg.tool_settings.allowed_hosts, vec!["localhost:9000"]);
        assert!(wcfg.tool_settings.shell_enabled);
        assert_eq!(wcfg.max_attempts, 2);
        // The flag beats the variable.
        assert_eq!(wcfg.concurrency, 3);
        assert_eq!(settings.sqlite_path, PathBuf::from("/tmp/dev-test.db"));
    }

    /// A heartbeat as long as the lease let a running session be reclaimed mid-run:
    /// dev refuses it, as `agentq worker` does, naming the setting, variable and flag.
    #[test]
    fn dev_refuses_a_heartbeat_not_shorter_than_the_lease() {
        let e = dev_config(&parse(&[]), env(&[("AGENTQ_HEARTBEAT_SECS", "6")]))
            .unwrap_err()
            .to_string();
        for name in [
            "worker.heartbeat_secs",
            "AGENTQ_HEARTBEAT_SECS",
            "--heartbeat-secs",
        ] {
            assert!(e.contains(name), "{name} not in {e}");
        }
        let e = dev_config(
            &parse(&["--heartbeat-secs", "5", "--lease-ttl-secs", "4"]),
            env(&[]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--heartbeat-secs"), "{e}");
    }
}
