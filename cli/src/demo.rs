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
//! specs), the kill, the progress display and the summary (table or `--json`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{EnqueueReason, ListFilter, NewSession, SessionRow, SessionStatus, Store};
use agentq_worker::{Worker, WorkerConfig};

use crate::dev::Stack;

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
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The kill comes when this share of the batch has completed (and at least one session).
const KILL_AT: f64 = 0.4;
/// How long the kill waits for a worker with sessions midway before taking any.
const KILL_PATIENCE: Duration = Duration::from_secs(3);
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

/// What the demo reports, from the store (except the run's own observations: the kill,
/// the wall time, the re-issued calls).
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Every session of the run, sub-agents included.
    pub sessions: u64,
    pub root_sessions: u64,
    pub sub_agents: u64,
    pub completed: u64,
    pub by_status: BTreeMap<String, u64>,
    pub by_finish_reason: BTreeMap<String, u64>,
    pub iterations: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The killed worker, if one was.
    pub killed_worker: Option<String>,
    pub killed_at_secs: Option<f64>,
    /// Sessions the killed worker left unfinished.
    pub killed_running: u64,
    /// Sessions the kill interrupted that another worker then took over (claimed with a
    /// newer lease epoch) and resumed from their last checkpoint.
    pub resumed: u64,
    pub resumed_sessions: Vec<String>,
    /// LLM calls made again because the worker making them died before the answer was
    /// checkpointed (`agentq_llm_reissued_total`).
    pub llm_reissued: u64,
    /// The same, as seen in the sessions' event streams.
    pub llm_reissued_seen: u64,
    /// LLM calls made again for an answer that had been checkpointed already. Must be 0:
    /// a resumed session continues from its checkpoint.
    pub llm_answers_requested_again: u64,
    pub wall_secs: f64,
    pub sessions_per_sec: f64,
    pub iterations_per_sec: f64,
    pub latency_p50_ms: u64,
    pub latency_p95_ms: u64,
    pub workers: u32,
    pub concurrency: u32,
    pub db: String,
    pub workspaces: String,
    pub all_completed: bool,
    /// No checkpointed LLM answer was requested again.
    pub durable: bool,
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

/// One demo worker: a [`Worker`] running on a runtime of its own, in a thread of its own,
/// so that it can be killed (see the module docs).
struct DemoWorker {
    name: String,
    worker: Worker,
    stop: CancellationToken,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    killed: bool,
}

impl DemoWorker {
    fn start(name: String, worker: Worker, stop: CancellationToken) -> anyhow::Result<Self> {
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let (w, s) = (worker.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start a runtime: {e}"))?;
                let result = rt.block_on(async move {
                    tokio::select! {
                        r = w.run(s) => r.map_err(|e| e.to_string()),
                        // A dropped sender is not a kill: only `send` is.
                        Ok(()) = killed => Ok(()),
                    }
                });
                // After a kill this drops the worker's tasks where they stand; after a
                // graceful stop there are none left. Blocking tasks (file I/O) are not
                // waited for, as a killed process would not wait for them.
                rt.shutdown_background();
                result
            })
            .context("cannot start a worker thread")?;
        Ok(DemoWorker {
            name,
            worker,
            stop,
            kill: Some(kill),
            thread: Some(thread),
            killed: false,
        })
    }

    fn running(&self) -> usize {
        if self.killed {
            0
        } else {
            self.worker.active_sessions().len()
        }
    }

    fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        self.killed = true;
    }

    /// Graceful stop (drain), bounded; the thread is joined off the async runtime.
    async fn stop(&mut self) -> Result<(), String> {
        self.stop.cancel();
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let joined = tokio::time::timeout(
            DRAIN_TIMEOUT + Duration::from_secs(20),
            tokio::task::spawn_blocking(move || thread.join()),
        )
        .await;
        match joined {
            Ok(Ok(Ok(r))) => r,
            Ok(Ok(Err(_))) => Err(format!("{} panicked", self.name)),
            Ok(Err(e)) => Err(format!("{}: {e}", self.name)),
            Err(_) => Err(format!("{} did not stop in time", self.name)),
        }
    }
}

/// Temporary files the demo made, removed when it ends.
struct Scratch {
    dir: Option<tempfile::TempDir>,
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
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
    std::fs::create_dir_all(&workspaces)
        .with_context(|| format!("cannot create {}", workspaces.display()))?;

    let stack = Stack::embedded(&db, &[QUEUE.to_string()], false).await?;
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

