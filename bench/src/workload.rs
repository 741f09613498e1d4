//! The scripted workload of the in-process parts: its tool, script and sessions, workers
//! configured as `agentq worker` configures them (with the bench's MCP server when the
//! tool is the MCP one), and the timed runs of the throughput and overhead parts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use agentq_agent::provider::scripted::{Script, ScriptedCall, Turn};
use agentq_agent::schema::Usage;
use agentq_agent::tools::{
    SideEffect, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings,
    builtin_registry,
};
use agentq_core::config::RedisSection;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::sharded::ShardedStore;
use agentq_core::{EnqueueReason, NewSession, Queue, SessionStore, Store, WorkQueue};
use agentq_worker::{Worker, WorkerSettings};

use crate::cpu::Sample;
use crate::env::Env;
use crate::mcp_server;
use crate::report::{Results, ms, progress, quantile};
use crate::turns::{
    FINAL_TEXT, MCP_TOOL, TOOL_DESCRIPTION, TRIVIAL, TURN_TEXT, spec, tool_answer, tool_parameters,
};

/// [`TRIVIAL`], or (only to describe it, in [`tools`]) the MCP tool, which says the same.
struct Trivial(&'static str);

#[async_trait::async_trait]
impl Tool for Trivial {
    fn name(&self) -> &str {
        self.0
    }
    fn description(&self) -> &str {
        TOOL_DESCRIPTION
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::Value::Object(tool_parameters())
    }
    fn side_effect(&self, _args: &serde_json::Value) -> SideEffect {
        SideEffect::Pure
    }
    async fn call(
        &self,
        args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok(tool_answer(args.as_object())))
    }
}

/// The built-in tools, the trivial one and, as the model is shown it, the MCP one: what a
/// request holds of each. Never a worker's registry: there the MCP tool is the server's.
pub fn tools() -> ToolRegistry {
    let mut all = builtin_registry(&ToolSettings::default());
    all.register(Arc::new(Trivial(TRIVIAL)));
    all.register(Arc::new(Trivial(MCP_TOOL)));
    all
}

/// The scripted model: `iterations - 1` turns calling `tool`, then an answer.
pub fn script(iterations: u32, delay_ms: u64, tool: &str) -> String {
    let usage = Some(Usage {
        input_tokens: 200,
        output_tokens: 40,
        ..Default::default()
    });
    let mut turns: Vec<Turn> = (1..iterations)
        .map(|_| Turn {
            text: TURN_TEXT.into(),
            tool_calls: vec![ScriptedCall {
                name: tool.into(),
                arguments: serde_json::json!({"path": "."}),
                ..Default::default()
            }],
            usage,
            delay_ms,
            ..Default::default()
        })
        .collect();
    turns.push(Turn {
        text: FINAL_TEXT.into(),
        usage,
        delay_ms,
        ..Default::default()
    });
    serde_json::to_string(&Script {
        turns,
        ..Script::default()
    })
    .unwrap_or_default()
}

/// Create `n` sessions on `queue` (not enqueued). Returns their ids.
pub async fn create_sessions(
    env: &Env,
    queue: &str,
    n: u32,
    iterations: u32,
    tool: &str,
) -> anyhow::Result<Vec<String>> {
    create_sessions_in(&env.store, queue, n, iterations, tool).await
}

/// [`create_sessions`] in `store` (one shard, or a sharded store over several).
async fn create_sessions_in(
    store: &dyn SessionStore,
    queue: &str,
    n: u32,
    iterations: u32,
    tool: &str,
) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::with_capacity(n as usize);
    let all: Vec<NewSession> = (0..n)
        .map(|_| NewSession::root(spec(iterations, tool), queue))
        .collect();
    for chunk in all.chunks(1000) {
        let rows = store.create_sessions(chunk).await?;
        ids.extend(rows.into_iter().map(|(r, _)| r.id));
    }
    Ok(ids)
}

