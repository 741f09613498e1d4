//! The forks part: a fork at the last step of a finished session whose history is 10,
//! 100 and 1,000 iterations long, many times each: how long one fork takes, and what it
//! adds to the database (Postgres' relation sizes of every table a fork writes, before
//! and after, per fork; and its `messages` rows). Sharing the prefix, both stay flat as
//! the prefix grows; a copy would grow with it.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;
use agentq_core::fork::{ForkResult, NewFork};
use agentq_core::pg::PgStore;
use agentq_core::{Claim, LeaseStore, NewSession, SessionStore};

use crate::env::Env;
use crate::report::{ForkFigure, Results, ms, quantile};

/// The prefix lengths measured, in iterations.
const PREFIXES: [u32; 3] = [10, 100, 1_000];
/// Forks per prefix length.
const FORKS: usize = 200;
/// What a fork writes to.
const TABLES: &str = "'sessions', 'session_specs', 'messages', 'workspace_files', \
     'workspace_versions'";

pub async fn forks(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let store = &env.store;
    let queue = format!("bench-{}-forks", env.run);
    for steps in PREFIXES {
        crate::report::progress(&format!(
            "forks: {FORKS} forks of a {steps}-iteration session"
        ));
        let origin = finished_session(store, &queue, steps).await?;
        let prefix_bytes: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(pg_column_size(body)), 0)::bigint FROM messages \
             WHERE session_id = $1::uuid",
        )
        .bind(&origin)
        .fetch_one(store.pool())
        .await?;
        let (bytes0, rows0) = sizes(store).await?;
        let mut times = Vec::with_capacity(FORKS);
        for _ in 0..FORKS {
            let f = NewFork {
                new: NewSession::root(SessionSpec::new("bench"), queue.clone()),
                origin: origin.clone(),
                at_iteration: steps,
                message: Some("Try the other way.".into()),
            };
            let t = Instant::now();
            let forked = store.fork_session(&f).await?;
            times.push(t.elapsed());
            if !matches!(forked, ForkResult::Forked(_)) {
                bail!("forks: the fork of {origin} at {steps} was refused: {forked:?}");
            }
        }
        let (bytes1, rows1) = sizes(store).await?;
        times.sort();
        let q = |x: f64| quantile(&times, x).map_or(0.0, ms);
        r.forks.push(ForkFigure {
            steps,
            prefix_bytes,
            fork_p50_ms: q(0.5),
            fork_p99_ms: q(0.99),
            bytes_per_fork: (bytes1 - bytes0) as f64 / FORKS as f64,
            message_rows_per_fork: (rows1 - rows0) as f64 / FORKS as f64,
        });
    }
    Ok(())
}

/// The tables' total size (heap, indexes, TOAST) and the `messages` rows, after a
/// checkpoint of the statistics.
async fn sizes(store: &PgStore) -> anyhow::Result<(i64, i64)> {
    let bytes: i64 = sqlx::query_scalar(&format!(
        "SELECT sum(pg_total_relation_size(t::regclass))::bigint \
         FROM unnest(ARRAY[{TABLES}]) AS t"
    ))
    .fetch_one(store.pool())
    .await?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(store.pool())
        .await?;
    Ok((bytes, rows))
}

/// A finished session of `steps` iterations, each a tool call and its result (about the
/// size of a short real one), written as one checkpoint.
async fn finished_session(store: &PgStore, queue: &str, steps: u32) -> anyhow::Result<String> {
    let spec = SessionSpec::new("Summarise the repository, file by file.");
    let (row, _) = store.create_session(&NewSession::root(spec, queue)).await?;
    let claim = store
        .claim(&row.id, "bench-forks", Duration::from_secs(600), 10)
        .await?;
    let Claim::Acquired {
        lease, mut state, ..
    } = claim
    else {
        bail!("forks: cannot claim {}: {claim:?}", row.id);
    };
    for i in 0..steps {
        let mut m = Message::assistant(format!("Reading file {i} to see what it does."));
        m.tool_calls = vec![ToolCall {
            id: format!("call_{i}"),
            name: "read_file".into(),
            arguments: json!({ "path": format!("src/file_{i}.rs") }).into(),
        }];
        state.push_assistant(m);
        state.messages.push(Message::tool_result(
            format!("call_{i}"),
            "read_file",
            "fn main() { println!(\"hello\"); }\n".repeat(8),
            false,
        ));
    }
    state.push_assistant(Message::assistant("Done."));
    state.outcome = Some(Outcome {
        reason: ExitReason::Stop,
        result: Some("Done.".into()),
        error: None,
    });
    store.checkpoint(&lease, &state, 1).await?;
    Ok(row.id)
}
