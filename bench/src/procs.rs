//! The parts that need a worker in a process of its own: capacity (its RSS must be a
//! worker's, not the benchmark's) and recovery (it is SIGKILLed). The child is the `agentq`
//! binary ([`BenchArgs::agentq_binary`](crate::args::BenchArgs::agentq_binary): by default this
//! very process's executable) run as `agentq worker`, configured through flags and the
//! environment exactly as a deployment would be.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use agentq_core::SessionStatus;
use agentq_core::redis_queue::RedisQueue;

use crate::env::Env;
use crate::llm;
use crate::pools::SURVIVOR_CONCURRENCY;
use crate::report::{Results, progress, quantile};
use crate::turns::BUILTIN;
use crate::workload::{close, create_sessions, enqueue, script, worker};

/// Settings the environment could override; the children must run with the defaults.
const OVERRIDABLE: &[&str] = &[
    "AGENTQ_WORKER_CONCURRENCY",
    "AGENTQ_LEASE_TTL_SECS",
    "AGENTQ_HEARTBEAT_SECS",
    "AGENTQ_RECLAIM_MIN_IDLE_SECS",
    "AGENTQ_RECLAIM_INTERVAL_SECS",
    "AGENTQ_MAX_ATTEMPTS",
    "AGENTQ_SCRIPT",
    "AGENTQ_DEFAULT_PROVIDER",
    "AGENTQ_DEFAULT_MODEL",
    "AGENTQ_WORKSPACE_ROOT",
    "AGENTQ_METRICS_ADDR",
];

pub(crate) fn spawn_worker(
    env: &Env,
    queue: &str,
    args: &[&str],
    vars: &[(&str, &str)],
    log: &Path,
) -> anyhow::Result<Child> {
    let exe = env.agentq_binary()?;
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("worker")
        .args(["--queues", queue, "--metrics-addr", "127.0.0.1:0"])
        .arg("--workspace-root")
        .arg(env.scratch.join("workspaces"))
        .args(args)
        .env("AGENTQ_DATABASE_URL", &env.db_url)
        .env("AGENTQ_REDIS_URL", &env.redis_url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true);
    for v in OVERRIDABLE {
        cmd.env_remove(v);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn()
        .with_context(|| format!("spawning `{} worker`", exe.display()))
}

/// Peak resident set of a process (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn check_alive(child: &mut Child, log: &Path) -> anyhow::Result<()> {
    if let Ok(Some(status)) = child.try_wait() {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        bail!(
            "the worker process exited ({status}):\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(())
}

/// Sessions of `queue` running under a lease, and their iterations so far.
async fn progress_of(env: &Env, queue: &str) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT (count(*) FILTER (WHERE status = 'running' AND lease_owner IS NOT NULL))::bigint, \
                coalesce(sum(iteration), 0)::bigint \
         FROM sessions WHERE queue = $1",
    )
    .bind(queue)
    .fetch_one(env.store.pool())
    .await?)
}

pub async fn capacity(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let a = &env.args;
    let offered = a.capacity_sessions;
    let latency = Duration::from_millis(a.llm_latency_ms);
    // Long enough to still run after the ramp-up and the whole window.
    let iterations = u32::try_from(a.capacity_secs)?.saturating_add(60);
    let writers = env.args.checkpoint_writers.saturating_add(1);
    let pool = agentq_worker::pool_connections(offered as usize);
    env.pools.check("capacity", pool.saturating_add(writers))?;
    let fake = llm::start(latency, iterations).await?;
    let base_url = llm::base_url(&fake);
    let queue = env.queue("capacity");
    let ids = create_sessions(env, &queue, offered, iterations, BUILTIN).await?;
    let redis = RedisQueue::connect(&env.redis_url).await?;
    enqueue(&redis, &queue, &ids).await?;
    let log = env.scratch.join("capacity-worker.log");
    let concurrency = offered.to_string();
    let batch_max = env.args.checkpoint_batch_max.to_string();
    let writers = env.args.checkpoint_writers.to_string();
    let mut child = spawn_worker(
        env,
        &queue,
        &[
            "--concurrency",
            &concurrency,
            "--default-provider",
            "openai",
            "--checkpoint-batch-max",
            &batch_max,
            "--checkpoint-writers",
            &writers,
        ],
        &[
            ("OPENAI_BASE_URL", base_url.as_str()),
            ("OPENAI_API_KEY", "bench"),
        ],
        &log,
    )?;
    let pid = child.id().context("the worker process has no pid")?;
    let started = Instant::now();
    let ramp_limit = Duration::from_secs(120);
    let mut running;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        check_alive(&mut child, &log)?;
        (running, _) = progress_of(env, &queue).await?;
        if running >= i64::from(offered) || started.elapsed() > ramp_limit {
            break;
        }
    }
    let ramp = started.elapsed().as_secs_f64();
    progress(&format!(
        "capacity: {running} sessions in flight after {ramp:.1} s; measuring for {} s",
        a.capacity_secs
    ));
    let (_, i0) = progress_of(env, &queue).await?;
    let t0 = Instant::now();
    let window = Duration::from_secs(a.capacity_secs);
    let mut min_running = running;
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(500)).await;
        check_alive(&mut child, &log)?;
        let (n, _) = progress_of(env, &queue).await?;
        min_running = min_running.min(n);
    }
    let (_, i1) = progress_of(env, &queue).await?;
    let dt = t0.elapsed().as_secs_f64();
    let rss = peak_rss(pid);
    let _ = child.kill().await;
    r.capacity_offered = Some(offered);
    r.capacity_sessions = Some(u64::try_from(min_running.max(0))?);
    r.capacity_iterations_per_s = Some((i1 - i0) as f64 / dt);
    r.capacity_rss_bytes = rss;
    r.capacity_http2 = Some(fake.http2_request_count() > fake.request_count() / 2);
    r.capacity_ramp_s = (running >= i64::from(offered)).then_some(ramp);
    r.capacity_iterations_per_session = Some(i1 as f64 / f64::from(offered.max(1)));
    progress(&format!(
        "capacity: {:.0} iterations/s, {} LLM requests served",
        (i1 - i0) as f64 / dt,
        fake.request_count()
    ));
    Ok(())
}