pub async fn enqueue(queue: &dyn Queue, name: &str, ids: &[String]) -> anyhow::Result<()> {
    queue.ensure_queue(name).await?;
    for chunk in ids.chunks(1000) {
        let items: Vec<(String, EnqueueReason)> = chunk
            .iter()
            .map(|id| (id.clone(), EnqueueReason::New))
            .collect();
        queue.enqueue_many(name, &items).await?;
    }
    Ok(())
}

/// A worker as `agentq worker` would configure it, on its own pool (of the size the
/// server's free connections allow, see [`crate::pools`]) and Redis connection; and its
/// store, to [`close`] once the worker has stopped.
pub async fn worker(
    env: &Env,
    queue: &str,
    name: &str,
    concurrency: u32,
    script: &str,
    tool: &str,
) -> anyhow::Result<(Worker, PgStore)> {
    start(env, config(env, queue, name, concurrency, script, tool)?).await
}

/// The configuration of [`worker`], for a part that changes it before [`start`].
pub fn config(
    env: &Env,
    queue: &str,
    name: &str,
    concurrency: u32,
    script: &str,
    tool: &str,
) -> anyhow::Result<WorkerSettings> {
    let mut cfg = WorkerSettings {
        consumer: format!("bench-{}-{name}", env.run),
        queues: vec![queue.to_string()],
        concurrency: concurrency as usize,
        workspace_root: env.scratch.join("workspaces"),
        default_provider: Some("scripted".into()),
        default_tools: vec![tool.into()],
        event_ttl: Duration::from_secs(60),
        checkpoint_batch_max: env.args.checkpoint_batch_max as usize,
        checkpoint_writers: env.args.checkpoint_writers as usize,
        ..WorkerSettings::default()
    };
    cfg.providers.script = Some(script.to_string());
    // The operator's policy of a bench worker allows the one tool its sessions call.
    cfg.policy = Arc::new(agentq_core::policy::Policy::from_section(
        &agentq_core::config::PolicySection {
            tools: vec![tool.to_string()],
            ..Default::default()
        },
    )?);
    match tool {
        TRIVIAL => cfg.tools.register(Arc::new(Trivial(TRIVIAL))),
        // Started by the worker as any `[[mcp.servers]]` entry is.
        MCP_TOOL => {
            cfg.mcp_servers = vec![mcp_server::server_settings(env, name, cfg.concurrency)?];
        }
        _ => {}
    }
    Ok(cfg)
}

/// A worker of `cfg` on its own pool and Redis connection, as [`worker`] describes.
pub async fn start(env: &Env, cfg: WorkerSettings) -> anyhow::Result<(Worker, PgStore)> {
    let (worker, mut stores) = start_on(env, &Routing::of(env), cfg).await?;
    let store = stores
        .pop()
        .context("a worker on one Postgres has its store")?;
    Ok((worker, store))
}

/// A worker of `cfg` on `routing`'s services: its own pools on each shard (a sharded store
/// over them when there are several, as `agentq worker` opens them) and its own Redis
/// connection. Returns the worker and its per-shard stores, to [`close`].
async fn start_on(
    env: &Env,
    routing: &Routing,
    cfg: WorkerSettings,
) -> anyhow::Result<(Worker, Vec<PgStore>)> {
    let concurrency = u32::try_from(cfg.concurrency)?;
    let mut stores = Vec::with_capacity(routing.db_urls.len());
    for url in &routing.db_urls {
        let store =
            PgStore::connect_for_worker(url, env.pools.main(concurrency), cfg.writer_connections())
                .await?;
        store.open_all().await?;
        stores.push(store);
    }
    let store = one_store(&stores)?;
    let redis = RedisQueue::connect_with(&routing.redis_url, &routing.redis).await?;
    Ok((Worker::new(store, Arc::new(redis), cfg), stores))
}

/// One store over `shards`, as `agentq worker` opens them: the store itself when there is
/// one, else a sharded store over them.
pub fn one_store(shards: &[PgStore]) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match shards {
        [one] => Arc::new(one.clone()),
        _ => Arc::new(ShardedStore::new(shards.to_vec())?),
    })
}

