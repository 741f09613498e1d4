//! `agentq demo`: agentq's main job, end to end, in one command and with no services.
//!
//! It opens the embedded stack (a SQLite file and the in-process queue), submits a batch
//! of sessions that call tools (write a file, read it back, list the directory), runs a
//! few workers and, once part of the batch is done, kills one of them abruptly: the
//! sessions it was running keep their leases and queue entries until the leases expire,
//! then the other workers take them over and resume them from their last checkpoint.
//! A progress bar runs meanwhile; at the end, a summary read back from the store:
//! sessions by finish reason, iterations, tokens, sessions resumed after the kill, LLM
//! calls re-issued, throughput and latency. The exit code is 0 only if every session
//! completed.
//!
//! The kill is real: each demo worker runs on its own single-threaded tokio runtime in a
//! thread of its own, and killing it drops that runtime, which drops every task the
//! worker spawned (its sessions, its heartbeats, its reclaimer) wherever they were, with
//! no drain, no release and no ack — what SIGKILL does to a worker process.
//!
//! The module owns the demo's workload (the scripted model's script and the sessions'
//! specs), the kill and the summary (table or `--json`); its progress display is
//! `crate::progress`, shared with `submit --wait`.

mod kill;
mod summary;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{EnqueueReason, NewSession, SessionStatus};
use agentq_worker::{Worker, WorkerSettings};

use crate::dev::Stack;
use crate::progress::Progress;
use kill::{DRAIN_TIMEOUT, DemoWorker, pick_victim, taken_over};
use summary::{Summary, SummaryRun, all_sessions, llm_audit, print_table, summarize};

/// The queue the demo's sessions go through.
const QUEUE: &str = "default";
/// The file every demo session writes in its workspace, and what it writes there (the
/// scripted model cannot vary its tool arguments per session).
pub const NOTES_FILE: &str = "notes.md";
pub const NOTES_CONTENT: &str = "# Notes\n\n- agentq runs agent sessions as durable jobs.\n\
    - Every step is checkpointed, so any worker can resume any session.\n";
/// Whether some demo sessions spawn a sub-agent (`spawn_agent`, `wait: true`).
const SPAWN_SUB_AGENTS: bool = true;
/// Every this many sessions, one spawns a sub-agent (when [`SPAWN_SUB_AGENTS`] is on).
pub const SPAWN_EVERY: usize = 4;
/// Prompt markers that select the scripted model's variants: the sessions that spawn a
/// reviewer, and the reviewers.
const LEAD_MARK: &str = "[lead]";
const REVIEW_MARK: &str = "[review]";

/// Timings that make a kill visible within seconds: leases expire 2 s after the last
/// heartbeat. The min-idle is a little longer than the lease: an entry reclaimed while
/// its lease still holds is left alone and costs another min-idle.
const LEASE_TTL: Duration = Duration::from_secs(2);
const HEARTBEAT: Duration = Duration::from_millis(500);
const RECLAIM_MIN_IDLE: Duration = Duration::from_millis(2500);
const RECLAIM_INTERVAL: Duration = Duration::from_millis(500);
/// The kill comes when this share of the batch has completed (and at least one session).
const KILL_AT: f64 = 0.4;
/// How often progress is sampled (and the kill condition checked).
const TICK: Duration = Duration::from_millis(100);
/// Plain progress lines (no terminal) come this often.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Sessions in the batch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub sessions: u32,
    /// Workers (one of them is killed midway when there are two or more).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: u32,
    /// Sessions each worker runs at once.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// The database file (default: a temporary file, deleted at the end). Must not hold
    /// sessions already.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Where sessions' workspaces go (default: `<db>.workspaces` with --db, else a
    /// temporary directory).
    #[arg(long)]
    pub workspaces: Option<PathBuf>,
    /// Do not kill a worker.
    #[arg(long)]
    pub no_kill: bool,
    /// A real model instead of the scripted one: openai or anthropic (keys from
    /// OPENAI_API_KEY / ANTHROPIC_API_KEY).
    #[arg(long, default_value = "scripted")]
    pub provider: String,
    /// Endpoint of the provider (any OpenAI-compatible server).
    #[arg(long)]
    pub base_url: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    /// Give up (exit non-zero) after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Print the summary as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The scripted model's script: each turn is a realistic pause (the "model thinking")
