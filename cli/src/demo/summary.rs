//! The demo's summary, read back from the store: what it holds, how it is counted, and
//! the table it prints (`--json` prints [`Summary`] itself).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use agentq_core::protocol::EventKind;
use agentq_core::{ListFilter, SessionRow, SessionStatus, Store};

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

pub(super) struct SummaryRun<'a> {
    pub(super) kill: Option<(String, f64, u64)>,
    /// Sessions the kill left unfinished, with their lease epoch at the kill.
    pub(super) interrupted: &'a [(String, i64)],
    pub(super) reissued: u64,
    pub(super) audit: LlmAudit,
    pub(super) wall: Duration,
    pub(super) workers: u32,
    pub(super) concurrency: u32,
    pub(super) db: &'a Path,
    pub(super) workspaces: &'a Path,
}

pub(super) fn summarize(rows: &[SessionRow], run: SummaryRun<'_>) -> Summary {
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
    let completed = by_status
        .get(SessionStatus::Completed.as_str())
        .copied()
        .unwrap_or(0);
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
pub(super) struct LlmAudit {
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
pub(super) async fn llm_audit(queue: &dyn agentq_core::Queue, rows: &[SessionRow]) -> LlmAudit {
    use std::collections::BTreeSet;
    let mut audit = LlmAudit::default();
    for r in rows.iter().filter(|r| r.lease_epoch > 1) {
        let Ok(events) = queue.read_events(&r.id, "0", 100_000, None).await else {
            continue;
        };
        // seq → (epochs that started a call there, epochs that checkpointed its answer)
        let mut at: BTreeMap<u64, (BTreeSet<i64>, BTreeSet<i64>)> = BTreeMap::new();
        for e in &events {
            let slot = at.entry(e.seq).or_default();
            match EventKind::of_json(&e.data) {
                Some(EventKind::IterationStarted) => {
                    slot.0.insert(e.epoch);
                }
                Some(EventKind::IterationCompleted) => {
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

/// Nearest-rank percentile of sorted values (0 when there are none).
fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p as usize * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

pub(super) fn print_table(s: &Summary, temporary: bool) {
    let mut rows = count_rows(s);
    rows.extend(recovery_rows(s));
    rows.extend(speed_rows(s));
    if !temporary {
        rows.push(("database".to_string(), s.db.clone()));
        rows.push(("workspaces".to_string(), s.workspaces.clone()));
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

/// The rows of the table that count: sessions and how they ended, iterations, tokens.
fn count_rows(s: &Summary) -> Vec<(String, String)> {
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
        .filter(|(k, _)| k.as_str() != SessionStatus::Completed.as_str())
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
    rows
}

/// The rows of the table about the killed worker and what its sessions asked again.
fn recovery_rows(s: &Summary) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut push = |k: &str, v: String| rows.push((k.to_string(), v));
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
    rows
}

/// The rows of the table about time: wall time, throughput, latency.
fn speed_rows(s: &Summary) -> Vec<(String, String)> {
    vec![
        ("wall time".to_string(), format!("{:.1} s", s.wall_secs)),
        (
            "throughput".to_string(),
            format!(
                "{:.1} sessions/s, {:.1} iterations/s",
                s.sessions_per_sec, s.iterations_per_sec
            ),
        ),
        (
            "latency p50 / p95".to_string(),
            format!(
                "{:.2} s / {:.2} s  (created → finished)",
                s.latency_p50_ms as f64 / 1000.0,
                s.latency_p95_ms as f64 / 1000.0
            ),
        ),
    ]
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
}