    let scripted = args.provider == "scripted";
    let mut base = WorkerConfig {
        queues: vec![QUEUE.to_string()],
        concurrency: args.concurrency as usize,
        lease_ttl: LEASE_TTL,
        heartbeat_interval: HEARTBEAT,
        reclaim_min_idle: RECLAIM_MIN_IDLE,
        reclaim_interval: RECLAIM_INTERVAL,
        drain_timeout: DRAIN_TIMEOUT,
        read_block: Duration::from_millis(500),
        workspace_root: workspaces.clone(),
        default_provider: args.provider.clone(),
        default_model: args.model.clone(),
        default_tools: demo_tools(),
        ..WorkerConfig::default()
    };
    if scripted {
        base.providers.script = Some(script().to_string());
    }
    // The endpoint is the host's setting, so the keys of the environment go to it.
    if let Some(url) = &args.base_url {
        match args.provider.as_str() {
            "anthropic" => base.providers.anthropic_base_url = Some(url.clone()),
            _ => base.providers.openai_base_url = Some(url.clone()),
        }
    }

    let metrics = agentq_core::metrics::global();
    let reissued_before = metrics.llm_reissued.get();
    let interrupt = CancellationToken::new();
    crate::signals::cancel_on_signal(interrupt.clone());

    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let name = format!("worker-{}", i + 1);
        let mut cfg = base.clone();
        cfg.consumer = format!("{}-{name}", agentq_worker::default_consumer_name());
        let worker = Worker::new(stack.store.clone(), stack.queue.clone(), cfg);
        workers.push(DemoWorker::start(name, worker, stop.clone())?);
    }

    // Submit the batch: rows first, then queue entries (what the scheduler's API does).
    let news: Vec<NewSession> = (0..args.sessions as usize)
        .map(|i| NewSession::root(session_spec(i, &args), QUEUE))
        .collect();
    let t0 = Instant::now();
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

    let total = u64::from(args.sessions);
    let progress = Progress::new(total, args.json);
    progress.note(&format!(
        "agentq demo: {total} sessions, {} workers × {}, {}",
        args.workers,
        args.concurrency,
        if scripted {
            "scripted model".to_string()
        } else {
            format!("{} model", args.provider)
        }
    ));
    let kill_target = ((total as f64 * KILL_AT).ceil() as u64).clamp(1, total);
    let may_kill = !args.no_kill && workers.len() >= 2;
    let mut kill: Option<(String, f64, u64)> = None;
    let mut target_reached: Option<Instant> = None;
    let mut interrupted: Vec<(String, i64)> = Vec::new();
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    let mut last_plain = Instant::now();
    let mut failure: Option<String> = None;
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = interrupt.cancelled() => {
                failure = Some("interrupted".into());
                break;
            }
        }
        let counts = count_by_status(&sqlite, true).await?;
        let resumed = taken_over(stack.store.as_ref(), &interrupted).await;
        let done: u64 = counts
            .iter()
            .filter(|(s, _)| SessionStatus::parse(s).is_some_and(|s| s.is_terminal()))
            .map(|(_, n)| n)
            .sum();
        let running: usize = workers.iter().map(DemoWorker::running).sum();
        if may_kill && kill.is_none() && done >= kill_target && done < total {
            let since = *target_reached.get_or_insert_with(Instant::now);
            if let Some(i) = pick_victim(stack.store.as_ref(), &workers, since).await {
                let victim = &mut workers[i];
                let ids = victim.worker.active_sessions();
                victim.kill();
                let at = t0.elapsed().as_secs_f64();
                // Read after the kill, so nothing changes them any more: the sessions it
                // left unfinished, and the epoch of its lease on each.
                for id in ids {
                    if let Ok(Some(row)) = stack.store.get(&id).await
                        && !row.status.is_terminal()
                    {
                        interrupted.push((id, row.lease_epoch));
                    }
                }
                let n = interrupted.len();
                progress.note(&format!(
                    "killed {} at {at:.1} s while it ran {n} session(s): its leases expire in {} s, \
                     then the other workers resume them from their last checkpoint",
                    victim.name,
                    LEASE_TTL.as_secs()
                ));
                kill = Some((victim.name.clone(), at, n as u64));
            }
        }
        let line = format!(
            "{done}/{total} done · {running} running · {resumed} resumed{}",
            match &kill {
                Some((name, _, _)) => format!(" · {name} killed"),
                None => String::new(),
            }
        );
        progress.update(done, &line, t0.elapsed());
        if !progress.is_bar() && last_plain.elapsed() >= PLAIN_EVERY {
            last_plain = Instant::now();
            progress.note(&format!("[{:5.1}s] {line}", t0.elapsed().as_secs_f64()));
        }
        if done >= total {
            break;
        }
        if Instant::now() >= deadline {
            failure = Some(format!(
                "only {done} of {total} sessions finished within --timeout-secs {}",
                args.timeout_secs
            ));
            break;
        }
    }
    let wall = t0.elapsed();
    progress.finish();

    for w in workers.iter_mut().filter(|w| !w.killed) {
        if let Err(e) = w.stop().await {
            eprintln!("agentq demo: {e}");
        }
    }
    // The killed workers' threads end at once (their runtime is gone); join them too.
    for w in workers.iter_mut().filter(|w| w.killed) {
        if let Some(t) = w.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }

    let rows = all_sessions(stack.store.as_ref()).await?;
    let reissued = metrics.llm_reissued.get().saturating_sub(reissued_before);
    let audit = llm_audit(stack.queue.as_ref(), &rows).await;
    let summary = summarize(
        &rows,
        SummaryRun {
            kill,
            interrupted: &interrupted,
            reissued,
            audit,
            wall,
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
    if let Some(f) = failure {
        eprintln!("agentq demo: failed: {f}");
        return Ok(ExitCode::FAILURE);
    }
    if !summary.durable {
        eprintln!(
            "agentq demo: failed: {} checkpointed LLM answer(s) were requested again",
            summary.llm_answers_requested_again
        );
        return Ok(ExitCode::FAILURE);
    }
    if !summary.all_completed {
        let bad: Vec<String> = summary
            .by_status
            .iter()
            .filter(|(s, _)| s.as_str() != "completed")
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        eprintln!(
            "agentq demo: failed: not every session completed ({})",
            bad.join(", ")
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The worker to kill, once it is worth it: the one with the most sessions past their
/// first step, as soon as one of them is midway (two steps checkpointed) — so the kill
/// interrupts sessions with history to resume rather than sessions that just started.
/// Past [`KILL_PATIENCE`] after the kill point, any worker that runs something will do.
async fn pick_victim(store: &dyn Store, workers: &[DemoWorker], since: Instant) -> Option<usize> {
    let mut best: Option<(usize, usize, u32)> = None; // (worker, progressed, max iteration)
    for (i, w) in workers.iter().enumerate().filter(|(_, w)| !w.killed) {
        let (mut progressed, mut max_iter) = (0, 0);
        for id in w.worker.active_sessions() {
            // A session that just checkpointed its end is no longer running: skip it.
            if let Ok(Some(row)) = store.get(&id).await
                && row.status == SessionStatus::Running
            {
                if row.iteration >= 1 {
                    progressed += 1;
                }
                max_iter = max_iter.max(row.iteration);
            }
        }
        if w.running() > 0 && best.is_none_or(|(_, p, _)| progressed > p) {
            best = Some((i, progressed, max_iter));
        }
    }
    let (i, _, max_iter) = best?;
    (max_iter >= 2 || since.elapsed() >= KILL_PATIENCE).then_some(i)
}

fn demo_tools() -> Vec<String> {
    ["write_file", "read_file", "list_dir"]
        .iter()
        .map(|s| s.to_string())
        .collect()
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

/// Of the sessions the kill interrupted (with their lease epoch then), how many another
/// worker has claimed since.
async fn taken_over(store: &dyn Store, interrupted: &[(String, i64)]) -> u64 {
    let mut n = 0;
    for (id, epoch) in interrupted {
        if let Ok(Some(row)) = store.get(id).await
            && row.lease_epoch > *epoch
        {
            n += 1;
        }
    }
    n
}

/// Every session in the store, through the `Store` API (pages of 1000, newest first).
pub async fn all_sessions(store: &dyn Store) -> anyhow::Result<Vec<SessionRow>> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list(&ListFilter {
                limit: 1000,
                cursor: cursor.clone(),
                ..ListFilter::default()
            })
            .await
            .context("cannot list sessions")?;
        let Some(last) = page.last() else { break };
        cursor = Some(last.id.clone());
        let full = page.len() == 1000;
        out.extend(page);
        if !full {
            break;
        }
    }
    Ok(out)
}

struct SummaryRun<'a> {
    kill: Option<(String, f64, u64)>,
    /// Sessions the kill left unfinished, with their lease epoch at the kill.
    interrupted: &'a [(String, i64)],
    reissued: u64,
    audit: LlmAudit,
    wall: Duration,
    workers: u32,
    concurrency: u32,
    db: &'a Path,
    workspaces: &'a Path,
}

fn summarize(rows: &[SessionRow], run: SummaryRun<'_>) -> Summary {
    let mut by_status = BTreeMap::new();
    let mut by_reason = BTreeMap::new();
    let (mut iterations, mut input, mut output) = (0u64, 0u64, 0u64);
    let mut resumed_sessions = Vec::new();
    let mut latencies = Vec::new();
    for r in rows {
        *by_status.entry(r.status.to_string()).or_insert(0) += 1;
        if let Some(reason) = r.finish_reason {
            *by_reason.entry(reason.to_string()).or_insert(0) += 1;
        }
        iterations += u64::from(r.iteration);
        input += r.usage.input_tokens;
        output += r.usage.output_tokens;
        if run
            .interrupted
            .iter()
            .any(|(id, epoch)| *id == r.id && r.lease_epoch > *epoch)
        {
            resumed_sessions.push(r.id.clone());
        }
        if r.parent_id.is_none()
            && let Some(f) = r.finished_at
        {
            latencies.push(u64::try_from((f - r.created_at).num_milliseconds()).unwrap_or(0));
        }
    }
    latencies.sort_unstable();
    let roots = rows.iter().filter(|r| r.parent_id.is_none()).count() as u64;
    let completed = by_status.get("completed").copied().unwrap_or(0);
    let secs = run.wall.as_secs_f64().max(1e-9);
    let (killed_worker, killed_at_secs, killed_running) = match run.kill {
        Some((n, at, k)) => (Some(n), Some(at), k),
        None => (None, None, 0),
    };
    Summary {
        sessions: rows.len() as u64,
        root_sessions: roots,
        sub_agents: rows.len() as u64 - roots,
        completed,
        all_completed: !rows.is_empty() && completed == rows.len() as u64,
        durable: run.audit.repeated == 0,
        by_status,
        by_finish_reason: by_reason,
        iterations,
        input_tokens: input,
        output_tokens: output,
        killed_worker,
        killed_at_secs,
        killed_running,
        resumed: resumed_sessions.len() as u64,
        resumed_sessions,
        llm_reissued: run.reissued,
        llm_reissued_seen: run.audit.reissued,
        llm_answers_requested_again: run.audit.repeated,
        wall_secs: run.wall.as_secs_f64(),
        sessions_per_sec: roots as f64 / secs,
        iterations_per_sec: iterations as f64 / secs,
        latency_p50_ms: percentile(&latencies, 50),
        latency_p95_ms: percentile(&latencies, 95),
        workers: run.workers,
        concurrency: run.concurrency,
        db: run.db.display().to_string(),
        workspaces: run.workspaces.display().to_string(),
    }
}

/// What the sessions' event streams tell about LLM calls made more than once.
#[derive(Debug, Default, Clone, Copy)]
struct LlmAudit {
    /// A later run started a call at a history position where an earlier run had started
    /// one and never got (or never checkpointed) its answer.
    reissued: u64,
    /// A later run started a call at a position whose answer an earlier run had
    /// checkpointed (`iteration_completed` is emitted after the write-ahead checkpoint).
    repeated: u64,
}

/// Read the event streams of the sessions that ran more than once (lease epoch above 1)
/// and count, per history position, the calls later runs made again. Events are tagged
/// with the run's lease epoch and the history position they belong to.
async fn llm_audit(queue: &dyn agentq_core::Queue, rows: &[SessionRow]) -> LlmAudit {
    use std::collections::BTreeSet;
    let mut audit = LlmAudit::default();
    for r in rows.iter().filter(|r| r.lease_epoch > 1) {
        let Ok(events) = queue.read_events(&r.id, "0", 100_000, None).await else {
            continue;
        };
        // seq → (epochs that started a call there, epochs that checkpointed its answer)
        let mut at: BTreeMap<u64, (BTreeSet<i64>, BTreeSet<i64>)> = BTreeMap::new();
        for e in &events {
            let kind = serde_json::from_str::<serde_json::Value>(&e.data)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string));
            let slot = at.entry(e.seq).or_default();
            match kind.as_deref() {
                Some("iteration_started") => {
                    slot.0.insert(e.epoch);
                }
                Some("iteration_completed") => {
                    slot.1.insert(e.epoch);
                }
                _ => {}
            }
        }
        for (started, completed) in at.values() {
            for &later in started {
                if completed.iter().any(|&e| e < later) {
                    audit.repeated += 1;
                } else if started.iter().any(|&e| e < later) {
                    audit.reissued += 1;
                }
            }
        }
    }
    audit
}