/// and one tool call. Sessions whose prompt holds [`LEAD_MARK`] also spawn a reviewer
/// sub-agent and wait for its answer; the reviewer (prompt with [`REVIEW_MARK`]) reads the
/// notes and answers.
pub fn script() -> serde_json::Value {
    let usage = |i: u64, o: u64| json!({"input_tokens": i, "output_tokens": o});
    let write = json!({
        "text": "I'll write my notes to a file first.",
        "tool_calls": [{"name": "write_file", "arguments": {"path": NOTES_FILE, "content": NOTES_CONTENT}}],
        "usage": usage(310, 64), "delay_ms": 300, "chunk_chars": 8,
    });
    let read = json!({
        "text": "Let me read them back to check them.",
        "tool_calls": [{"name": "read_file", "arguments": {"path": NOTES_FILE}}],
        "usage": usage(420, 22), "delay_ms": 250, "chunk_chars": 8,
    });
    let list = json!({
        "text": "And see what else is in the workspace.",
        "tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}],
        "usage": usage(530, 20), "delay_ms": 250, "chunk_chars": 8,
    });
    let answer = json!({
        "text": "Done. The workspace now holds:\n{{last_tool_result}}",
        "usage": usage(640, 48), "delay_ms": 200, "chunk_chars": 12,
    });
    let spawn = json!({
        "text": "I'll ask a sub-agent to review the notes.",
        "tool_calls": [{"name": "spawn_agent", "arguments": {
            "prompt": format!("{REVIEW_MARK} Review {NOTES_FILE} and say whether it is complete."),
            "label": "reviewer",
            "tools": ["read_file", "list_dir"],
            "max_iterations": 4,
            "wait": true,
        }}],
        "usage": usage(600, 40), "delay_ms": 200, "chunk_chars": 8,
    });
    let lead_answer = json!({
        "text": "Done, and reviewed: {{last_tool_result}}",
        "usage": usage(700, 30), "delay_ms": 200, "chunk_chars": 12,
    });
    let review = [
        json!({
            "text": "Reading the notes.",
            "tool_calls": [{"name": "read_file", "arguments": {"path": NOTES_FILE}}],
            "usage": usage(200, 12), "delay_ms": 200, "chunk_chars": 8,
        }),
        json!({
            "text": "The notes are complete.",
            "usage": usage(260, 8), "delay_ms": 150, "chunk_chars": 8,
        }),
    ];
    json!({
        "turns": [write.clone(), read.clone(), list.clone(), answer],
        "variants": [
            {"when_prompt_contains": REVIEW_MARK, "turns": review},
            {"when_prompt_contains": LEAD_MARK, "turns": [write, read, list, spawn, lead_answer]},
        ],
    })
}

/// Temporary files the demo made, removed when it ends.
struct Scratch {
    dir: Option<tempfile::TempDir>,
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let (db, workspaces, scratch) = paths(&args)?;
    std::fs::create_dir_all(&workspaces)
        .with_context(|| format!("cannot create {}", workspaces.display()))?;
    let (stack, sqlite) = open_stack(&db).await?;
    let base = worker_config(&args, &workspaces);

    let metrics = agentq_core::metrics::global();
    let reissued_before = metrics.llm_reissued.get();
    let interrupt = CancellationToken::new();
    crate::signals::cancel_on_signal(interrupt.clone());

    let stop = CancellationToken::new();
    let mut workers = start_workers(&stack, &base, args.workers, &stop)?;
    let t0 = Instant::now();
    submit(&stack, &args).await?;
    let total = u64::from(args.sessions);
    // The bar only when the summary on stdout is a table on a terminal too.
    let bar = std::io::IsTerminal::is_terminal(&std::io::stdout()) && !args.json;
    let progress = Progress::new(total, bar, PLAIN_EVERY);
    progress.note(&format!(
        "agentq demo: {total} sessions, {} workers × {}, {}",
        args.workers,
        args.concurrency,
        if args.provider == "scripted" {
            "scripted model".to_string()
        } else {
            format!("{} model", args.provider)
        }
    ));
    let batch = Batch {
        args: &args,
        stack: &stack,
        sqlite: &sqlite,
        progress: &progress,
        t0,
    };
    let watched = batch.watch(&mut workers, &interrupt).await?;
    progress.finish();
    stop_workers(&mut workers).await;

