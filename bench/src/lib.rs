//! `agentq bench`: how close agentq comes to what its Postgres and Redis can physically do,
//! and whether its costs are what a checkpoint per iteration should cost: a commit each,
//! storage that does not grow with a session's length, bounded resumes. One process
//! measures, in order:
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
//!    sessions' next iteration;
//! 8. `isolation` — bystander sessions' iterations/s alone and beside hostile sessions
//!    (NUL in model output, an edit bomb, huge outputs, a spinning loop, a huge timeout)
//!    on the same workers, and what became of the hostile sessions;
//! 9. `admission` — `agentq worker` children against a fake endpoint that enforces a
//!    rate limit: iterations/s under a configured limit over the limit, the share of
//!    requests refused, the limiter's Redis calls per LLM call, and throughput with a
//!    non-binding limit over none.
//! 10. `workspace` — time to have a tree's committed files on disk at a claim, for a
//!     workspace of 1,000 files and 50 MB: cold (empty cache) and warm (cache as committed).
//!
//! Everything it creates is named after a run id (`bench-<id>-…` queues) and removed at the
//! end. The method and the figures are in `docs/benchmarks.md`.
//!
//! The crate is a library so that `agentq bench` stays a subcommand of the one `agentq`
//! binary: [`run`] with the [`BenchArgs`] clap parsed. The capacity and recovery parts run
//! that binary as `agentq worker` children ([`BenchArgs::agentq_binary`]).

mod ab;
mod admission;
mod ceiling;
mod cleanup;
mod cpu;
mod hostile;
mod isolation;
mod llm;
mod pools;
mod procs;
mod report;
mod resume;
mod storage;
mod turns;
mod workload;
mod workspace;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use agentq_core::pg::PgStore;
use agentq_fixtures::{Durability, PostgresOptions, PostgresServer, RedisServer};

pub use report::Results;
use turns::{BUILTIN, TRIVIAL};

pub const PARTS: &[&str] = &[
    "ceiling",
    "throughput",
    "overhead",
    "storage",
    "resume",
    "capacity",
    "recovery",
    "isolation",
    "admission",
    "workspace",
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
    /// resume, capacity, recovery, isolation, admission, workspace.
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
    #[arg(long, default_value = TRIVIAL, value_parser = [TRIVIAL, BUILTIN])]
    pub tool: String,
    /// The isolation part's hostile kinds (comma-separated; all when not given): nul
    /// (NUL characters in the model's text), edit_bomb (write_file 16 KiB, then edit_file
    /// replace_all expanding it 1 000 times, twice), big_output (write_file, read_file and
    /// an answer of --hostile-bytes each), spin (a tool call every turn until the
    /// iteration limit), huge_timeout (a timeout_secs no clock can add).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(hostile::NAMES))]
    pub hostile: Vec<String>,
    /// The isolation part's hostile sessions, in percent of all its sessions (the
    /// bystanders are --sessions).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=90))]
    pub hostile_percent: u32,
    /// The size of each big_output session's file, and of its answer.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub hostile_bytes: u64,
    /// How long the isolation part waits for a round's bystanders to end; past it, those
    /// still going count as failed.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub isolation_deadline_secs: u64,
    /// The admission part's configured limit (and the fake endpoint's own), in requests
    /// per minute.
    #[arg(long, default_value_t = 1200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub admission_rpm: u64,
    /// Sessions of each admission round (one worker process runs them all at once).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub admission_sessions: u32,
    /// How long each of the three admission rounds measures.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub admission_secs: u64,
    /// Files of the workspace part's tree.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub workspace_files: u32,
    /// Megabytes (10^6 bytes) of the workspace part's tree, spread evenly over its files.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub workspace_mb: u64,
    /// Another `agentq` binary (a path, or a name on PATH) to measure this one against: the
    /// same parts run with each, alternately, each on a fresh database of the same servers,
    /// and every figure is reported as this / other with its spread across pairs.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Alternating pairs of runs of an A/B sitting (`--baseline`).
    #[arg(long, default_value_t = 6, requires = "baseline", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub pairs: u32,
    /// The `agentq` binary the capacity and recovery parts run as `agentq worker`
    /// children. Not a flag: `None` is this process's own executable, which is that binary
    /// when the bench runs as `agentq bench`; a program that embeds the bench (its tests)
    /// names the binary here.
    #[arg(skip)]
    pub agentq_binary: Option<PathBuf>,
}

/// Where the run happens: the services, an admin store, names and a scratch directory.
pub(crate) struct Env {
    pub db_url: String,
    pub redis_url: String,
    pub store: PgStore,
    /// Short random id; every queue, table and key of the run carries it.
    pub run: String,
    pub scratch: PathBuf,
    pub args: BenchArgs,
    pub cpu: cpu::Cpu,
    /// How many connections each in-process worker's pool holds.
    pub pools: pools::Pools,
    _private: Option<Private>,
}

