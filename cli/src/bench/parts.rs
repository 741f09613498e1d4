//! The in-process parts: the raw ceilings, the scripted workload (throughput, overhead,
//! storage), resume, and the clean-up of everything a run created.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::provider::scripted::{Script, ScriptedCall, Turn};
use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::Step;
use agentq_agent::tools::{
    SideEffect, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry, ToolSettings,
    builtin_registry,
};
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{Claim, EnqueueReason, LeaseStore, NewSession, Queue, SessionStore, WorkQueue};
use agentq_worker::{Worker, WorkerConfig};

use super::cpu::Sample;
use super::fake_llm::{FINAL_TEXT, TURN_TEXT};
use super::{Env, Results, ms, progress, quantile};

/// The tool the in-process parts call every iteration unless `--tool` names another: it
/// returns at once and touches nothing, so that the figures are agentq's own costs. It is
/// registered through `WorkerConfig::tools`, as an embedding program's tool would be.
pub const TRIVIAL: &str = "trivial";
/// The tool of the parts that run `agentq worker` children, which have only the built-in
/// tools (and of the in-process parts with `--tool list_dir`): one directory listing through
/// tokio's blocking pool.
pub const BUILTIN: &str = "list_dir";
const PROMPT: &str = "Look at the workspace and tell me what is in it.";

struct Trivial;

#[async_trait::async_trait]
impl Tool for Trivial {
    fn name(&self) -> &str {
        TRIVIAL
    }
    fn description(&self) -> &str {
        "List a directory of the workspace (answers at once: the workspace is empty)."
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}})
    }
    fn side_effect(&self, _args: &serde_json::Value) -> SideEffect {
        SideEffect::Pure
    }
    async fn call(
        &self,
        args: serde_json::Value,
        _ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        // What `list_dir` says of an empty workspace, so that messages weigh the same.
        let path = args.get("path").and_then(|p| p.as_str()).unwrap_or(".");
        Ok(ToolOutput::ok(format!("{path}: (empty directory)")))
    }
}