    let rows = all_sessions(stack.store.as_ref()).await?;
    let reissued = metrics.llm_reissued.get().saturating_sub(reissued_before);
    let audit = llm_audit(stack.queue.as_ref(), &rows).await;
    let summary = summarize(
        &rows,
        SummaryRun {
            kill: watched.kill,
            interrupted: &watched.interrupted,
            reissued,
            audit,
            wall: watched.wall,
            workers: args.workers,
            concurrency: args.concurrency,
            db: &db,
            workspaces: &workspaces,
        },
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(&summary, scratch.dir.is_some());
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), sqlite.close()).await;
    Ok(verdict(watched.failure, &summary))
}

/// The database file and the workspaces' directory, and the temporary directory holding
/// them when `--db` does not name a file.
fn paths(args: &DemoArgs) -> anyhow::Result<(PathBuf, PathBuf, Scratch)> {
    let mut scratch = Scratch { dir: None };
    let (db, workspaces) = match (&args.db, &args.workspaces) {
        (Some(db), ws) => {
            let ws = ws.clone().unwrap_or_else(|| {
                let mut p = db.clone().into_os_string();
                p.push(".workspaces");
                PathBuf::from(p)
            });
            (db.clone(), ws)
        }
        (None, ws) => {
            let dir = tempfile::Builder::new()
                .prefix("agentq-demo-")
                .tempdir()
                .context("cannot create a temporary directory")?;
            let db = dir.path().join("demo.db");
            let ws = ws.clone().unwrap_or_else(|| dir.path().join("workspaces"));
            scratch.dir = Some(dir);
            (db, ws)
        }
    };
    Ok((db, workspaces, scratch))
}

/// The embedded stack on `db`, which must not hold sessions yet (the summary counts
/// every session in the file), and its SQLite store.
async fn open_stack(db: &Path) -> anyhow::Result<(Stack, SqliteStore)> {
    let stack = Stack::embedded(db, &[QUEUE.to_string()], false, None).await?;
    let (Some(sqlite), Some(_)) = (stack.sqlite.clone(), stack.mem_queue.clone()) else {
        bail!("the demo needs the embedded stack");
    };
    let existing = count_by_status(&sqlite, false).await?;
    if existing.values().sum::<u64>() > 0 {
        bail!(
            "--db: {} already holds sessions; the demo needs a fresh database (remove the file or \
             pick another path)",
            db.display()
        );
    }
    Ok((stack, sqlite))
}

/// The settings every demo worker shares (each gets its own consumer name).
fn worker_config(args: &DemoArgs, workspaces: &Path) -> WorkerSettings {
    let mut base = WorkerSettings {
        queues: vec![QUEUE.to_string()],
        concurrency: args.concurrency as usize,
        lease_ttl: LEASE_TTL,
        heartbeat_interval: HEARTBEAT,
        reclaim_min_idle: RECLAIM_MIN_IDLE,
        reclaim_interval: RECLAIM_INTERVAL,
        drain_timeout: DRAIN_TIMEOUT,
        read_block: Duration::from_millis(500),
        workspace_root: workspaces.to_path_buf(),
        default_provider: Some(args.provider.clone()),
        default_model: args.model.clone(),
        default_tools: demo_tools(),
        policy: std::sync::Arc::new(demo_policy()),
        ..WorkerSettings::default()
    };
    if args.provider == "scripted" {
        base.providers.script = Some(script().to_string());
    }
    // The endpoint is the host's setting, so the keys of the environment go to it.
    if let Some(url) = &args.base_url {
        match args.provider.as_str() {
            "anthropic" => base.providers.anthropic_base_url = Some(url.clone()),
            _ => base.providers.openai_base_url = Some(url.clone()),
        }
    }
    base
}

fn start_workers(
    stack: &Stack,
    base: &WorkerSettings,
    n: u32,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<DemoWorker>> {
    let mut workers = Vec::new();
    for i in 0..n {
        let name = format!("worker-{}", i + 1);
        let mut cfg = base.clone();
        cfg.consumer = format!("{}-{name}", agentq_worker::default_consumer_name());
        let worker = Worker::new(stack.store.clone(), stack.queue.clone(), cfg);
        workers.push(DemoWorker::start(name, worker, stop.clone())?);
    }
    Ok(workers)
}

/// Submit the batch: rows first, then queue entries (what the scheduler's API does).
async fn submit(stack: &Stack, args: &DemoArgs) -> anyhow::Result<()> {
    let news: Vec<NewSession> = (0..args.sessions as usize)
        .map(|i| NewSession::root(session_spec(i, args), QUEUE))
        .collect();
    for chunk in news.chunks(1000) {
        stack.store.create_sessions(chunk).await?;
        let items: Vec<(String, EnqueueReason)> = chunk
            .iter()
            .map(|n| (n.id.clone(), EnqueueReason::New))
            .collect();
        stack.queue.enqueue_many(QUEUE, &items).await?;
        let ids: Vec<String> = chunk.iter().map(|n| n.id.clone()).collect();
        stack.store.mark_enqueued(&ids).await?;
    }
    Ok(())
}

/// The batch being run, as [`Batch::watch`] follows it.
struct Batch<'a> {
    args: &'a DemoArgs,
    stack: &'a Stack,
    sqlite: &'a SqliteStore,
    progress: &'a Progress,
    /// When the batch was submitted.
    t0: Instant,
}

