//! The workspace part: how long a worker takes to have a tree's committed files on its
//! disk when it claims the tree — cold (an empty cache: another machine, every blob
//! fetched) and warm (the cache as committed: each file checked by `stat` against the
//! local index, nothing fetched) — for a workspace of `--workspace-files` files and
//! `--workspace-mb` MB, through the worker's own materialise step.

use std::time::{Duration, Instant};

use anyhow::bail;

use agentq_agent::spec::SessionSpec;
use agentq_core::workspace::InputFile;
use agentq_core::{NewSession, SessionStore};
use agentq_worker::workspace::materialise;

use crate::{Env, Results, ms, progress, quantile};

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
    Ok(())
}