/// Where a workload's workers and sessions live: by default the run's Postgres and Redis
/// ([`Routing::of`]); for the scale part, several Postgres shards or a Redis Cluster.
pub struct Routing {
    /// Each shard's URL, the control shard first.
    pub db_urls: Vec<String>,
    pub redis_url: String,
    pub redis: RedisSection,
    /// An admin store per shard, in the same order: the workload's counts read each.
    pub shards: Vec<PgStore>,
    /// Where the workload's sessions are created: the one shard's store, or a sharded
    /// store over `shards`, which spreads the trees over them as a deployment's API does.
    pub store: Arc<dyn Store>,
}

impl Routing {
    /// The run's own Postgres and Redis, as every part but the scale one uses them.
    pub fn of(env: &Env) -> Routing {
        Routing {
            db_urls: vec![env.db_url.clone()],
            redis_url: env.redis_url.clone(),
            redis: RedisSection::default(),
            shards: vec![env.store.clone()],
            store: Arc::new(env.store.clone()),
        }
    }
}

/// Close a stopped worker's pools now, rather than whenever the last handle goes, so that
/// the next part finds their connections free.
pub async fn close(store: &PgStore) {
    store.close().await;
}

pub struct Workload {
    pub part: &'static str,
    /// What every turn but the last calls (as sessions name it).
    pub tool: &'static str,
    pub sessions: u32,
    pub iterations: u32,
    /// Run the same workload (its rounds included) once on the same workers before the
    /// measured one.
    pub warm_up: bool,
    /// Measured rounds, one after the other, each with sessions of its own (at least one).
    pub rounds: u32,
}

pub struct Ran {
    /// The measured round's iterations (sessions × iterations).
    pub iterations: f64,
    pub elapsed: Duration,
    pub ids: Vec<String>,
    pub overhead: Vec<Duration>,
    /// Sessions that did not end `completed` with every iteration.
    pub failed: u64,
    /// CPU spent from the enqueue to the last completion.
    pub cpu: Sample,
    /// Bytes of write-ahead log Postgres wrote over the same time.
    pub wal_bytes: Option<f64>,
    /// The warm-up round's time from the enqueue to the last completion: the workload as
    /// the first burst on fresh workers runs it.
    pub cold: Option<Duration>,
    /// The checkpoint latency histogram's counts in the measured round.
    pub checkpoint_hist: Hist,
    /// Group commits in the measured round, and the checkpoints they carried.
    pub commits: (u64, f64),
    /// With the MCP tool: the tool calls the servers answered (warm-up included), and
    /// those the sessions that completed made.
    pub mcp_calls: Option<(u64, u64)>,
}

impl Ran {
    /// Two rounds of the same workload as one: their times, samples and counts added.
    pub fn merge(self, o: Ran) -> Ran {
        let add = |a: Option<f64>, b: Option<f64>| Some(a? + b?);
        let mut ids = self.ids;
        ids.extend(o.ids);
        let mut overhead = self.overhead;
        overhead.extend(o.overhead);
        Ran {
            iterations: self.iterations + o.iterations,
            elapsed: self.elapsed + o.elapsed,
            ids,
            overhead,
            failed: self.failed + o.failed,
            cpu: Sample {
                own: add(self.cpu.own, o.cpu.own),
                postgres: add(self.cpu.postgres, o.cpu.postgres),
                redis: add(self.cpu.redis, o.cpu.redis),
                mcp_servers: add(self.cpu.mcp_servers, o.cpu.mcp_servers),
            },
            wal_bytes: add(self.wal_bytes, o.wal_bytes),
            cold: self.cold.zip(o.cold).map(|(a, b)| a + b),
            checkpoint_hist: self
                .checkpoint_hist
                .iter()
                .zip(&o.checkpoint_hist)
                .map(|((ub, a), (_, b))| (*ub, a + b))
                .collect(),
            commits: (self.commits.0 + o.commits.0, self.commits.1 + o.commits.1),
            mcp_calls: self
                .mcp_calls
                .zip(o.mcp_calls)
                .map(|((a, b), (c, d))| (a + c, b + d)),
        }
    }
}

