//! `agentq bench`: how close agentq comes to what its Postgres and Redis can physically do,
//! and whether its costs grow the way DESIGN §3 claims. One process measures, in order:
//!
//! 1. `ceiling` — raw one-row durable INSERT commits/s of this Postgres, and raw
//!    XADD/XREADGROUP/XACK round trips/s of this Redis, at the workers' connection count;
//! 2. `throughput` — N sessions × K iterations (scripted provider, a trivial in-memory tool
//!    or `--tool list_dir`) on W in-process workers: iterations/s, and that over the commit
//!    ceiling;
//! 3. `overhead` — p50/p99 of the loop's own time per iteration: in the same run, and with
//!    one session alone (the worker's own cost, without queueing behind other sessions);
//! 4. `storage` — bytes stored per iteration for K = 10, 40, 160;
//! 5. `resume` — time to load a 160-iteration session and have the LLM request ready;
//! 6. `capacity` — sessions one `agentq worker` child holds with a 1 s LLM, its RSS;
//! 7. `recovery` — SIGKILL a worker child, time until another worker commits its
//!    sessions' next iteration.
//!
//! Everything it creates is named after a run id (`bench-<id>-…` queues) and removed at the
//! end. The method and the figures are in `docs/benchmarks.md`.

mod cpu;
mod fake_llm;
mod parts;
mod procs;
mod services;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};

use agentq_core::pg::PgStore;

pub const PARTS: &[&str] = &[
    "ceiling",
    "throughput",
    "overhead",
    "storage",
    "resume",
    "capacity",
    "recovery",
];

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Postgres URL (ignored with --private).
    #[arg(long, env = "AGENTQ_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Redis URL (ignored with --private).
    #[arg(long, env = "AGENTQ_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Start a private Redis and a private, durable Postgres (fsync and synchronous commit
    /// on) for the run, and remove them afterwards.
    #[arg(long)]
    pub private: bool,
    /// Sessions of the throughput run.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub sessions: u32,
    /// Iterations per session of the throughput run.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub iterations: u32,
    /// In-process workers of the throughput run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Sessions each worker runs at once (as `agentq worker --concurrency`); the ceiling
    /// uses as many Postgres connections as these workers would.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: u32,
    /// Run only these parts (comma-separated): ceiling, throughput, overhead, storage,
    /// resume, capacity, recovery.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Print the results as one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Sessions the capacity part offers one worker process.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub capacity_sessions: u32,
    /// Latency of the capacity part's fake LLM, per call.
    #[arg(long, default_value_t = 1000)]
    pub llm_latency_ms: u64,
    /// How long the capacity part measures once every session is in flight.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub capacity_secs: u64,
    /// Seconds each raw ceiling measurement runs.
    #[arg(long, default_value_t = 3.0)]
    pub ceiling_secs: f64,
    /// Group commit of the in-process workers: most checkpoints per commit (as `agentq
    /// worker --checkpoint-batch-max`; 1 turns group commit off, for comparison).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub checkpoint_batch_max: u32,
    /// Group commit: commits in flight per worker (as `agentq worker --checkpoint-writers`).
    /// With `--checkpoint-batch-max 1` and as many writers as the pool has connections,
    /// every session commits its own checkpoints: the baseline without group commit.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub checkpoint_writers: u32,
    /// The tool every turn but the last calls in the in-process parts (throughput,
    /// overhead, storage, resume): `trivial` answers at once from memory; `list_dir` is the
    /// built-in, one directory listing through tokio's blocking pool. Capacity and recovery
    /// run `agentq worker` children, which always call `list_dir`.
    #[arg(long, default_value = parts::TRIVIAL, value_parser = [parts::TRIVIAL, parts::BUILTIN])]
    pub tool: String,
}

/// Where the run happens: the services, an admin store, names and a scratch directory.
pub struct Env {
    pub db_url: String,
    pub redis_url: String,
    pub store: PgStore,
    /// Short random id; every queue, table and key of the run carries it.
    pub run: String,
    pub scratch: PathBuf,
    pub args: BenchArgs,
    pub cpu: cpu::Cpu,
    _private: Vec<services::Private>,
}

