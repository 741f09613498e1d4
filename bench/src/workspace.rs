//! The workspace part: how long a worker takes to have a tree's committed files on its
//! disk when it claims the tree — cold (an empty cache: another machine, every blob
//! fetched) and warm (the cache as committed: each file checked by `stat` against the
//! local index, nothing fetched) — for a workspace of `--workspace-files` files and
//! `--workspace-mb` MB, through the worker's own materialise step. Then what a tool round
//! costs the store when its tool touches no file and when it writes one: commits, rows
//! written and bytes stored per round, the same sessions on the same worker.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio_util::sync::CancellationToken;

use agentq_agent::provider::scripted::{Script, ScriptedCall, Turn};

use agentq_agent::spec::SessionSpec;
use agentq_core::workspace::InputFile;
use agentq_core::{NewSession, SessionStore};
use agentq_worker::workspace::materialise;

use crate::env::Env;
use crate::report::{Results, ms, progress, quantile};
use crate::turns::{FINAL_TEXT, TRIVIAL, TURN_TEXT};
use crate::workload;

/// Rounds of each kind; the median is reported.
const ROUNDS: usize = 3;

/// `len` bytes of content unique to file `i` (distinct blobs: nothing is deduplicated
/// away), cheap to make.
fn content(i: usize, len: usize) -> Vec<u8> {
    let mut x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub async fn workspace(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let files = env.args.workspace_files as usize;
    let total = usize::try_from(env.args.workspace_mb)
        .unwrap_or(usize::MAX)
        .saturating_mul(1_000_000);
    let per = total / files.max(1);
    progress(&format!(
        "workspace: resuming a tree of {files} files, {} MB",
        env.args.workspace_mb
    ));
    let mut new = NewSession::root(SessionSpec::new("bench workspace"), env.queue("workspace"));
    new.files = (0..files)
        .map(|i| InputFile {
            path: format!("d{:02}/f{i:05}.bin", i % 32),
            data: content(i, per),
        })
        .collect();
    env.store.create_session(&new).await?;
    let root = new.root_id.clone();
    drop(new);

    let mut cold: Vec<Duration> = Vec::new();
    let mut dir = env.scratch.join("ws-cold-0");
    let mut index = env.scratch.join("ws-cold-0.index.json");
    for round in 0..ROUNDS {
        dir = env.scratch.join(format!("ws-cold-{round}"));
        index = env.scratch.join(format!("ws-cold-{round}.index.json"));
        let t = Instant::now();
        let m = materialise(&env.store, &root, &dir, &index).await?;
        cold.push(t.elapsed());
        if m.fetched != files {
            bail!(
                "workspace: a cold resume fetched {} of {files} files",
                m.fetched
            );
        }
    }
    let mut warm: Vec<Duration> = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let m = materialise(&env.store, &root, &dir, &index).await?;
        warm.push(t.elapsed());
        if m.fetched != 0 || m.files != files {
            bail!(
                "workspace: a warm resume fetched {} files (of {})",
                m.fetched,
                m.files
            );
        }
    }
    cold.sort();
    warm.sort();
    r.workspace_files = Some(files);
    r.workspace_bytes = Some(u64::try_from(per.saturating_mul(files)).unwrap_or(u64::MAX));
    r.workspace_resume_cold_ms = quantile(&cold, 0.5).map(ms);
    r.workspace_resume_warm_ms = quantile(&warm, 0.5).map(ms);
    for round in 0..ROUNDS {
        let _ = std::fs::remove_dir_all(env.scratch.join(format!("ws-cold-{round}")));
    }
    rounds(env, r).await
}

/// Sessions and tool rounds of each storage run.
const ROUND_SESSIONS: u32 = 20;
const ROUND_ITERATIONS: u32 = 11;
/// Bytes each write of the writing run puts in its file.
const WRITE_BYTES: usize = 256;

/// The same scripted sessions twice: each tool round calling the trivial tool (no file),
/// then `write_file` (a new file each round).
async fn rounds(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    progress(&format!(
        "workspace: {ROUND_SESSIONS} sessions x {} tool rounds, touching no file, then \
         writing one",
        ROUND_ITERATIONS - 1
    ));
    let none = round_cost(env, TRIVIAL, "wsnone").await?;
    let write = round_cost(env, "write_file", "wswrite").await?;
    r.workspace_round_nofile = Some(none);
    r.workspace_round_write = Some(write);
    Ok(())
}