pub async fn recovery(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let n = env.args.sessions.min(20);
    // Each turn takes 250 ms: sessions are mid-run for ~20 s, well past the kill.
    let iterations = 80;
    let script_json = script(iterations, 250, BUILTIN);
    // The child (default settings) and the survivor each use at most a connection per
    // session, besides their checkpoint writers and heartbeat.
    let child_writers = agentq_worker::WorkerSettings::default().writer_connections();
    let survivor_pool = env.pools.main(SURVIVOR_CONCURRENCY);
    env.pools.check(
        "recovery",
        n.saturating_add(child_writers)
            .saturating_add(survivor_pool)
            .saturating_add(env.args.checkpoint_writers.saturating_add(1)),
    )?;
    let script_path = env.scratch.join("recovery-script.json");
    std::fs::write(&script_path, &script_json)?;
    let queue = env.queue("recovery");
    let ids = create_sessions(env, &queue, n, iterations, BUILTIN).await?;
    let redis = RedisQueue::connect(&env.redis_url).await?;
    enqueue(&redis, &queue, &ids).await?;
    let log = env.scratch.join("recovery-worker.log");
    let script_arg = script_path.to_string_lossy().to_string();
    let mut child = spawn_worker(
        env,
        &queue,
        &["--script", &script_arg, "--default-provider", "scripted"],
        &[],
        &log,
    )?;
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        check_alive(&mut child, &log)?;
        let (running, _) = progress_of(env, &queue).await?;
        if running >= i64::from(n) {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("recovery: the worker process did not start all {n} sessions in 60 s");
        }
    }
    // Mid-run, past at least one heartbeat, with the survivor already up and idle.
    let (survivor, survivor_store) = worker(
        env,
        &queue,
        "recovery-survivor",
        SURVIVOR_CONCURRENCY,
        &script_json,
        BUILTIN,
    )
    .await?;
    let stop = CancellationToken::new();
    let handle = {
        let (w, s) = (survivor.clone(), stop.clone());
        tokio::spawn(async move { w.run(s).await })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    check_alive(&mut child, &log)?;
    let before: HashMap<String, i32> =
        sqlx::query_as("SELECT id, iteration FROM sessions WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(env.store.pool())
            .await?
            .into_iter()
            .collect();
    child.start_kill().context("SIGKILL the worker process")?;
    let killed = Instant::now();
    let _ = child.wait().await;
    let me = survivor.consumer().to_string();
    let recovered = resumed_by(env, &ids, &before, &me, killed).await;
    stop.cancel();
    let _ = handle.await;
    close(&survivor_store).await;
    let recovered = recovered?;
    let mut times: Vec<Duration> = recovered.into_values().collect();
    times.sort();
    r.recovery_sessions = Some(times.len());
    r.recovery_s = times.last().map(Duration::as_secs_f64);
    r.recovery_p50_s = quantile(&times, 0.5).map(|d| d.as_secs_f64());
    Ok(())
}

/// For each of `ids`, the time after `killed` at which a worker other than the killed one
/// (`me`, the survivor; or any, once the session has finished) committed an iteration past
/// `before`.
async fn resumed_by(
    env: &Env,
    ids: &[String],
    before: &HashMap<String, i32>,
    me: &str,
    killed: Instant,
) -> anyhow::Result<HashMap<String, Duration>> {
    let mut recovered: HashMap<String, Duration> = HashMap::new();
    while recovered.len() < ids.len() {
        if killed.elapsed() > Duration::from_secs(120) {
            bail!(
                "recovery: only {} of {} sessions resumed within 120 s",
                recovered.len(),
                ids.len()
            );
        }
        let rows: Vec<(String, i32, Option<String>, String)> = sqlx::query_as(
            "SELECT id, iteration, lease_owner, status FROM sessions WHERE id = ANY($1)",
        )
        .bind(ids)
        .fetch_all(env.store.pool())
        .await?;
        let now = killed.elapsed();
        for (id, iteration, owner, status) in rows {
            let moved = iteration > before.get(&id).copied().unwrap_or(i32::MAX);
            let ours = owner.as_deref() == Some(me)
                || SessionStatus::parse(&status) != Some(SessionStatus::Running);
            if moved && ours {
                recovered.entry(id).or_insert(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(recovered)
}