/// Nearest-rank percentile of sorted values (0 when there are none).
fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p as usize * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

fn print_table(s: &Summary, temporary: bool) {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut push = |k: &str, v: String| rows.push((k.to_string(), v));
    push(
        "sessions",
        if s.sub_agents > 0 {
            format!(
                "{} ({} + {} sub-agents), {} completed",
                s.sessions, s.root_sessions, s.sub_agents, s.completed
            )
        } else {
            format!("{}, {} completed", s.sessions, s.completed)
        },
    );
    for (reason, n) in &s.by_finish_reason {
        push(&format!("  finish reason {reason}"), n.to_string());
    }
    for (status, n) in s
        .by_status
        .iter()
        .filter(|(k, _)| k.as_str() != "completed")
    {
        push(&format!("  status {status}"), n.to_string());
    }
    push("iterations", s.iterations.to_string());
    push(
        "tokens in / out",
        format!(
            "{} / {}",
            thousands(s.input_tokens),
            thousands(s.output_tokens)
        ),
    );
    match (&s.killed_worker, s.killed_at_secs) {
        (Some(w), Some(at)) => {
            push(
                "worker killed",
                format!(
                    "{w} at {at:.1} s, while it ran {} session(s)",
                    s.killed_running
                ),
            );
            push(
                "sessions resumed after it",
                format!(
                    "{}  (taken over by another worker, from their last checkpoint)",
                    s.resumed
                ),
            );
        }
        _ => push("worker killed", "none".into()),
    }
    push(
        "LLM calls re-issued",
        format!(
            "{}  (in flight in the killed worker: their answers had not arrived, so they were \
             asked again)",
            s.llm_reissued
        ),
    );
    push(
        "checkpointed answers re-asked",
        format!(
            "{}  (must be 0: a resumed session never asks the model again for an answer it has)",
            s.llm_answers_requested_again
        ),
    );
    push("wall time", format!("{:.1} s", s.wall_secs));
    push(
        "throughput",
        format!(
            "{:.1} sessions/s, {:.1} iterations/s",
            s.sessions_per_sec, s.iterations_per_sec
        ),
    );
    push(
        "latency p50 / p95",
        format!(
            "{:.2} s / {:.2} s  (created → finished)",
            s.latency_p50_ms as f64 / 1000.0,
            s.latency_p95_ms as f64 / 1000.0
        ),
    );
    if !temporary {
        push("database", s.db.clone());
        push("workspaces", s.workspaces.clone());
    }
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    println!();
    for (k, v) in rows {
        println!("  {k:<width$}  {v}");
    }
    println!();
    if s.all_completed {
        println!("  every session completed.");
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The progress display: an indicatif bar on a terminal, plain lines (on stderr)
/// otherwise, so the summary on stdout stays clean.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(total: u64, json: bool) -> Self {
        let tty = std::io::stderr().is_terminal() && std::io::stdout().is_terminal() && !json;
        if !tty {
            return Progress { bar: None };
        }
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:32.cyan/blue} {msg}",
        ) {
            bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }

    fn is_bar(&self) -> bool {
        self.bar.is_some()
    }

    fn update(&self, done: u64, line: &str, _elapsed: Duration) {
        if let Some(b) = &self.bar {
            b.set_position(done);
            b.set_message(line.to_string());
        }
    }

    /// A line that stays (above the bar on a terminal).
    fn note(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 95), 95);
        assert_eq!(percentile(&[7], 95), 7);
        assert_eq!(percentile(&[], 50), 0);
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn script_parses_with_its_variants() {
        let s: agentq_agent::provider::scripted::Script = serde_json::from_value(script()).unwrap();
        assert_eq!(s.turns.len(), 4);
        assert_eq!(s.variants.len(), 2);
        // The reviewer's prompt must not select the lead's variant, nor the reverse.
        assert!(!REVIEW_MARK.contains(LEAD_MARK) && !LEAD_MARK.contains(REVIEW_MARK));
    }
}