/// The scripted model of the writing run: every turn but the last writes a new file.
fn write_script(iterations: u32) -> String {
    let mut turns: Vec<Turn> = (1..iterations)
        .map(|i| Turn {
            text: TURN_TEXT.into(),
            tool_calls: vec![ScriptedCall {
                name: "write_file".into(),
                arguments: serde_json::json!({
                    "path": format!("out/f{i}.txt"),
                    "content": "w".repeat(WRITE_BYTES),
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    turns.push(Turn {
        text: FINAL_TEXT.into(),
        ..Default::default()
    });
    serde_json::to_string(&Script {
        turns,
        ..Script::default()
    })
    .unwrap_or_default()
}

/// What the store did in a run: commits of the whole database (`pg_stat_database`), rows
/// inserted, updated or deleted in the session and workspace tables
/// (`pg_stat_user_tables`), and those tables' sizes after a VACUUM. The statistics are
/// flushed as each connection goes (the workers' pools are closed before the second
/// reading), so a few rows of the bench's own connection may count in either run.
#[derive(Debug, Clone, Copy)]
struct Counters {
    commits: i64,
    rows: i64,
    bytes: i64,
}

async fn counters(env: &Env) -> anyhow::Result<Counters> {
    sqlx::query("VACUUM sessions, session_specs, messages, workspace_files, blobs")
        .execute(env.store.pool())
        .await?;
    // Statistics reach the view when each backend flushes them (within a second).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (commits, rows, bytes): (i64, i64, i64) = sqlx::query_as(
        "WITH t AS (SELECT unnest(ARRAY['sessions', 'session_specs', 'messages', \
                                         'workspace_files', 'blobs']) AS name) \
         SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()), \
                (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del)::bigint FROM pg_stat_user_tables \
                   WHERE relname IN (SELECT name FROM t)), \
                (SELECT sum(pg_total_relation_size(name::regclass))::bigint FROM t)",
    )
    .fetch_one(env.store.pool())
    .await?;
    Ok(Counters {
        commits,
        rows,
        bytes,
    })
}

/// Per tool round of one run: commits, rows written, bytes stored.
async fn round_cost(env: &Env, tool: &str, part: &'static str) -> anyhow::Result<[f64; 3]> {
    let queue = env.queue(part);
    let script = if tool == TRIVIAL {
        workload::script(ROUND_ITERATIONS, 0, tool)
    } else {
        write_script(ROUND_ITERATIONS)
    };
    let (wk, store) = workload::worker(env, &queue, part, 64, &script, tool).await?;
    let shutdown = CancellationToken::new();
    let handle = {
        let (w, s) = (wk.clone(), shutdown.clone());
        tokio::spawn(async move { w.run(s).await })
    };
    let ids =
        workload::create_sessions(env, &queue, ROUND_SESSIONS, ROUND_ITERATIONS, tool).await?;
    let before = counters(env).await?;
    let redis = agentq_core::redis_queue::RedisQueue::connect(&env.redis_url).await?;
    workload::enqueue(&redis, &queue, &ids).await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let waited = loop {
        if wk.stats().completed.load(Ordering::Relaxed) >= u64::from(ROUND_SESSIONS) {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err(anyhow::anyhow!(
                "workspace: the {part} sessions did not finish"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shutdown.cancel();
    let _ = handle.await;
    workload::close(&store).await;
    waited?;
    let after = counters(env).await?;
    let (ok,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM sessions WHERE id = ANY($1) AND status = 'completed'")
            .bind(&ids)
            .fetch_one(env.store.pool())
            .await?;
    if ok != i64::from(ROUND_SESSIONS) {
        bail!("workspace: {ok} of {ROUND_SESSIONS} {part} sessions completed");
    }
    let n = f64::from(ROUND_SESSIONS) * f64::from(ROUND_ITERATIONS - 1);
    let per = |a: i64, b: i64| (a - b) as f64 / n;
    Ok([
        per(after.commits, before.commits),
        per(after.rows, before.rows),
        per(after.bytes, before.bytes),
    ])
}