/// The servers of `--private`, stopped (and their files removed) when dropped.
struct Private {
    _postgres: PostgresServer,
    _redis: RedisServer,
}

/// Settings of the `--private` Postgres: the production durability settings, since the
/// bench measures what durable commits cost, and room for every pool of a large run.
fn private_postgres() -> PostgresOptions {
    PostgresOptions {
        durability: Durability::Durable,
        max_connections: 800,
        shared_buffers_mb: 256,
    }
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
            pools: self.pools,
            _private: None,
        }
    }
}

/// Run the parts `args` select and print their figures (a table, and with `--json` one
/// JSON object on the last line). Progress goes to stderr.
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let selected = selection(&args.only)?;
    if args.baseline.is_some() {
        // The children get what followed `bench` on this command line.
        let argv: Vec<_> = std::env::args_os()
            .skip_while(|a| a != "bench")
            .skip(1)
            .collect();
        return ab::compare(&args, &argv).await;
    }
    let want = |p: &str| selected.iter().any(|s| s == p);
    let (db_url, redis_url, private) = services(&args)?;
    let store = PgStore::connect(&db_url, pools::ADMIN_CONNECTIONS)
        .await
        .context("cannot connect to Postgres")?;
    store.migrate().await.context("migrating the schema")?;
    let pools = pools::Pools::plan(&store, &args, &selected).await?;
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
        pools,
        _private: private,
    };

    let mut r = Results {
        throughput_sessions: args.sessions,
        throughput_iterations: args.iterations,
        ..Results::default()
    };
    let outcome = run_parts(&env, &want, &mut r).await;
    progress("cleaning up");
    if let Err(e) = cleanup::cleanup(&env).await {
        progress(&format!("cleanup failed: {e:#}"));
    }
    let _ = std::fs::remove_dir_all(&env.scratch);
    outcome?;

    print!("{}", report::table(&r, &args));
    if args.json {
        println!("{}", report::to_json(&r, &args));
    }
    // A bystander that a hostile session brought down is what the isolation part exists
    // to catch: the run fails, after its figures are out.
    if let Some(n) = r.isolation_bystanders_failed.filter(|n| *n > 0) {
        progress(&format!(
            "isolation: {n} bystander sessions failed beside the hostile ones"
        ));
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The Postgres and Redis URLs of the run: private servers with `--private`, else the
/// ones given.
pub(crate) fn services(args: &BenchArgs) -> anyhow::Result<(String, String, Option<Private>)> {
    if args.private {
        progress("starting a private Redis and a durable private Postgres");
        let redis = RedisServer::start()?;
        let postgres = PostgresServer::start_with(private_postgres())?;
        let urls = (postgres.database_url("postgres"), redis.url());
        return Ok((
            urls.0,
            urls.1,
            Some(Private {
                _postgres: postgres,
                _redis: redis,
            }),
        ));
    }
    Ok((
        args.database_url
            .clone()
            .context("--database-url (or AGENTQ_DATABASE_URL) is required, or --private")?,
        args.redis_url
            .clone()
            .context("--redis-url (or AGENTQ_REDIS_URL) is required, or --private")?,
        None,
    ))
}

async fn run_parts(env: &Env, want: &dyn Fn(&str) -> bool, r: &mut Results) -> anyhow::Result<()> {
    // The throughput ratio is against the ceiling measured here, so it implies the ceiling.
    if want("ceiling") || want("throughput") {
        progress("ceiling: raw Postgres commits and Redis round trips");
        ceiling::ceiling(env, r).await?;
    }
    if want("throughput") || want("overhead") {
        progress(&format!(
            "throughput: {} sessions x {} iterations on {} workers",
            env.args.sessions, env.args.iterations, env.args.workers
        ));
        workload::throughput(env, r).await?;
    }
    if want("overhead") {
        progress(&format!(
            "overhead: one session alone, {} iterations",
            workload::ALONE_ITERATIONS
        ));
        workload::overhead_alone(env, r).await?;
    }
    if want("storage") {
        storage::storage(env, r).await?;
    }
    if want("resume") {
        progress("resume: loading 160-iteration sessions");
        resume::resume(env, r).await?;
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
    if want("isolation") {
        progress(&format!(
            "isolation: {} bystanders x {} iterations on {} workers, alone and beside {}% \
             hostile sessions",
            env.args.sessions, env.args.iterations, env.args.workers, env.args.hostile_percent
        ));
        isolation::isolation(env, r).await?;
    }
    if want("admission") {
        progress(&format!(
            "admission: {} sessions against a {} rpm limit, a non-binding one and none, {} s each",
            env.args.admission_sessions, env.args.admission_rpm, env.args.admission_secs
        ));
        admission::admission(env, r).await?;
    }
    if want("workspace") {
        workspace::workspace(env, r).await?;
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

pub(crate) fn progress(msg: &str) {
    eprintln!("agentq bench: {msg}");
}

/// The `q`-quantile (0..=1) of sorted samples, nearest rank.
pub(crate) fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