impl Env {
    pub fn queue(&self, part: &str) -> String {
        format!("bench-{}-{part}", self.run)
    }

    /// The same run against another database (a scratch one of the storage part).
    pub fn derived(&self, db_url: String, store: PgStore) -> Env {
        Env {
            db_url,
            redis_url: self.redis_url.clone(),
            store,
            run: self.run.clone(),
            scratch: self.scratch.clone(),
            args: self.args.clone(),
            cpu: self.cpu.clone(),
            _private: Vec::new(),
        }
    }
}

/// Every figure; `None` when its part did not run.
#[derive(Debug, Default)]
pub struct Results {
    pub ceiling_connections: Option<u32>,
    pub ceiling_commits_per_s: Option<f64>,
    pub ceiling_redis_roundtrips_per_s: Option<f64>,
    pub throughput_sessions: u32,
    pub throughput_iterations: u32,
    pub iterations_per_s: Option<f64>,
    /// The same workload as the first burst on fresh workers (the warm-up round).
    pub iterations_per_s_cold: Option<f64>,
    pub ratio_to_ceiling: Option<f64>,
    pub throughput_failed: Option<u64>,
    pub overhead_p50_ms: Option<f64>,
    pub overhead_p99_ms: Option<f64>,
    pub overhead_samples: Option<usize>,
    /// The same with one session alone on the workers.
    pub overhead_alone_p50_ms: Option<f64>,
    pub overhead_alone_p99_ms: Option<f64>,
    pub overhead_alone_samples: Option<usize>,
    pub checkpoint_p50_ms: Option<f64>,
    /// Checkpoints per group commit, on average, during the throughput run.
    pub checkpoint_batch_mean: Option<f64>,
    /// CPU of this process and of Postgres per ceiling commit.
    pub ceiling_cpu_ms_per_commit: Option<f64>,
    /// CPU per iteration of the throughput run: this process (the workers), Postgres,
    /// Redis.
    pub worker_cpu_ms_per_iteration: Option<f64>,
    pub postgres_cpu_ms_per_iteration: Option<f64>,
    pub redis_cpu_ms_per_iteration: Option<f64>,
    pub bytes_per_iteration: BTreeMap<u32, f64>,
    pub message_bytes_per_iteration: BTreeMap<u32, f64>,
    pub resume_ms: Option<f64>,
    pub resume_first_ms: Option<f64>,
    pub resume_messages: Option<usize>,
    pub capacity_offered: Option<u32>,
    pub capacity_sessions: Option<u64>,
    pub capacity_iterations_per_s: Option<f64>,
    pub capacity_rss_bytes: Option<u64>,
    pub recovery_s: Option<f64>,
    pub recovery_p50_s: Option<f64>,
    pub recovery_sessions: Option<usize>,
}

impl Results {
    /// What an iteration costs in CPU (all processes), counted in ceiling commits (client
    /// and Postgres): on a CPU-bound machine, `1 /` this bounds `ratio_to_ceiling`.
    pub fn iteration_cpu_in_ceiling_commits(&self) -> Option<f64> {
        let per_iteration = self.worker_cpu_ms_per_iteration?
            + self.postgres_cpu_ms_per_iteration?
            + self.redis_cpu_ms_per_iteration.unwrap_or(0.0);
        let per_commit = self.ceiling_cpu_ms_per_commit.filter(|c| *c > 0.0)?;
        Some(per_iteration / per_commit)
    }
}

