//! The figures of a run, and how they are shown: a table for people, one JSON object
//! for programs.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use self::mcp::McpFigures;
use self::procs::{capacity_rows, recovery_rows};
pub use self::scale::{RoutingFigure, ScaleFigures};
use crate::args::BenchArgs;

pub(crate) mod mcp;
mod procs;
pub(crate) mod scale;

/// What the hostile sessions of the mixed round came to.
#[derive(Debug, Default)]
pub struct Outcomes {
    pub completed: u64,
    /// Ended `failed` or `cancelled`, or could not be created.
    pub failed: u64,
    /// Not ended `HOSTILE_GRACE` after the bystanders.
    pub unfinished: u64,
    /// Per kind, sessions per outcome (`completed`, `failed: <reason>: <error>`, …).
    pub by_kind: BTreeMap<String, BTreeMap<String, u64>>,
}

/// Every figure; `None` when its part did not run.
#[derive(Debug, Default)]
pub struct Results {
    /// The forks part: one figure per prefix length.
    pub forks: Vec<ForkFigure>,
    /// The scale part.
    pub scale: Option<ScaleFigures>,
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
    /// One durable one-row commit's round trip alone, just before (`ceiling::lone_commits`).
    pub lone_commit_p50_ms: Option<f64>,
    pub lone_commit_p99_ms: Option<f64>,
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
    /// Postgres's write-ahead log per iteration of the throughput run (the whole server's:
    /// nothing else writes to it during the round): what durability costs the disk, and
    /// where a lost HOT update shows first.
    pub wal_bytes_per_iteration: Option<f64>,
    pub bytes_per_iteration: BTreeMap<u32, f64>,
    pub message_bytes_per_iteration: BTreeMap<u32, f64>,
    pub resume_ms: Option<f64>,
    pub resume_first_ms: Option<f64>,
    pub resume_messages: Option<usize>,
    /// The workspace part's tree, and how long a claim takes to have it on disk.
    pub workspace_files: Option<usize>,
    pub workspace_bytes: Option<u64>,
    pub workspace_resume_cold_ms: Option<f64>,
    pub workspace_resume_warm_ms: Option<f64>,
    /// Per tool round (commits, rows written, bytes stored): the tool touches no file, or
    /// writes one.
    pub workspace_round_nofile: Option<[f64; 3]>,
    pub workspace_round_write: Option<[f64; 3]>,
    pub capacity_offered: Option<u32>,
    pub capacity_sessions: Option<u64>,
    pub capacity_iterations_per_s: Option<f64>,
    pub capacity_rss_bytes: Option<u64>,
    /// Most capacity calls came over HTTP/2 (the worker inherits `AGENTQ_PROVIDERS_HTTP`).
    pub capacity_http2: Option<bool>,
    /// Seconds from the worker's start until every offered session was in flight.
    pub capacity_ramp_s: Option<f64>,
    /// Iterations per session made by the window's end, when the peak RSS is read: how
    /// much history each session held, which the peak grows with. Runs of different
    /// speeds compare by it, not by their seconds.
    pub capacity_iterations_per_session: Option<f64>,
    pub recovery_s: Option<f64>,
    pub recovery_p50_s: Option<f64>,
    pub recovery_sessions: Option<usize>,
    /// The isolation part's bystander sessions, and the hostile ones beside them.
    pub isolation_bystanders: Option<u32>,
    pub isolation_hostiles: Option<u32>,
    pub isolation_hostile_kinds: Vec<String>,
    /// Bystanders' iterations/s without hostile sessions (two rounds, around the mixed
    /// one), and beside them.
    pub isolation_alone_iterations_per_s: Option<f64>,
    /// Bystanders' iterations/s beside as many benign sessions as there are hostile ones
    /// (two rounds, around the mixed one).
    pub isolation_control_iterations_per_s: Option<f64>,
    pub isolation_mixed_iterations_per_s: Option<f64>,
    /// Beside hostile sessions over beside as many benign ones: what hostility costs.
    pub isolation_ratio: Option<f64>,
    /// Beside hostile sessions over alone: what hostility and the added load cost.
    pub isolation_ratio_vs_alone: Option<f64>,
    /// Bystanders that did not complete every iteration: of the mixed round, and of the
    /// round alone after it (which hostile sessions may outlast).
    pub isolation_bystanders_failed: Option<u64>,
    pub isolation_outcomes: Option<Outcomes>,
    /// The admission part: its configured limit, iterations/s under it and over its rate,
    /// the share of requests the endpoint refused, the limiter's Redis script calls per
    /// LLM call, Redis commands per iteration a non-binding limit adds, and throughput
    /// with a non-binding limit and with none.
    pub admission_rpm: Option<u64>,
    pub admission_iterations_per_s: Option<f64>,
    pub admission_limit_ratio: Option<f64>,
    pub admission_refused_share: Option<f64>,
    pub admission_redis_calls_per_call: Option<f64>,
    pub admission_redis_commands_added_per_iteration: Option<f64>,
    pub admission_nonbinding_iterations_per_s: Option<f64>,
    pub admission_unlimited_iterations_per_s: Option<f64>,
    pub admission_nonbinding_ratio: Option<f64>,
    /// `--tool mcp`: the throughput part's rounds with the MCP tool and the trivial one.
    pub mcp: Option<McpFigures>,
}

