//! The flags of `agentq bench` ([`BenchArgs`]) and the parts it can run ([`PARTS`]).

use std::path::PathBuf;

use clap::Args;

use crate::hostile;
use crate::turns::{BUILTIN, MCP, TRIVIAL};

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
    "forks",
    "scale",
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
    /// resume, capacity, recovery, isolation, admission, workspace, forks.
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
    /// overhead, storage, resume, isolation): `trivial` answers at once from memory;
    /// `list_dir` is the built-in, one directory listing through tokio's blocking pool;
    /// `mcp` is an MCP tool that a tiny stdio MCP server (one per worker) answers at once,
    /// and the throughput part then also runs `trivial` to give the overhead per MCP call.
    /// Capacity and recovery run `agentq worker` children, which always call `list_dir`.
    #[arg(long, default_value = TRIVIAL, value_parser = [TRIVIAL, BUILTIN, MCP])]
    pub tool: String,
    /// With `--tool mcp`: pairs of throughput rounds, each a round with `trivial` and one
    /// with the MCP tool on fresh workers, in alternating order (`trivial` first in the
    /// first pair, the MCP tool first in the second, …), so that a drift over the run
    /// weighs on both alike.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub mcp_pairs: u32,
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
    /// Calls of each of the scale part's measures (budget holds, limiter calls), 64 at once.
    #[arg(long, default_value_t = 6_400, value_parser = clap::value_parser!(u32).range(64..=1_000_000))]
    pub scale_calls: u32,
    /// Rounds of the scale part's layouts: each round runs the throughput workload on every
    /// layout one after another, and each layout is compared with the first round by round.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub scale_rounds: u32,
    /// Another `agentq` binary (a path, or a name on PATH) to measure this one against: the
    /// same parts run with each, alternately, each on a fresh database of the same servers,
    /// and every figure is reported as this / other with its spread across pairs.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// Alternating pairs of runs of an A/B sitting (`--baseline`).
    #[arg(long, default_value_t = 6, requires = "baseline", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub pairs: u32,
    /// The `agentq` binary the capacity and recovery parts run as `agentq worker`
    /// children. `None` is this process's own executable, which is that binary when the
    /// bench runs as `agentq bench`; a program that embeds the bench (its tests) names the
    /// binary here. A hidden flag: a script that runs a profiler on the real binary
    /// (docs/benchmarks.md, "Profiling the worker process") is how a child is measured.
    #[arg(long, hide = true)]
    pub agentq_binary: Option<PathBuf>,
}