pub async fn bench(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let selected = selection(&args.only)?;
    let want = |p: &str| selected.iter().any(|s| s == p);
    let mut private = Vec::new();
    let (db_url, redis_url) = if args.private {
        progress("starting a private Redis and a durable private Postgres");
        let redis = services::start_redis()?;
        let pg = services::start_postgres(800)?;
        let urls = (pg.url.clone(), redis.url.clone());
        private.push(pg);
        private.push(redis);
        urls
    } else {
        (
            args.database_url
                .clone()
                .context("--database-url (or AGENTQ_DATABASE_URL) is required, or --private")?,
            args.redis_url
                .clone()
                .context("--redis-url (or AGENTQ_REDIS_URL) is required, or --private")?,
        )
    };
    let store = PgStore::connect(&db_url, 8)
        .await
        .context("cannot connect to Postgres")?;
    store.migrate().await.context("migrating the schema")?;
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let scratch = std::env::temp_dir().join(format!("agentq-bench-{run}"));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let cpu = cpu::Cpu::discover(&store, &redis_url).await;
    let env = Env {
        db_url,
        redis_url,
        store,
        run,
        scratch,
        args: args.clone(),
        cpu,
        _private: private,
    };

    let mut r = Results {
        throughput_sessions: args.sessions,
        throughput_iterations: args.iterations,
        ..Results::default()
    };
    let outcome = run_parts(&env, &want, &mut r).await;
    progress("cleaning up");
    if let Err(e) = parts::cleanup(&env).await {
        progress(&format!("cleanup failed: {e:#}"));
    }
    let _ = std::fs::remove_dir_all(&env.scratch);
    outcome?;

    print!("{}", table(&r, &args));
    if args.json {
        println!("{}", to_json(&r, &args));
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_parts(env: &Env, want: &dyn Fn(&str) -> bool, r: &mut Results) -> anyhow::Result<()> {
    // The throughput ratio is against the ceiling measured here, so it implies the ceiling.
    if want("ceiling") || want("throughput") {
        progress("ceiling: raw Postgres commits and Redis round trips");
        parts::ceiling(env, r).await?;
    }
    if want("throughput") || want("overhead") {
        progress(&format!(
            "throughput: {} sessions x {} iterations on {} workers",
            env.args.sessions, env.args.iterations, env.args.workers
        ));
        parts::throughput(env, r).await?;
    }
    if want("overhead") {
        progress(&format!(
            "overhead: one session alone, {} iterations",
            parts::ALONE_ITERATIONS
        ));
        parts::overhead_alone(env, r).await?;
    }
    if want("storage") {
        parts::storage(env, r).await?;
    }
    if want("resume") {
        progress("resume: loading 160-iteration sessions");
        parts::resume(env, r).await?;
    }
    if want("capacity") {
        progress(&format!(
            "capacity: {} sessions, {} ms LLM latency, one worker process",
            env.args.capacity_sessions, env.args.llm_latency_ms
        ));
        procs::capacity(env, r).await?;
    }
    if want("recovery") {
        progress("recovery: SIGKILL a worker process, time until another resumes");
        procs::recovery(env, r).await?;
    }
    Ok(())
}

fn selection(only: &[String]) -> anyhow::Result<Vec<String>> {
    if only.is_empty() {
        return Ok(PARTS.iter().map(|s| s.to_string()).collect());
    }
    let mut out = Vec::new();
    for p in only {
        let p = p.trim().to_ascii_lowercase();
        if p.is_empty() {
            continue;
        }
        if !PARTS.contains(&p.as_str()) {
            bail!("--only: unknown part {p:?} (parts: {})", PARTS.join(", "));
        }
        out.push(p);
    }
    Ok(out)
}

pub fn progress(msg: &str) {
    eprintln!("agentq bench: {msg}");
}

/// The `q`-quantile (0..=1) of sorted samples, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

fn num(v: Option<f64>, digits: i32) -> Value {
    match v {
        Some(x) if x.is_finite() => json!(round(x, digits)),
        _ => Value::Null,
    }
}

fn to_json(r: &Results, args: &BenchArgs) -> Value {
    let per_k = |m: &BTreeMap<u32, f64>| -> Value {
        if m.is_empty() {
            return Value::Null;
        }
        Value::Object(
            m.iter()
                .map(|(k, v)| (k.to_string(), json!(round(*v, 1))))
                .collect(),
        )
    };
    json!({
        "tool": args.tool,
        "ceiling_connections": r.ceiling_connections,
        "ceiling_commits_per_s": num(r.ceiling_commits_per_s, 1),
        "ceiling_redis_roundtrips_per_s": num(r.ceiling_redis_roundtrips_per_s, 1),
        "iterations_per_s": num(r.iterations_per_s, 1),
        "iterations_per_s_cold": num(r.iterations_per_s_cold, 1),
        "ratio_to_ceiling": num(r.ratio_to_ceiling, 3),
        "throughput_failed_sessions": r.throughput_failed,
        "overhead_p50_ms": num(r.overhead_p50_ms, 3),
        "overhead_p99_ms": num(r.overhead_p99_ms, 3),
        "overhead_alone_p50_ms": num(r.overhead_alone_p50_ms, 3),
        "overhead_alone_p99_ms": num(r.overhead_alone_p99_ms, 3),
        "checkpoint_p50_ms": num(r.checkpoint_p50_ms, 3),
        "checkpoint_batch_mean": num(r.checkpoint_batch_mean, 1),
        "ceiling_cpu_ms_per_commit": num(r.ceiling_cpu_ms_per_commit, 4),
        "worker_cpu_ms_per_iteration": num(r.worker_cpu_ms_per_iteration, 4),
        "postgres_cpu_ms_per_iteration": num(r.postgres_cpu_ms_per_iteration, 4),
        "redis_cpu_ms_per_iteration": num(r.redis_cpu_ms_per_iteration, 4),
        "iteration_cpu_in_ceiling_commits": num(r.iteration_cpu_in_ceiling_commits(), 2),
        "bytes_per_iteration": per_k(&r.bytes_per_iteration),
        "message_bytes_per_iteration": per_k(&r.message_bytes_per_iteration),
        "resume_ms": num(r.resume_ms, 3),
        "resume_first_ms": num(r.resume_first_ms, 3),
        "capacity_sessions": r.capacity_sessions,
        "capacity_iterations_per_s": num(r.capacity_iterations_per_s, 1),
        "capacity_rss_bytes": r.capacity_rss_bytes,
        "recovery_s": num(r.recovery_s, 3),
        "recovery_p50_s": num(r.recovery_p50_s, 3),
    })
}

/// `met`/`missed` against a target.
fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

fn table(r: &Results, args: &BenchArgs) -> String {
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut row = |a: &str, b: String, c: String, d: String| {
        rows.push([a.to_string(), b, c, d]);
    };
    if let Some(c) = r.ceiling_commits_per_s {
        row(
            "ceiling",
            format!(
                "Postgres 1-row durable commits/s ({} conns)",
                r.ceiling_connections.unwrap_or(0)
            ),
            format!("{c:.0}"),
            String::new(),
        );
    }
    if let Some(c) = r.ceiling_redis_roundtrips_per_s {
        row(
            "",
            "Redis XADD/XREADGROUP/XACK round trips/s".into(),
            format!("{c:.0}"),
            String::new(),
        );
    }
    if let Some(t) = r.iterations_per_s {
        row(
            "throughput",
            format!(
                "iterations/s ({} x {}, {} workers, {})",
                r.throughput_sessions, r.throughput_iterations, args.workers, args.tool
            ),
            format!("{t:.0}"),
            String::new(),
        );
    }
    if let Some(t) = r.iterations_per_s_cold {
        row(
            "",
            "the same, as fresh workers' first burst (warm-up round)".into(),
            format!("{t:.0}"),
            String::new(),
        );
    }
    if let Some(x) = r.ratio_to_ceiling {
        row(
            "",
            "iterations/s over commit ceiling".into(),
            format!("{x:.2}"),
            format!(">= 0.5 {}", verdict(x >= 0.5)),
        );
    }
    if let (Some(w), Some(p)) = (
        r.worker_cpu_ms_per_iteration,
        r.postgres_cpu_ms_per_iteration,
    ) {
        row(
            "",
            "CPU per iteration: workers + Postgres + Redis".into(),
            format!(
                "{w:.3} + {p:.3} + {:.3} ms",
                r.redis_cpu_ms_per_iteration.unwrap_or(0.0)
            ),
            String::new(),
        );
    }
    if let (Some(n), Some(c)) = (
        r.iteration_cpu_in_ceiling_commits(),
        r.ceiling_cpu_ms_per_commit,
    ) {
        row(
            "",
            format!("that in ceiling commits ({c:.3} ms of CPU each)"),
            format!("{n:.2}"),
            String::new(),
        );
    }
    if let (Some(p50), Some(p99)) = (r.overhead_p50_ms, r.overhead_p99_ms) {
        row(
            "overhead",
            format!(
                "per iteration p50 / p99, {} in flight ({} samples)",
                r.throughput_sessions,
                r.overhead_samples.unwrap_or(0)
            ),
            format!("{p50:.2} / {p99:.2} ms"),
            format!("< 2 / < 10 ms {}", verdict(p50 < 2.0 && p99 < 10.0)),
        );
    }
    if let (Some(p50), Some(p99)) = (r.overhead_alone_p50_ms, r.overhead_alone_p99_ms) {
        row(
            "",
            format!(
                "the same, one session alone ({} samples)",
                r.overhead_alone_samples.unwrap_or(0)
            ),
            format!("{p50:.2} / {p99:.2} ms"),
            format!("< 2 / < 10 ms {}", verdict(p50 < 2.0 && p99 < 10.0)),
        );
    }
    if !r.bytes_per_iteration.is_empty() {
        let vals: Vec<String> = r
            .bytes_per_iteration
            .iter()
            .map(|(k, v)| format!("K={k}: {v:.0}"))
            .collect();
        let max = r
            .bytes_per_iteration
            .values()
            .cloned()
            .fold(f64::MIN, f64::max);
        let min = r
            .bytes_per_iteration
            .values()
            .cloned()
            .fold(f64::MAX, f64::min);
        let flat = max <= 1.5 * min;
        let within = r.bytes_per_iteration.iter().all(|(k, v)| {
            r.message_bytes_per_iteration
                .get(k)
                .is_some_and(|m| *v <= 2.0 * m)
        });
        row(
            "storage",
            "bytes stored per iteration".into(),
            vals.join(", "),
            format!("flat {}, <= 2x msgs {}", verdict(flat), verdict(within)),
        );
        let msgs: Vec<String> = r
            .message_bytes_per_iteration
            .iter()
            .map(|(k, v)| format!("K={k}: {v:.0}"))
            .collect();
        row(
            "",
            "message bytes per iteration (JSON)".into(),
            msgs.join(", "),
            String::new(),
        );
    }
    if let Some(x) = r.resume_ms {
        row(
            "resume",
            format!(
                "load {}-message session, request ready (p50)",
                r.resume_messages.unwrap_or(0)
            ),
            format!("{x:.2} ms"),
            format!("< 20 ms {}", verdict(x < 20.0)),
        );
    }
    if let Some(x) = r.resume_first_ms {
        row(
            "",
            "first load on a fresh connection".into(),
            format!("{x:.2} ms"),
            String::new(),
        );
    }
    if let Some(n) = r.capacity_sessions {
        let rss = r.capacity_rss_bytes.unwrap_or(0);
        row(
            "capacity",
            format!(
                "sessions in flight, one worker ({} offered, {} ms LLM)",
                r.capacity_offered.unwrap_or(0),
                args.llm_latency_ms
            ),
            n.to_string(),
            format!(
                ">= 5000 under 1 GiB {}",
                verdict(n >= 5000 && rss < 1 << 30)
            ),
        );
        row(
            "",
            "iterations/s at that load".into(),
            format!("{:.0}", r.capacity_iterations_per_s.unwrap_or(0.0)),
            String::new(),
        );
        row(
            "",
            "worker peak RSS (VmHWM)".into(),
            format!("{:.0} MiB", rss as f64 / (1u64 << 20) as f64),
            String::new(),
        );
    }
    if let Some(x) = r.recovery_s {
        row(
            "recovery",
            format!(
                "SIGKILL to next iteration elsewhere, max of {} (p50 {:.2} s)",
                r.recovery_sessions.unwrap_or(0),
                r.recovery_p50_s.unwrap_or(0.0)
            ),
            format!("{x:.2} s"),
            format!("< 10 s {}", verdict(x < 10.0)),
        );
    }
    let mut w = [4usize; 4];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let header = ["part", "figure", "value", "target"];
    let line = |cells: [&str; 4], out: &mut String| {
        out.push_str(&format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {}\n",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2]
        ));
    };
    line(header, &mut out);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3]], &mut out);
    }
    out
}