impl Results {
    /// One session alone's overhead p50 in lone commits' p50: how many of this machine's
    /// bare durable commit round trips an iteration's own time is, which divides out how
    /// fast the machine's fsync and wake-ups are that hour.
    pub fn overhead_alone_in_commits(&self) -> Option<f64> {
        let commit = self.lone_commit_p50_ms.filter(|c| *c > 0.0)?;
        Some(self.overhead_alone_p50_ms? / commit)
    }

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

fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

pub(crate) fn num(v: Option<f64>, digits: i32) -> Value {
    match v {
        Some(x) if x.is_finite() => json!(round(x, digits)),
        _ => Value::Null,
    }
}

pub fn to_json(r: &Results, args: &BenchArgs) -> Value {
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
    let mut v = json!({
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
        "isolation_bystanders": r.isolation_bystanders,
        "isolation_hostiles": r.isolation_hostiles,
        "isolation_hostile_kinds": r.isolation_bystanders.map(|_| &r.isolation_hostile_kinds),
        "isolation_alone_iterations_per_s": num(r.isolation_alone_iterations_per_s, 1),
        "isolation_control_iterations_per_s": num(r.isolation_control_iterations_per_s, 1),
        "isolation_mixed_iterations_per_s": num(r.isolation_mixed_iterations_per_s, 1),
        "isolation_ratio": num(r.isolation_ratio, 3),
        "isolation_ratio_vs_alone": num(r.isolation_ratio_vs_alone, 3),
        "isolation_bystanders_failed": r.isolation_bystanders_failed,
        "isolation_hostiles_completed": r.isolation_outcomes.as_ref().map(|o| o.completed),
        "isolation_hostiles_failed": r.isolation_outcomes.as_ref().map(|o| o.failed),
        "isolation_hostiles_unfinished": r.isolation_outcomes.as_ref().map(|o| o.unfinished),
        "isolation_hostile_outcomes": r.isolation_outcomes.as_ref().map(|o| &o.by_kind),
    });
    // Apart: one `json!` of every key passes the macro's recursion limit.
    let admission = json!({
        "admission_rpm": r.admission_rpm,
        "admission_iterations_per_s": num(r.admission_iterations_per_s, 2),
        "admission_limit_ratio": num(r.admission_limit_ratio, 3),
        "admission_refused_share": num(r.admission_refused_share, 4),
        "admission_redis_calls_per_call": num(r.admission_redis_calls_per_call, 2),
        "admission_redis_commands_added_per_iteration": num(r.admission_redis_commands_added_per_iteration, 2),
        "admission_nonbinding_iterations_per_s": num(r.admission_nonbinding_iterations_per_s, 1),
        "admission_unlimited_iterations_per_s": num(r.admission_unlimited_iterations_per_s, 1),
        "admission_nonbinding_ratio": num(r.admission_nonbinding_ratio, 3),
    });
    if let (Value::Object(all), Value::Object(more)) = (&mut v, admission) {
        all.extend(more);
    }
    if let Value::Object(m) = &mut v {
        add_the_rest(m, r);
    }
    v
}

/// The figures beside the rest: one `json!` of every figure is past the macro's recursion
/// limit.
fn add_the_rest(m: &mut serde_json::Map<String, Value>, r: &Results) {
    for (key, value) in [
        ("lone_commit_p50_ms", num(r.lone_commit_p50_ms, 3)),
        ("lone_commit_p99_ms", num(r.lone_commit_p99_ms, 3)),
        (
            "overhead_alone_in_commits",
            num(r.overhead_alone_in_commits(), 2),
        ),
        ("wal_bytes_per_iteration", num(r.wal_bytes_per_iteration, 1)),
        ("capacity_http2", json!(r.capacity_http2)),
        ("capacity_ramp_s", num(r.capacity_ramp_s, 2)),
        (
            "capacity_iterations_per_session",
            num(r.capacity_iterations_per_session, 2),
        ),
        ("workspace_files", json!(r.workspace_files)),
        ("workspace_bytes", json!(r.workspace_bytes)),
        (
            "workspace_resume_cold_ms",
            num(r.workspace_resume_cold_ms, 3),
        ),
        (
            "workspace_resume_warm_ms",
            num(r.workspace_resume_warm_ms, 3),
        ),
    ] {
        m.insert(key.into(), value);
    }
    for (name, x) in [
        ("nofile", r.workspace_round_nofile),
        ("write", r.workspace_round_write),
    ] {
        let [commits, rows, bytes] = x.map_or([None; 3], |x| x.map(Some));
        m.insert(format!("workspace_round_{name}_commits"), num(commits, 3));
        m.insert(format!("workspace_round_{name}_rows"), num(rows, 2));
        m.insert(format!("workspace_round_{name}_bytes"), num(bytes, 0));
    }
    for (key, value) in fork_json(r) {
        m.insert(key, value);
    }
    for (key, value) in mcp::to_json(r.mcp.as_ref()) {
        m.insert(key.into(), value);
    }
    for (key, value) in scale::to_json(r) {
        m.insert(key.into(), value);
    }
}

/// `met`/`missed` against a target.
pub(crate) fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "MISSED" }
}