/// The built-in tools and the trivial one.
pub fn tools() -> ToolRegistry {
    let mut all = builtin_registry(&ToolSettings::default());
    all.register(Arc::new(Trivial));
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

pub fn spec(iterations: u32, tool: &str) -> SessionSpec {
    let mut spec = SessionSpec::new(PROMPT);
    spec.tools = Some(vec![tool.into()]);
    spec.max_iterations = iterations + 5;
    // The whole history goes to the model (the scripted model picks its turn by counting
    // the assistant turns it is sent).
    spec.history_window = spec.history_window.max(2 * iterations as usize + 10);
    spec
}

/// Create `n` sessions on `queue` (not enqueued). Returns their ids.
pub async fn create_sessions(
    env: &Env,
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
        let rows = env.store.create_sessions(chunk).await?;
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

/// A worker as `agentq worker` would configure it, on its own pool and Redis connection.
pub async fn worker(
    env: &Env,
    queue: &str,
    name: &str,
    concurrency: u32,
    script: &str,
    tool: &str,
) -> anyhow::Result<Worker> {
    let mut cfg = WorkerConfig {
        consumer: format!("bench-{}-{name}", env.run),
        queues: vec![queue.to_string()],
        concurrency: concurrency as usize,
        workspace_root: env.scratch.join("workspaces"),
        default_provider: "scripted".into(),
        default_tools: vec![tool.into()],
        event_ttl: Duration::from_secs(60),
        checkpoint_batch_max: env.args.checkpoint_batch_max as usize,
        checkpoint_writers: env.args.checkpoint_writers as usize,
        ..WorkerConfig::default()
    };
    cfg.providers.script = Some(script.to_string());
    if tool == TRIVIAL {
        cfg.tools.register(Arc::new(Trivial));
    }
    let store = PgStore::connect_for_worker(
        &env.db_url,
        cfg.pool_connections(),
        cfg.writer_connections(),
    )
    .await?;
    store.open_all().await?;
    let redis = RedisQueue::connect(&env.redis_url).await?;
    Ok(Worker::new(Arc::new(store), Arc::new(redis), cfg))
}

pub struct Workload {
    pub part: &'static str,
    pub sessions: u32,
    pub iterations: u32,
    /// Run the same workload once on the same workers before the measured one.
    pub warm_up: bool,
}

pub struct Ran {
    pub elapsed: Duration,
    pub ids: Vec<String>,
    pub overhead: Vec<Duration>,
    /// Sessions that did not end `completed` with every iteration.
    pub failed: u64,
    /// CPU spent from the enqueue to the last completion.
    pub cpu: Sample,
    /// The warm-up round's time from the enqueue to the last completion: the workload as
    /// the first burst on fresh workers runs it.
    pub cold: Option<Duration>,
    /// The checkpoint latency histogram before and after the measured round.
    pub checkpoint_hist: (Hist, Hist),
    /// Group commits in the measured round, and the checkpoints they carried.
    pub commits: (u64, f64),
}

/// N sessions × K iterations on W in-process workers, timed from the enqueue to the last
/// completion. The workers are up and idle before the clock starts; with `warm_up`, they
/// have also run the same workload once, so that the figure is the rate of workers in
/// service rather than of their first burst, which opens every pooled Postgres connection
/// (a fork, then each backend's catalog caches and each statement's preparation).
pub async fn run_workload(env: &Env, w: &Workload) -> anyhow::Result<Ran> {
    let queue = env.queue(w.part);
    let tool = env.args.tool.as_str();
    let script = script(w.iterations, 0, tool);
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    let mut handles = Vec::new();
    for i in 0..env.args.workers {
        let wk = worker(
            env,
            &queue,
            &format!("{}-{i}", w.part),
            env.args.concurrency,
            &script,
            tool,
        )
        .await?;
        let (w2, s) = (wk.clone(), shutdown.clone());
        handles.push(tokio::spawn(async move { w2.run(s).await }));
        workers.push(wk);
    }
    let redis = RedisQueue::connect(&env.redis_url).await?;
    redis.ensure_queue(&queue).await?;
    let done = || -> u64 {
        workers
            .iter()
            .map(|w| w.stats().completed.load(Ordering::Relaxed))
            .sum()
    };
    let round = async |ids: &[String]| -> anyhow::Result<Duration> {
        let total = done() + ids.len() as u64;
        let started = Instant::now();
        enqueue(&redis, &queue, ids).await?;
        let deadline = started + Duration::from_secs(600);
        while done() < total {
            if Instant::now() > deadline {
                bail!(
                    "{}: only {} of {} sessions finished in 600 s",
                    w.part,
                    done(),
                    ids.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(started.elapsed())
    };
    let measured = async {
        let mut cold = None;
        let mut all = Vec::new();
        if w.warm_up {
            all = create_sessions(env, &queue, w.sessions, w.iterations, tool).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            cold = Some(round(&all).await?);
        }
        let ids = create_sessions(env, &queue, w.sessions, w.iterations, tool).await?;
        all.extend(ids.iter().cloned());
        // Let the workers reach their first (next) XREADGROUP.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let batches = &agentq_core::metrics::global().checkpoint_batch_size;
        let batches_before = (batches.get_sample_count(), batches.get_sample_sum());
        let hist_before = checkpoint_hist();
        let tap = agentq_worker::overhead_tap();
        tap.start();
        let cpu_before = env.cpu.sample().await;
        let elapsed = round(&ids).await;
        let overhead = tap.stop();
        let cpu = env.cpu.sample().await.since(&cpu_before);
        let commits = (
            batches.get_sample_count().saturating_sub(batches_before.0),
            batches.get_sample_sum() - batches_before.1,
        );
        let hist = (hist_before, checkpoint_hist());
        anyhow::Ok((ids, all, elapsed?, overhead, cpu, cold, hist, commits))
    }
    .await;
    shutdown.cancel();
    for h in handles {
        let _ = h.await;
    }
    let (ids, all, elapsed, overhead, cpu, cold, checkpoint_hist, commits) = measured?;
    let (ok,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM sessions WHERE id = ANY($1) AND status = 'completed' AND iteration = $2",
    )
    .bind(&all)
    .bind(i32::try_from(w.iterations)?)
    .fetch_one(env.store.pool())
    .await?;
    Ok(Ran {
        elapsed,
        failed: (all.len() as u64).saturating_sub(u64::try_from(ok)?),
        ids,
        overhead,
        cpu,
        cold,
        checkpoint_hist,
        commits,
    })
}

pub async fn ceiling(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let conns = env.args.workers * agentq_worker::pool_connections(env.args.concurrency as usize);
    let secs = Duration::from_secs_f64(env.args.ceiling_secs.clamp(0.5, 600.0));
    r.ceiling_connections = Some(conns);
    let pg = pg_ceiling(env, conns, secs).await?;
    r.ceiling_commits_per_s = Some(pg.rate);
    r.ceiling_cpu_ms_per_commit = pg.cpu_ms_per_op(|s| Some(s.own? + s.postgres?));
    r.ceiling_redis_roundtrips_per_s = Some(redis_ceiling(env, conns, secs).await?.rate);
    Ok(())
}

/// What `measure` saw between its warm-up and the end.
struct Measured {
    rate: f64,
    ops: u64,
    cpu: Sample,
}

impl Measured {
    /// Milliseconds of CPU (as `pick` adds it up) per counted operation.
    fn cpu_ms_per_op(&self, pick: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        if self.ops == 0 {
            return None;
        }
        Some(pick(&self.cpu)? * 1000.0 / self.ops as f64)
    }
}

/// Rate of counted operations between a warm-up and the end, over `tasks` loops.
async fn measure<F, Fut>(env: &Env, tasks: u32, secs: Duration, make: F) -> anyhow::Result<Measured>
where
    F: Fn(u32, Arc<AtomicU64>, Instant) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let count = Arc::new(AtomicU64::new(0));
    let warm = Duration::from_millis(500);
    let start = Instant::now();
    let end = start + warm + secs;
    let mut hs = Vec::new();
    for i in 0..tasks {
        hs.push(tokio::spawn(make(i, count.clone(), end)));
    }
    tokio::time::sleep_until((start + warm).into()).await;
    let cpu0 = env.cpu.sample().await;
    let c0 = count.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep_until(end.into()).await;
    let c1 = count.load(Ordering::Relaxed);
    let dt = t0.elapsed();
    let cpu = env.cpu.sample().await.since(&cpu0);
    for h in hs {
        h.await??;
    }
    Ok(Measured {
        rate: (c1 - c0) as f64 / dt.as_secs_f64(),
        ops: c1 - c0,
        cpu,
    })
}

/// One-row INSERTs, each its own durable commit, on `conns` connections at once.
async fn pg_ceiling(env: &Env, conns: u32, secs: Duration) -> anyhow::Result<Measured> {
    let pool = PgPoolOptions::new()
        .max_connections(conns)
        .min_connections(conns)
        .connect(&env.db_url)
        .await?;
    let table = format!("agentq_bench_ceiling_{}", env.run);
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, k text NOT NULL, v text NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    let sql: Arc<str> = Arc::from(format!("INSERT INTO {table} (k, v) VALUES ($1, $2)"));
    // A row about the size of one message.
    let value: Arc<str> = Arc::from(TURN_TEXT.repeat(2));
    let measured = measure(env, conns, secs, |i, count, end| {
        let pool = pool.clone();
        let value = value.clone();
        let sql = sql.clone();
        async move {
            let mut conn = pool.acquire().await?;
            let key = format!("task-{i}");
            while Instant::now() < end {
                sqlx::query(&sql)
                    .bind(&key)
                    .bind(&*value)
                    .execute(&mut *conn)
                    .await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .await?;
    pool.close().await;
    Ok(measured)
}

/// XADD, XREADGROUP (one entry), XACK in a loop; each command is one round trip. One
/// multiplexed connection per worker, as the workers have, shared by the loops.
async fn redis_ceiling(env: &Env, tasks: u32, secs: Duration) -> anyhow::Result<Measured> {
    let client = redis::Client::open(env.redis_url.as_str())?;
    let mut conns = Vec::new();
    for _ in 0..env.args.workers.max(1) {
        conns.push(client.get_multiplexed_async_connection().await?);
    }
    let prefix = format!("agentq:bench:{}:ceiling", env.run);
    for i in 0..tasks {
        let mut c = conns[i as usize % conns.len()].clone();
        let _: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(format!("{prefix}:{i}"))
            .arg("g")
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
    }
    let measured = measure(env, tasks, secs, |i, count, end| {
        let mut c = conns[i as usize % conns.len()].clone();
        let key = format!("{prefix}:{i}");
        async move {
            while Instant::now() < end {
                let _: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(1000)
                    .arg("*")
                    .arg("session")
                    .arg("0194f0b2-7d6c-7c4e-9d7a-3f1e2a4b5c6d")
                    .query_async(&mut c)
                    .await?;
                let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg("g")
                    .arg("c")
                    .arg("COUNT")
                    .arg(1)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">")
                    .query_async(&mut c)
                    .await?;
                let ids: Vec<String> = reply
                    .keys
                    .into_iter()
                    .flat_map(|k| k.ids.into_iter().map(|e| e.id))
                    .collect();
                let _: i64 = redis::cmd("XACK")
                    .arg(&key)
                    .arg("g")
                    .arg(&ids)
                    .query_async(&mut c)
                    .await?;
                count.fetch_add(3, Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .await?;
    Ok(measured)
}

pub async fn throughput(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let ran = run_workload(
        env,
        &Workload {
            part: "throughput",
            sessions: env.args.sessions,
            iterations: env.args.iterations,
            warm_up: true,
        },
    )
    .await?;
    let iterations = f64::from(env.args.sessions) * f64::from(env.args.iterations);
    let rate = iterations / ran.elapsed.as_secs_f64();
    r.iterations_per_s = Some(rate);
    r.iterations_per_s_cold = ran.cold.map(|d| iterations / d.as_secs_f64());
    r.ratio_to_ceiling = r.ceiling_commits_per_s.map(|c| rate / c);
    let per_iteration = |secs: Option<f64>| secs.map(|s| s * 1000.0 / iterations);
    r.worker_cpu_ms_per_iteration = per_iteration(ran.cpu.own);
    r.postgres_cpu_ms_per_iteration = per_iteration(ran.cpu.postgres);
    r.redis_cpu_ms_per_iteration = per_iteration(ran.cpu.redis);
    r.throughput_failed = Some(ran.failed);
    (r.overhead_samples, r.overhead_p50_ms, r.overhead_p99_ms) = p50_p99(ran.overhead);
    let (before, after) = &ran.checkpoint_hist;
    r.checkpoint_p50_ms = hist_quantile(before, after, 0.5).map(|s| s * 1000.0);
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
    Ok(())
}

/// Iterations of the session the overhead part runs alone.
pub const ALONE_ITERATIONS: u32 = 100;

/// The overhead with one session alone, on workers set up as the throughput run's: what
/// the loop costs per iteration when nothing queues ahead of it (under load, Little's law
/// makes the per-iteration time sessions in flight / throughput, whatever the loop costs).
pub async fn overhead_alone(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let ran = run_workload(
        env,
        &Workload {
            part: "overhead",
            sessions: 1,
            iterations: ALONE_ITERATIONS,
            warm_up: true,
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

/// A quantile of the observations between two snapshots, interpolated in its bucket.
fn hist_quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> Option<f64> {
    let deltas: Vec<(f64, u64)> = after
        .iter()
        .enumerate()
        .map(|(i, (ub, c))| (*ub, c - before.get(i).map_or(0, |b| b.1)))
        .collect();
    let total = deltas.last()?.1;
    if total == 0 {
        return None;
    }
    let want = q * total as f64;
    let mut lo = (0.0, 0u64);
    for (ub, c) in deltas {
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

/// What autovacuum would do: trailing pages that concurrent inserts pre-allocated but
/// never filled are given back, dead row versions become reusable space.
async fn vacuum(env: &Env) -> anyhow::Result<()> {
    sqlx::query("VACUUM sessions, session_specs, messages")
        .execute(env.store.pool())
        .await?;
    Ok(())
}

/// Sizes of what sessions are stored in: heap, indexes, TOAST (with its index) — in that
/// order, for `sessions` with `session_specs`, then `messages`.
async fn stored_bytes(env: &Env) -> anyhow::Result<[i64; 6]> {
    let row: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "WITH t(name, grp) AS (VALUES ('sessions', 0), ('session_specs', 0), ('messages', 1)), \
              z AS (SELECT grp, pg_relation_size(name::regclass) AS heap, \
                           pg_indexes_size(name::regclass) AS idx, \
                           pg_total_relation_size(name::regclass) AS total FROM t) \
         SELECT sum(heap) FILTER (WHERE grp = 0)::bigint, sum(idx) FILTER (WHERE grp = 0)::bigint, \
                sum(total - heap - idx) FILTER (WHERE grp = 0)::bigint, \
                sum(heap) FILTER (WHERE grp = 1)::bigint, sum(idx) FILTER (WHERE grp = 1)::bigint, \
                sum(total - heap - idx) FILTER (WHERE grp = 1)::bigint FROM z",
    )
    .fetch_one(env.store.pool())
    .await?;
    Ok([row.0, row.1, row.2, row.3, row.4, row.5])
}

/// `url` with its database name replaced by `db`.
fn with_database(url: &str, db: &str) -> Option<String> {
    let scheme = url.find("://")? + 3;
    let slash = url[scheme..].find('/').map(|i| scheme + i);
    let query = url.find('?');
    Some(match (slash, query) {
        (Some(s), Some(q)) if q > s => format!("{}/{db}{}", &url[..s], &url[q..]),
        (Some(s), _) => format!("{}/{db}", &url[..s]),
        (None, Some(q)) => format!("{}/{db}{}", &url[..q], &url[q..]),
        (None, None) => format!("{url}/{db}"),
    })
}

/// A database of its own for one storage run, so that no run reuses the free space another
/// left (pages pre-allocated by concurrent inserts, then recorded as free by VACUUM).
/// `None` when this role may not create databases: the run then shares the main one.
async fn scratch_database(env: &Env, name: &str) -> Option<(Env, String)> {
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(env.store.pool())
        .await
        .map_err(|e| {
            progress(&format!(
                "storage: cannot create a database ({e}); measuring in the main one"
            ))
        })
        .ok()?;
    let url = with_database(&env.db_url, name)?;
    let store = PgStore::connect(&url, 8).await.ok()?;
    store.migrate().await.ok()?;
    Some((env.derived(url, store), name.to_string()))
}

/// Bytes per iteration for K = 10, 40, 160, each in a fresh database when allowed.
pub async fn storage(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    // The same number of iterations for each K (50 × 160 by default): every run then
    // leaves the same fixed slack (each connection's half-filled insert page), which would
    // otherwise weigh more on the short runs.
    let base = env.args.sessions.min(50);
    for (k, part) in [(10, "storage10"), (40, "storage40"), (160, "storage160")] {
        let n = base * 160 / k;
        progress(&format!("storage: {n} sessions of {k} iterations"));
        let scratch = scratch_database(env, &format!("agentq_bench_{}_{part}", env.run)).await;
        let target = scratch.as_ref().map_or(env, |(e, _)| e);
        let measured = storage_run(target, r, k, n, part).await;
        if let Some((e, name)) = scratch {
            e.store.pool().close().await;
            drop(e);
            // The workers' pools are gone; FORCE ends any connection still closing.
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(env.store.pool())
                .await;
        }
        measured?;
    }
    Ok(())
}

async fn storage_run(
    env: &Env,
    r: &mut Results,
    k: u32,
    n: u32,
    part: &'static str,
) -> anyhow::Result<()> {
    vacuum(env).await?;
    let before = stored_bytes(env).await?;
    let ran = run_workload(
        env,
        &Workload {
            part,
            sessions: n,
            iterations: k,
            warm_up: false,
        },
    )
    .await?;
    vacuum(env).await?;
    let after = stored_bytes(env).await?;
    if ran.failed > 0 {
        bail!(
            "storage: {} of {n} sessions of {k} iterations did not complete",
            ran.failed
        );
    }
    // Every history starts with the prompt, which a session created since migration 0005
    // keeps only in its spec: it counts as a message all the same.
    let (stored, implicit): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(octet_length(m.body::text)), 0) \
                 FROM sessions s JOIN messages m \
                   ON m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
                 WHERE s.queue = $1)::bigint, \
                (SELECT count(*) FROM sessions s WHERE s.queue = $1 AND NOT EXISTS \
                   (SELECT 1 FROM messages m WHERE m.root_id = s.root_id::uuid \
                      AND m.session_id = s.id::uuid AND m.seq = 0))::bigint",
    )
    .bind(env.queue(part))
    .fetch_one(env.store.pool())
    .await?;
    let msg = stored + implicit * serde_json::to_string(&Message::user(PROMPT))?.len() as i64;
    let iters = f64::from(n) * f64::from(k);
    let d: Vec<f64> = after
        .iter()
        .zip(before.iter())
        .map(|(a, b)| (a - b) as f64 / iters)
        .collect();
    progress(&format!(
        "storage: K={k}: per iteration sessions heap {:.0} + indexes {:.0} + toast {:.0}, \
         messages heap {:.0} + indexes {:.0} + toast {:.0}; message JSON {:.0}",
        d[0],
        d[1],
        d[2],
        d[3],
        d[4],
        d[5],
        msg as f64 / iters
    ));
    r.bytes_per_iteration.insert(k, d.iter().sum());
    r.message_bytes_per_iteration.insert(k, msg as f64 / iters);
    Ok(())
}

/// Load a 160-iteration session on a fresh store and have its LLM request ready: the
/// claim (row + history), the state, the request, and its OpenAI body.
pub async fn resume(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let ran = run_workload(
        env,
        &Workload {
            part: "resume",
            sessions: env.args.sessions.min(20),
            iterations: 160,
            warm_up: false,
        },
    )
    .await?;
    let ids = ran.ids;
    // Make them resumable mid-way: drop the final answer, back to running at iteration 159.
    sqlx::query(
        "DELETE FROM messages m USING sessions s \
         WHERE s.id = ANY($1) AND m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
           AND m.seq = (SELECT max(seq) FROM messages x \
                        WHERE x.root_id = m.root_id AND x.session_id = m.session_id)",
    )
    .bind(&ids)
    .execute(env.store.pool())
    .await?;
    sqlx::query(
        "UPDATE sessions SET status = 'queued', finish_reason = NULL, result = NULL, \
             error = NULL, finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL, \
             iteration = iteration - 1, history_len = history_len - 1, attempts = 0 \
         WHERE id = ANY($1)",
    )
    .bind(&ids)
    .execute(env.store.pool())
    .await?;

    let store = PgStore::connect(&env.db_url, 2).await?;
    store.ping().await?;
    let specs = tools()
        .select(std::slice::from_ref(&env.args.tool))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .specs();
    let openai = OpenAiProvider::new(OpenAiConfig {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: None,
        ..OpenAiConfig::from_env()
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut times = Vec::new();
    let mut first = None;
    let mut messages = 0;
    for id in &ids {
        let t = Instant::now();
        let claim = store
            .claim(
                id,
                &format!("bench-{}-resume", env.run),
                Duration::from_secs(60),
                100,
            )
            .await?;
        let Claim::Acquired { mut state, .. } = claim else {
            bail!("resume: session {id} could not be claimed: {claim:?}");
        };
        state.normalize();
        let step = state.next_step(chrono::Utc::now());
        if !matches!(step, Step::CallLlm) {
            bail!(
                "resume: session {id} is not about to call the LLM ({step:?}, {} messages, iteration {})",
                state.messages.len(),
                state.iteration
            );
        }
        let request = state.request("gpt-4o-mini", &specs);
        let body = serde_json::to_vec(&openai.request_body(&request))?;
        let d = t.elapsed();
        std::hint::black_box(body);
        messages = state.messages.len();
        first.get_or_insert(d);
        times.push(d);
    }
    times.sort();
    r.resume_ms = quantile(&times, 0.5).map(ms);
    r.resume_first_ms = first.map(ms);
    r.resume_messages = Some(messages);
    Ok(())
}

/// Remove every row, table and key of this run.
pub async fn cleanup(env: &Env) -> anyhow::Result<()> {
    let pattern = format!("bench-{}-%", env.run);
    let ids: Vec<(String,)> = sqlx::query_as("SELECT id FROM sessions WHERE queue LIKE $1")
        .bind(&pattern)
        .fetch_all(env.store.pool())
        .await?;
    let client = redis::Client::open(env.redis_url.as_str())?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis for the clean-up")?;
    for chunk in ids.chunks(500) {
        let keys: Vec<String> = chunk
            .iter()
            .map(|(id,)| agentq_core::queue::events_stream(id))
            .collect();
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
    }
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*bench*{}*", env.run))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // Messages have no foreign key to cascade from: delete them with their sessions.
    sqlx::query(
        "WITH s AS (DELETE FROM sessions WHERE queue LIKE $1 RETURNING root_id, id) \
         DELETE FROM messages m USING s \
         WHERE m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid",
    )
    .bind(&pattern)
    .execute(env.store.pool())
    .await?;
    sqlx::query(&format!(
        "DROP TABLE IF EXISTS agentq_bench_ceiling_{}",
        env.run
    ))
    .execute(env.store.pool())
    .await?;
    Ok(())
}