/// What watching the batch saw.
struct Watched {
    /// The killed worker, when it was killed, and how many sessions it left unfinished.
    kill: Option<(String, f64, u64)>,
    /// Those sessions, with their lease epoch at the kill.
    interrupted: Vec<(String, i64)>,
    /// Why the batch did not finish, if it did not.
    failure: Option<String>,
    wall: Duration,
}

impl Batch<'_> {
    /// Follow the batch until every root session has finished (or the time is up, or the
    /// user interrupts), showing progress and killing a worker on the way.
    async fn watch(
        &self,
        workers: &mut [DemoWorker],
        interrupt: &CancellationToken,
    ) -> anyhow::Result<Watched> {
        let args = self.args;
        let total = u64::from(args.sessions);
        let kill_target = ((total as f64 * KILL_AT).ceil() as u64).clamp(1, total);
        let may_kill = !args.no_kill && workers.len() >= 2;
        let mut w = Watched {
            kill: None,
            interrupted: Vec::new(),
            failure: None,
            wall: Duration::ZERO,
        };
        let mut target_reached: Option<Instant> = None;
        let deadline = self.t0 + Duration::from_secs(args.timeout_secs);
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = interrupt.cancelled() => {
                    w.failure = Some("interrupted".into());
                    break;
                }
            }
            let counts = count_by_status(self.sqlite, true).await?;
            let resumed = taken_over(self.stack.store.as_ref(), &w.interrupted).await;
            let done: u64 = counts
                .iter()
                .filter(|(s, _)| SessionStatus::parse(s).is_some_and(|s| s.is_terminal()))
                .map(|(_, n)| n)
                .sum();
            let running: usize = workers.iter().map(DemoWorker::running).sum();
            if may_kill && w.kill.is_none() && done >= kill_target && done < total {
                let since = *target_reached.get_or_insert_with(Instant::now);
                if let Some((kill, interrupted)) = self.kill_one(workers, since).await {
                    w.kill = Some(kill);
                    w.interrupted = interrupted;
                }
            }
            let line = format!(
                "{done}/{total} done · {running} running · {resumed} resumed{}",
                match &w.kill {
                    Some((name, _, _)) => format!(" · {name} killed"),
                    None => String::new(),
                }
            );
            self.progress.update(done, &line, self.t0.elapsed());
            if done >= total {
                break;
            }
            if Instant::now() >= deadline {
                w.failure = Some(format!(
                    "only {done} of {total} sessions finished within --timeout-secs {}",
                    args.timeout_secs
                ));
                break;
            }
        }
        w.wall = self.t0.elapsed();
        Ok(w)
    }

    /// Kill a worker once one is worth killing ([`pick_victim`]); the kill (who, when,
    /// how many sessions it left) and the sessions it left with their lease epochs.
    #[allow(clippy::type_complexity)]
    async fn kill_one(
        &self,
        workers: &mut [DemoWorker],
        since: Instant,
    ) -> Option<((String, f64, u64), Vec<(String, i64)>)> {
        let store = self.stack.store.as_ref();
        let i = pick_victim(store, workers, since).await?;
        let victim = &mut workers[i];
        let ids = victim.worker.active_sessions();
        victim.kill();
        let at = self.t0.elapsed().as_secs_f64();
        // Read after the kill, so nothing changes them any more: the sessions it left
        // unfinished, and the epoch of its lease on each.
        let mut interrupted = Vec::new();
        for id in ids {
            if let Ok(Some(row)) = store.get(&id).await
                && !row.status.is_terminal()
            {
                interrupted.push((id, row.lease_epoch));
            }
        }
        let n = interrupted.len();
        self.progress.note(&format!(
            "killed {} at {at:.1} s while it ran {n} session(s): its leases expire in {} s, \
             then the other workers resume them from their last checkpoint",
            victim.name,
            LEASE_TTL.as_secs()
        ));
        Some(((victim.name.clone(), at, n as u64), interrupted))
    }
}