/// The table's rows: part, figure, value, target.
#[derive(Default)]
pub(crate) struct Rows(Vec<[String; 4]>);

impl Rows {
    pub(crate) fn add(&mut self, part: &str, figure: String, value: String, target: String) {
        self.0.push([part.to_string(), figure, value, target]);
    }
}

pub fn table(r: &Results, args: &BenchArgs) -> String {
    let mut rows = Rows::default();
    ceiling_rows(r, &mut rows);
    throughput_rows(r, args, &mut rows);
    mcp::rows(r, &mut rows);
    overhead_rows(r, &mut rows);
    storage_rows(r, &mut rows);
    resume_rows(r, &mut rows);
    workspace_rows(r, &mut rows);
    fork_rows(r, &mut rows);
    capacity_rows(r, args, &mut rows);
    recovery_rows(r, &mut rows);
    isolation_rows(r, args, &mut rows);
    admission_rows(r, &mut rows);
    scale::rows(r, &mut rows);
    layout(&rows.0)
}

/// The raw ceilings.
fn ceiling_rows(r: &Results, rows: &mut Rows) {
    if let Some(c) = r.ceiling_commits_per_s {
        rows.add(
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
        rows.add(
            "",
            "Redis XADD/XREADGROUP/XACK round trips/s".into(),
            format!("{c:.0}"),
            String::new(),
        );
    }
}

/// The throughput run: its rate, and what an iteration costs in CPU.
fn throughput_rows(r: &Results, args: &BenchArgs, rows: &mut Rows) {
    if let Some(t) = r.iterations_per_s {
        rows.add(
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
        rows.add(
            "",
            "the same, as fresh workers' first burst (warm-up round)".into(),
            format!("{t:.0}"),
            String::new(),
        );
    }
    if let Some(x) = r.ratio_to_ceiling {
        rows.add(
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
        rows.add(
            "",
            "CPU per iteration: workers + Postgres + Redis".into(),
            format!(
                "{w:.3} + {p:.3} + {:.3} ms",
                r.redis_cpu_ms_per_iteration.unwrap_or(0.0)
            ),
            String::new(),
        );
    }
    if let Some(w) = r.wal_bytes_per_iteration {
        rows.add(
            "",
            "Postgres WAL per iteration".into(),
            format!("{w:.0} B"),
            String::new(),
        );
    }
    if let (Some(n), Some(c)) = (
        r.iteration_cpu_in_ceiling_commits(),
        r.ceiling_cpu_ms_per_commit,
    ) {
        rows.add(
            "",
            format!("that in ceiling commits ({c:.3} ms of CPU each)"),
            format!("{n:.2}"),
            String::new(),
        );
    }
}

/// The loop's own time per iteration, under load and alone.
fn overhead_rows(r: &Results, rows: &mut Rows) {
    if let (Some(p50), Some(p99)) = (r.overhead_p50_ms, r.overhead_p99_ms) {
        rows.add(
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
        rows.add(
            "",
            format!(
                "the same, one session alone ({} samples)",
                r.overhead_alone_samples.unwrap_or(0)
            ),
            format!("{p50:.2} / {p99:.2} ms"),
            format!("<= 0.5 / <= 2 ms {}", verdict(p50 <= 0.5 && p99 <= 2.0)),
        );
    }
    if let (Some(p50), Some(p99)) = (r.lone_commit_p50_ms, r.lone_commit_p99_ms) {
        rows.add(
            "",
            "one durable one-row commit alone, p50 / p99 (the machine's floor)".into(),
            format!("{p50:.2} / {p99:.2} ms"),
            String::new(),
        );
    }
    if let Some(x) = r.overhead_alone_in_commits() {
        rows.add(
            "",
            "one session alone's p50, in lone commits' p50".into(),
            format!("{x:.2}"),
            String::new(),
        );
    }
}

/// Bytes stored per iteration, against the messages' own size.
fn storage_rows(r: &Results, rows: &mut Rows) {
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
        rows.add(
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
        rows.add(
            "",
            "message bytes per iteration (JSON)".into(),
            msgs.join(", "),
            String::new(),
        );
    }
}

/// Loading a long session.
fn resume_rows(r: &Results, rows: &mut Rows) {
    if let Some(x) = r.resume_ms {
        rows.add(
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
        rows.add(
            "",
            "first load on a fresh connection".into(),
            format!("{x:.2} ms"),
            String::new(),
        );
    }
}

/// Having a tree's files on disk at a claim.
fn workspace_rows(r: &Results, rows: &mut Rows) {
    let shape = format!(
        "{} files, {:.0} MB",
        r.workspace_files.unwrap_or(0),
        r.workspace_bytes.unwrap_or(0) as f64 / 1e6
    );
    if let Some(x) = r.workspace_resume_cold_ms {
        rows.add(
            "workspace",
            format!("resume {shape}, cold (empty cache, p50)"),
            format!("{x:.1} ms"),
            String::new(),
        );
    }
    if let Some(x) = r.workspace_resume_warm_ms {
        rows.add(
            "",
            "resume, warm (cache as committed, p50)".into(),
            format!("{x:.1} ms"),
            String::new(),
        );
    }
    for (what, x) in [
        ("tool round, no file", r.workspace_round_nofile),
        ("tool round writing a file", r.workspace_round_write),
    ] {
        if let Some([commits, written, bytes]) = x {
            rows.add(
                "",
                format!("{what}: commits, rows written, bytes stored"),
                format!("{commits:.2}, {written:.1}, {bytes:.0} B"),
                String::new(),
            );
        }
    }
}

/// Bystanders beside hostile sessions, and what the hostile sessions came to.
fn admission_rows(r: &Results, rows: &mut Rows) {
    let (Some(rpm), Some(ratio)) = (r.admission_rpm, r.admission_limit_ratio) else {
        return;
    };
    rows.add(
        "admission",
        format!("iterations/s under a {rpm} rpm limit, over the limit"),
        format!(
            "{ratio:.2} ({:.1}/s)",
            r.admission_iterations_per_s.unwrap_or(0.0)
        ),
        format!(">= 0.9 {}", verdict(ratio >= 0.9)),
    );
    if let Some(x) = r.admission_refused_share {
        rows.add(
            "",
            "requests the endpoint refused (429)".into(),
            format!("{:.2}%", x * 100.0),
            format!("<= 1% {}", verdict(x <= 0.01)),
        );
    }
    if let Some(x) = r.admission_redis_calls_per_call {
        rows.add(
            "",
            "limiter Redis script calls per LLM call".into(),
            format!("{x:.2}"),
            format!("<= 1 {}", verdict(x <= 1.0)),
        );
    }
    if let Some(x) = r.admission_redis_commands_added_per_iteration {
        rows.add(
            "",
            "Redis commands per iteration a non-binding limit adds".into(),
            format!("{x:.2}"),
            String::new(),
        );
    }
    if let Some(x) = r.admission_nonbinding_ratio {
        rows.add(
            "",
            format!(
                "iterations/s with a non-binding limit over none ({:.0} / {:.0})",
                r.admission_nonbinding_iterations_per_s.unwrap_or(0.0),
                r.admission_unlimited_iterations_per_s.unwrap_or(0.0)
            ),
            format!("{x:.3}"),
            format!(">= 0.95 {}", verdict(x >= 0.95)),
        );
    }
}

fn isolation_rows(r: &Results, args: &BenchArgs, rows: &mut Rows) {
    let (Some(alone), Some(mixed)) = (
        r.isolation_alone_iterations_per_s,
        r.isolation_mixed_iterations_per_s,
    ) else {
        return;
    };
    rows.add(
        "isolation",
        format!(
            "bystander iterations/s alone ({} x {}, {} workers)",
            r.isolation_bystanders.unwrap_or(0),
            args.iterations,
            args.workers
        ),
        format!("{alone:.0}"),
        String::new(),
    );
    if let Some(control) = r.isolation_control_iterations_per_s {
        rows.add(
            "",
            format!(
                "the same beside {} benign sessions",
                r.isolation_hostiles.unwrap_or(0)
            ),
            format!("{control:.0}"),
            String::new(),
        );
    }
    rows.add(
        "",
        format!(
            "the same beside {} hostile sessions ({})",
            r.isolation_hostiles.unwrap_or(0),
            r.isolation_hostile_kinds.join(", ")
        ),
        format!("{mixed:.0}"),
        String::new(),
    );
    if let Some(x) = r.isolation_ratio {
        rows.add(
            "",
            "beside hostile sessions over beside benign ones".into(),
            format!("{x:.2}"),
            format!(">= 0.9 {}", verdict(x >= 0.9)),
        );
    }
    if let Some(x) = r.isolation_ratio_vs_alone {
        rows.add(
            "",
            "beside hostile sessions over alone".into(),
            format!("{x:.2}"),
            String::new(),
        );
    }
    let failed = r.isolation_bystanders_failed.unwrap_or(0);
    rows.add(
        "",
        "bystanders failed beside hostile sessions".into(),
        failed.to_string(),
        format!("0 {}", verdict(failed == 0)),
    );
    if let Some(o) = &r.isolation_outcomes {
        rows.add(
            "",
            "hostile sessions completed / failed / unfinished".into(),
            format!("{} / {} / {}", o.completed, o.failed, o.unfinished),
            String::new(),
        );
        for (kind, outcomes) in &o.by_kind {
            for (label, n) in outcomes {
                rows.add(
                    "",
                    format!("  {kind}: {label}"),
                    n.to_string(),
                    String::new(),
                );
            }
        }
    }
}

/// The rows in aligned columns under a header.
fn layout(rows: &[[String; 4]]) -> String {
    let mut w = [4usize; 4];
    for r in rows {
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
    for r in rows {
        line([&r[0], &r[1], &r[2], &r[3]], &mut out);
    }
    out
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

/// The forks part's figures for one prefix length.
#[derive(Debug, Clone)]
pub struct ForkFigure {
    pub steps: u32,
    /// The prefix's stored size (its `messages` rows' bodies).
    pub prefix_bytes: i64,
    pub fork_p50_ms: f64,
    pub fork_p99_ms: f64,
    pub bytes_per_fork: f64,
    pub message_rows_per_fork: f64,
}

/// The forks part's rows.
fn fork_rows(r: &Results, rows: &mut Rows) {
    for (i, f) in r.forks.iter().enumerate() {
        rows.add(
            if i == 0 { "forks" } else { "" },
            format!(
                "fork at step {} ({} KB of prefix): time p50 / p99, bytes and message rows \
                 added per fork",
                f.steps,
                f.prefix_bytes / 1024
            ),
            format!(
                "{:.2} / {:.2} ms, {:.0} B, {:.0}",
                f.fork_p50_ms, f.fork_p99_ms, f.bytes_per_fork, f.message_rows_per_fork
            ),
            String::new(),
        );
    }
}

/// The forks part's JSON figures.
fn fork_json(r: &Results) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for f in &r.forks {
        let s = f.steps;
        out.push((format!("fork_{s}_p50_ms"), json!(f.fork_p50_ms)));
        out.push((format!("fork_{s}_p99_ms"), json!(f.fork_p99_ms)));
        out.push((format!("fork_{s}_bytes"), json!(f.bytes_per_fork)));
        out.push((
            format!("fork_{s}_message_rows"),
            json!(f.message_rows_per_fork),
        ));
    }
    out
}
