//! Retention of durable workspaces, run beside the sweeper: the files of trees whose root
//! finished more than `[workspace] ttl_secs` ago are deleted, then the contents no
//! workspace holds any more (and that nothing touched for the grace period, so a commit
//! about to reference one is never robbed of it) are collected; each in bounded batches
//! until a batch comes back short.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentq_core::Store;
use agentq_core::config::WorkspaceSection;

/// Batches of one pass at most, so that a large backlog never holds up shutdown.
const MAX_BATCHES_PER_PASS: u32 = 20;

pub async fn run_workspace_gc(
    store: Arc<dyn Store>,
    cfg: WorkspaceSection,
    shutdown: CancellationToken,
) {
    let every = Duration::from_secs(cfg.gc_interval_secs.max(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = gc_pass(store.as_ref(), &cfg) => {}
        }
    }
}

/// One pass: expiry, then collection. Errors are retried at the next tick.
pub async fn gc_pass(store: &dyn Store, cfg: &WorkspaceSection) {
    let batch = cfg.gc_batch.max(1);
    if cfg.ttl_secs > 0 {
        let ttl = Duration::from_secs(cfg.ttl_secs);
        for _ in 0..MAX_BATCHES_PER_PASS {
            match store.expire_workspaces(ttl, batch).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(trees = n, "expired finished trees' workspaces");
                    }
                    // A short batch: nothing more is due.
                    if n < u64::from(batch) {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "expiring workspaces failed; retrying next tick");
                    return;
                }
            }
        }
    }
    let grace = Duration::from_secs(cfg.blob_grace_secs);
    for _ in 0..MAX_BATCHES_PER_PASS {
        match store.collect_blobs(grace, batch).await {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(blobs = n, "collected unreferenced workspace contents");
                }
                if n < u64::from(batch) {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "collecting workspace contents failed; retrying next tick");
                return;
            }
        }
    }
}