/// Stop the live workers gracefully, and join the killed ones' threads (which end at
/// once: their runtime is gone).
async fn stop_workers(workers: &mut [DemoWorker]) {
    for w in workers.iter_mut().filter(|w| !w.killed) {
        if let Err(e) = w.stop().await {
            eprintln!("agentq demo: {e}");
        }
    }
    for w in workers.iter_mut().filter(|w| w.killed) {
        if let Some(t) = w.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// The exit code: success only if the batch finished, no checkpointed answer was asked
/// for again, and every session completed; the reason on stderr otherwise.
fn verdict(failure: Option<String>, summary: &Summary) -> ExitCode {
    if let Some(f) = failure {
        eprintln!("agentq demo: failed: {f}");
        return ExitCode::FAILURE;
    }
    if !summary.durable {
        eprintln!(
            "agentq demo: failed: {} checkpointed LLM answer(s) were requested again",
            summary.llm_answers_requested_again
        );
        return ExitCode::FAILURE;
    }
    if !summary.all_completed {
        let bad: Vec<String> = summary
            .by_status
            .iter()
            .filter(|(s, _)| s.as_str() != SessionStatus::Completed.as_str())
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        eprintln!(
            "agentq demo: failed: not every session completed ({})",
            bad.join(", ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn demo_tools() -> Vec<String> {
    ["write_file", "read_file", "list_dir"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The demo's sessions write a file, so its workers' policy allows that on top of the
/// default (the read-only tools and spawn_agent).
fn demo_policy() -> agentq_core::policy::Policy {
    let mut section = agentq_core::config::PolicySection::default();
    for t in demo_tools() {
        if !section.tools.contains(&t) {
            section.tools.push(t);
        }
    }
    agentq_core::policy::Policy::from_section(&section)
        .unwrap_or_else(|_| agentq_core::policy::Policy::deny_all())
}

/// The `i`-th session of the batch.
fn session_spec(i: usize, args: &DemoArgs) -> SessionSpec {
    let lead = SPAWN_SUB_AGENTS && i % SPAWN_EVERY == SPAWN_EVERY - 1;
    let mut spec = SessionSpec::new(format!(
        "{}Session {}: write short notes about durable agent sessions to {NOTES_FILE}, read \
         the file back to check it, list the workspace{}, then answer with what it holds.",
        if lead { "[lead] " } else { "" },
        i + 1,
        if lead {
            ", have a sub-agent (spawn_agent) review the notes"
        } else {
            ""
        }
    ));
    let mut tools = demo_tools();
    if lead {
        tools.push("spawn_agent".into());
    }
    spec.tools = Some(tools);
    spec.max_iterations = 12;
    if args.provider != "scripted" {
        spec.provider = Some(args.provider.clone());
        spec.model = args.model.clone();
    }
    spec
}

/// Root sessions (or all, with `roots_only = false`) by status, straight from the file.
async fn count_by_status(
    sqlite: &SqliteStore,
    roots_only: bool,
) -> anyhow::Result<BTreeMap<String, u64>> {
    let sql = if roots_only {
        "SELECT status, COUNT(*) FROM sessions WHERE parent_id IS NULL GROUP BY status"
    } else {
        "SELECT status, COUNT(*) FROM sessions GROUP BY status"
    };
    let rows: Vec<(String, i64)> = sqlx::query_as(sql)
        .fetch_all(sqlite.pool())
        .await
        .context("cannot count sessions")?;
    Ok(rows
        .into_iter()
        .map(|(s, n)| (s, u64::try_from(n).unwrap_or(0)))
        .collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn script_parses_with_its_variants() {
        let s: agentq_agent::provider::scripted::Script = serde_json::from_value(script()).unwrap();
        assert_eq!(s.turns.len(), 4);
        assert_eq!(s.variants.len(), 2);
        // The reviewer's prompt must not select the lead's variant, nor the reverse.
        assert!(!REVIEW_MARK.contains(LEAD_MARK) && !LEAD_MARK.contains(REVIEW_MARK));
    }
}