/// N sessions × K iterations on W in-process workers, timed from the enqueue to the last
/// completion. The workers are up and idle before the clock starts; with `warm_up`, they
/// have also run the same workload once, so that the figure is the rate of workers in
/// service rather than of their first burst, which opens every pooled Postgres connection
/// (a fork, then each backend's catalog caches and each statement's preparation).
pub async fn run_workload(env: &Env, w: &Workload) -> anyhow::Result<Ran> {
    run_workload_on(env, &Routing::of(env), w).await
}

/// [`run_workload`] on `routing`'s services. Its CPU and WAL figures are those of the
/// run's own servers, so only the iterations and times mean anything on others.
pub async fn run_workload_on(env: &Env, routing: &Routing, w: &Workload) -> anyhow::Result<Ran> {
    let queue = env.queue(w.part);
    let tool = w.tool;
    let fleet = Fleet::start(env, routing, w, &queue, tool).await?;
    let redis = RedisQueue::connect_with(&routing.redis_url, &routing.redis).await?;
    redis.ensure_queue(&queue).await?;
    let round = async |ids: &[String]| -> anyhow::Result<Duration> {
        let total = fleet.completed() + ids.len() as u64;
        let started = Instant::now();
        enqueue(&redis, &queue, ids).await?;
        let deadline = started + Duration::from_secs(600);
        while fleet.completed() < total {
            if Instant::now() > deadline {
                bail!(
                    "{}: only {} of {} sessions finished in 600 s",
                    w.part,
                    fleet.completed(),
                    ids.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(started.elapsed())
    };
    // Each measured round (and each warm-up round) with sessions of its own.
    let create = async || -> anyhow::Result<Vec<Vec<String>>> {
        let mut sets = Vec::new();
        for _ in 0..w.rounds.max(1) {
            sets.push(
                create_sessions_in(
                    routing.store.as_ref(),
                    &queue,
                    w.sessions,
                    w.iterations,
                    tool,
                )
                .await?,
            );
        }
        Ok(sets)
    };
    let rounds = async |sets: &[Vec<String>]| -> anyhow::Result<Duration> {
        let mut total = Duration::ZERO;
        for set in sets {
            total += round(set).await?;
        }
        Ok(total)
    };
    let measured = async {
        let mut cold = None;
        let mut all = Vec::new();
        if w.warm_up {
            // Its rounds too: one lone session would leave most of the workers' pooled
            // connections cold for the measured rounds.
            let sets = create().await?;
            all = sets.concat();
            tokio::time::sleep(Duration::from_millis(300)).await;
            cold = Some(rounds(&sets).await?);
        }
        let sets = create().await?;
        let ids: Vec<String> = sets.concat();
        all.extend(ids.iter().cloned());
        // Let the workers reach their first (next) XREADGROUP.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let meters = Meters::start(env).await;
        let elapsed = rounds(&sets).await;
        let (overhead, cpu_wal, hist, commits) = meters.stop(env).await;
        anyhow::Ok((ids, all, elapsed?, overhead, cpu_wal, cold, hist, commits))
    }
    .await;
    let served = fleet.stop().await;
    let (ids, all, elapsed, overhead, (cpu, wal_bytes), cold, checkpoint_hist, commits) = measured?;
    let failed = not_completed(routing, &all, w.iterations).await?;
    let mcp_calls = match served {
        Some(served) => Some(mcp_calls(w, served?, all.len(), failed)?),
        None => None,
    };
    Ok(Ran {
        iterations: f64::from(w.sessions) * f64::from(w.iterations) * f64::from(w.rounds.max(1)),
        elapsed,
        failed,
        ids,
        overhead,
        cpu,
        wal_bytes,
        cold,
        checkpoint_hist,
        commits,
        mcp_calls,
    })
}

/// What [`Meters::stop`] read: the overhead samples, CPU and WAL bytes, checkpoint
/// histogram and (commits, checkpoints committed).
type Measured = (Vec<Duration>, (Sample, Option<f64>), Hist, (u64, f64));

/// What a measured round is read from: the overhead tap, the commits' batch sizes and
/// durations, the servers' CPU and the WAL, each as it stood before the round.
struct Meters {
    batches: (u64, f64),
    hist: Hist,
    cpu: Sample,
    wal: Option<String>,
}

impl Meters {
    async fn start(env: &Env) -> Meters {
        let batches = &agentq_core::metrics::global().checkpoint_batch_size;
        let batches = (batches.get_sample_count(), batches.get_sample_sum());
        let hist = checkpoint_hist();
        agentq_worker::overhead_tap().start();
        let cpu = env.cpu.sample().await;
        let wal = wal_position(env).await;
        Meters {
            batches,
            hist,
            cpu,
            wal,
        }
    }

    /// What changed since [`Meters::start`].
    async fn stop(self, env: &Env) -> Measured {
        let overhead = agentq_worker::overhead_tap().stop();
        let cpu = env.cpu.sample().await.since(&self.cpu);
        let wal_bytes = wal_written(env, self.wal).await;
        let batches = &agentq_core::metrics::global().checkpoint_batch_size;
        let commits = (
            batches.get_sample_count().saturating_sub(self.batches.0),
            batches.get_sample_sum() - self.batches.1,
        );
        let hist = hist_delta(&self.hist, &checkpoint_hist());
        (overhead, (cpu, wal_bytes), hist, commits)
    }
}

/// With the MCP tool: the calls the servers answered and those the `sessions` sessions
/// (`failed` of them not completed) made, a call every turn but the last; fewer answered
/// than made means calls failed, and the figures would not be those of MCP calls.
fn mcp_calls(
    w: &Workload,
    served: u64,
    sessions: usize,
    failed: u64,
) -> anyhow::Result<(u64, u64)> {
    let made = (sessions as u64).saturating_sub(failed) * u64::from(w.iterations.saturating_sub(1));
    if served < made {
        bail!(
            "{}: the MCP servers answered {served} tool calls, fewer than the {made} that the \
             completed sessions made: calls failed, so the figures would not be those of MCP \
             calls",
            w.part
        );
    }
    Ok((served, made))
}

/// Where Postgres's write-ahead log is, as text (`None` where the server will not say).
async fn wal_position(env: &Env) -> Option<String> {
    sqlx::query_scalar::<_, String>("SELECT pg_current_wal_lsn()::text")
        .fetch_one(env.store.pool())
        .await
        .ok()
}

/// Bytes of write-ahead log written since `before`.
async fn wal_written(env: &Env, before: Option<String>) -> Option<f64> {
    let before = before?;
    sqlx::query_scalar::<_, f64>("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
        .bind(before)
        .fetch_one(env.store.pool())
        .await
        .ok()
}

/// How long a fleet waits for its MCP servers' first answer (or failure) before its rounds.
const MCP_START_BOUND: Duration = Duration::from_secs(30);

/// The in-process workers of one workload, running until [`Fleet::stop`].
struct Fleet {
    workers: Vec<Worker>,
    stores: Vec<PgStore>,
    /// With the MCP tool: where each worker's server keeps its count of calls answered.
    served: Option<Vec<std::path::PathBuf>>,
    handles: Vec<tokio::task::JoinHandle<agentq_worker::Result<agentq_worker::Drain>>>,
    shutdown: CancellationToken,
}

impl Fleet {
    /// `--workers` workers on `queue`, each with its own pools, running the workload's
    /// script; with the MCP tool, once each worker's server has answered (or failed).
    async fn start(
        env: &Env,
        routing: &Routing,
        w: &Workload,
        queue: &str,
        tool: &str,
    ) -> anyhow::Result<Fleet> {
        let script = script(w.iterations, 0, tool);
        let mut fleet = Fleet {
            workers: Vec::new(),
            stores: Vec::new(),
            served: (tool == MCP_TOOL).then(Vec::new),
            handles: Vec::new(),
            shutdown: CancellationToken::new(),
        };
        for i in 0..env.args.workers {
            let name = format!("{}-{i}", w.part);
            if let Some(served) = &mut fleet.served {
                // A count left by an earlier round's server must not pass for this one's.
                let path = mcp_server::served_path(env, &name);
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        bail!("removing {}: {e}", path.display())
                    }
                    _ => served.push(path),
                }
            }
            let cfg = config(env, queue, &name, env.args.concurrency, &script, tool)?;
            let (wk, stores) = start_on(env, routing, cfg).await?;
            let (w2, s) = (wk.clone(), fleet.shutdown.clone());
            fleet
                .handles
                .push(tokio::spawn(async move { w2.run(s).await }));
            fleet.workers.push(wk);
            fleet.stores.extend(stores);
        }
        if fleet.served.is_some() {
            for wk in &fleet.workers {
                wk.start_mcp(MCP_START_BOUND).await;
            }
        }
        Ok(fleet)
    }

    /// Sessions the workers have completed so far.
    fn completed(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.stats().completed.load(Ordering::Relaxed))
            .sum()
    }

    /// Stop the workers (and their MCP servers) and close their pools; with the MCP tool,
    /// the calls the servers answered.
    async fn stop(self) -> Option<anyhow::Result<u64>> {
        self.shutdown.cancel();
        for h in self.handles {
            let _ = h.await;
        }
        for store in &self.stores {
            close(store).await;
        }
        let served = self.served?;
        Some(
            served
                .iter()
                .try_fold(0u64, |n, p| Ok(n.saturating_add(mcp_server::served(p)?))),
        )
    }
}

/// How many of `ids` did not end `completed` with all `iterations`, on any shard.
async fn not_completed(routing: &Routing, ids: &[String], iterations: u32) -> anyhow::Result<u64> {
    let mut ok = 0u64;
    for shard in &routing.shards {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM sessions WHERE id = ANY($1) AND status = 'completed' AND iteration = $2",
        )
        .bind(ids)
        .bind(i32::try_from(iterations)?)
        .fetch_one(shard.pool())
        .await?;
        ok = ok.saturating_add(u64::try_from(n)?);
    }
    Ok((ids.len() as u64).saturating_sub(ok))
}

/// The throughput part's workload with `tool`.
pub fn throughput_workload(env: &Env, tool: &'static str) -> Workload {
    Workload {
        part: "throughput",
        tool,
        sessions: env.args.sessions,
        iterations: env.args.iterations,
        warm_up: true,
        rounds: 1,
    }
}

/// The throughput part with the trivial tool or `list_dir` (the MCP tool's is
/// `mcp::throughput`).
pub async fn throughput(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let ran = run_workload(env, &throughput_workload(env, env.tool())).await?;
    record_throughput(r, &ran);
    Ok(())
}

/// The throughput part's figures, from its measured round(s).
pub fn record_throughput(r: &mut Results, ran: &Ran) {
    let iterations = ran.iterations;
    let rate = iterations / ran.elapsed.as_secs_f64();
    r.iterations_per_s = Some(rate);
    r.iterations_per_s_cold = ran.cold.map(|d| iterations / d.as_secs_f64());
    r.ratio_to_ceiling = r.ceiling_commits_per_s.map(|c| rate / c);
    let per_iteration = |secs: Option<f64>| secs.map(|s| s * 1000.0 / iterations);
    r.worker_cpu_ms_per_iteration = per_iteration(ran.cpu.own);
    r.postgres_cpu_ms_per_iteration = per_iteration(ran.cpu.postgres);
    r.redis_cpu_ms_per_iteration = per_iteration(ran.cpu.redis);
    r.wal_bytes_per_iteration = ran.wal_bytes.map(|b| b / iterations);
    r.throughput_failed = Some(ran.failed);
    (r.overhead_samples, r.overhead_p50_ms, r.overhead_p99_ms) = p50_p99(ran.overhead.clone());
    r.checkpoint_p50_ms = hist_quantile(&ran.checkpoint_hist, 0.5).map(|s| s * 1000.0);
    let (commits, batched) = ran.commits;
    r.checkpoint_batch_mean = (commits > 0).then(|| batched / commits as f64);
    progress(&format!(
        "throughput: {:.0} iterations/s in {:.2} s, after a warm-up round at {:.0} ({} failed); \
         {:.1} checkpoints per commit",
        rate,
        ran.elapsed.as_secs_f64(),
        r.iterations_per_s_cold.unwrap_or(0.0),
        ran.failed,
        r.checkpoint_batch_mean.unwrap_or(0.0)
    ));
}

/// Iterations of each session the overhead part runs alone.
pub const ALONE_ITERATIONS: u32 = 100;

/// Sessions the overhead part runs alone, one after the other: 1,000 samples, so that
/// the p99 is the tenth-worst iteration rather than the second-worst of 100.
pub const ALONE_ROUNDS: u32 = 10;

/// The overhead with one session alone ([`ALONE_ROUNDS`] of them, each alone), on workers
/// set up as the throughput run's: what the loop costs per iteration when nothing queues
/// ahead of it (under load, Little's law makes the per-iteration time sessions in flight /
/// throughput, whatever the loop costs).
pub async fn overhead_alone(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    // The machine's floor, measured just before, on the same servers.
    (_, r.lone_commit_p50_ms, r.lone_commit_p99_ms) =
        p50_p99(crate::ceiling::lone_commits(env).await?);
    let ran = run_workload(
        env,
        &Workload {
            part: "overhead",
            tool: env.tool(),
            sessions: 1,
            iterations: ALONE_ITERATIONS,
            warm_up: true,
            rounds: ALONE_ROUNDS,
        },
    )
    .await?;
    if ran.failed > 0 {
        bail!("overhead: the session did not complete");
    }
    (
        r.overhead_alone_samples,
        r.overhead_alone_p50_ms,
        r.overhead_alone_p99_ms,
    ) = p50_p99(ran.overhead);
    Ok(())
}

/// The number of overhead samples, and their p50 and p99 in milliseconds.
fn p50_p99(mut samples: Vec<Duration>) -> (Option<usize>, Option<f64>, Option<f64>) {
    samples.sort();
    (
        Some(samples.len()),
        quantile(&samples, 0.5).map(ms),
        quantile(&samples, 0.99).map(ms),
    )
}

/// A histogram's cumulative bucket counts: (upper bound, count).
pub type Hist = Vec<(f64, u64)>;

/// The checkpoint histogram's cumulative bucket counts.
fn checkpoint_hist() -> Hist {
    use prometheus::core::Collector;
    let m = agentq_core::metrics::global();
    m.checkpoint_duration
        .collect()
        .first()
        .and_then(|f| f.get_metric().first().cloned())
        .map(|metric| {
            metric
                .get_histogram()
                .get_bucket()
                .iter()
                .map(|b| (b.upper_bound(), b.cumulative_count()))
                .collect()
        })
        .unwrap_or_default()
}

/// The observations between two snapshots of a histogram, per bucket (cumulative).
fn hist_delta(before: &[(f64, u64)], after: &[(f64, u64)]) -> Hist {
    after
        .iter()
        .enumerate()
        .map(|(i, (ub, c))| (*ub, c.saturating_sub(before.get(i).map_or(0, |b| b.1))))
        .collect()
}

/// A quantile of a histogram's observations (cumulative counts), interpolated in its
/// bucket.
fn hist_quantile(deltas: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = deltas.last()?.1;
    if total == 0 {
        return None;
    }
    let want = q * total as f64;
    let mut lo = (0.0, 0u64);
    for &(ub, c) in deltas {
        if c as f64 >= want {
            let span = (c - lo.1) as f64;
            let frac = if span > 0.0 {
                (want - lo.1 as f64) / span
            } else {
                1.0
            };
            return Some(lo.0 + (ub - lo.0) * frac);
        }
        lo = (ub, c);
    }
    None
}
