//! The sweeper: enqueue is "insert the row, then `XADD`", and a crash (or a Redis outage)
//! between the two leaves a queued row that no worker will ever see. Every
//! `sweep_interval` the sweeper adds an entry for queued rows older than `sweep_age` that
//! were never marked enqueued, then marks them. A duplicate entry (the `XADD` happened but
//! the mark did not) is harmless: the lease decides who runs a session.
//!
//! The store is also the truth for liveness: a running session whose worker's liveness row
//! expired has lost its worker, and its stream entry may be gone too (lost with Redis, or
//! never added, or acked at its claim), so the sweeper re-queues it from the store whatever
//! became of the entry (`lifecycle::requeue_orphans`, which workers run too, more often;
//! [`requeue_expired`] for an owner without a liveness row), and forgets the rows of
//! workers long stopped. It also trims each queue's stream of acked history
//! past `stream_max_len` entries ([`trim_queues`]), never an entry still pending. And it
//! settles again finished sessions whose worker died before it was done
//! ([`settle_unannounced`]). It wakes what waits for time: approvals past their deadline ([`wake_expired_approvals`])
//! and sessions suspended for a rate limit whose wake time has come
//! ([`wake_rate_limited`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentq_core::{EnqueueReason, Queue, Store};

use crate::queues::QueueRegistry;

/// Rows fetched per query.
pub const SWEEP_BATCH: u32 = 500;
/// How long the liveness row of a stopped worker is kept once it owns no running session.
const FORGET_WORKERS_AFTER: Duration = Duration::from_secs(3_600);
/// Batches per tick at most, so one tick of a large backlog stays bounded.
const MAX_BATCHES_PER_TICK: usize = 20;

/// One pass: enqueue up to `SWEEP_BATCH × 20` forgotten sessions. Returns how many were
/// re-added. A queue that fails is skipped (and retried next pass); the others proceed.
pub async fn sweep_once(
    store: &dyn Store,
    queue: &dyn Queue,
    queues: &QueueRegistry,
    age: Duration,
) -> agentq_core::Result<usize> {
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_TICK {
        let rows = store.unenqueued(age, SWEEP_BATCH).await?;
        let fetched = rows.len();
        if fetched == 0 {
            break;
        }
        let mut by_queue: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (id, q) in rows {
            by_queue.entry(q).or_default().push(id);
        }
        let mut failed = false;
        for (q, ids) in by_queue {
            queues.ensure(queue, &q).await;
            let items: Vec<(String, EnqueueReason)> = ids
                .iter()
                .map(|id| (id.clone(), EnqueueReason::Retry))
                .collect();
            if let Err(e) = queue.enqueue_many(&q, &items).await {
                tracing::warn!(queue = %q, sessions = ids.len(), error = %e, "sweeper: enqueue failed; retrying next tick");
                failed = true;
                continue;
            }
            store.mark_enqueued(&ids).await?;
            tracing::info!(queue = %q, sessions = ids.len(), "sweeper: re-added sessions that had no stream entry");
            total += ids.len();
        }
        // A failed queue would come back first in the next query: stop for this tick.
        if failed || fetched < SWEEP_BATCH as usize {
            break;
        }
    }
    Ok(total)
}

/// Running sessions whose lease expired more than `grace` ago lose their enqueued mark, so
/// that the next [`sweep_once`] adds them to their queue again. Returns how many.
pub async fn requeue_expired(store: &dyn Store, grace: Duration) -> agentq_core::Result<u64> {
    let limit = SWEEP_BATCH.saturating_mul(u32::try_from(MAX_BATCHES_PER_TICK).unwrap_or(1));
    let n = store.forget_expired_entries(grace, limit).await?;
    if n > 0 {
        tracing::warn!(
            sessions = n,
            "sweeper: re-queueing running sessions whose lease expired"
        );
    }
    Ok(n)
}

/// Trim each known queue's stream of acked history once it is longer than `max_len`.
/// A queue that fails is logged and tried again next pass.
pub async fn trim_queues(queue: &dyn Queue, queues: &QueueRegistry, max_len: u64) {
    for q in queues.names() {
        match queue.trim(&q, max_len).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(queue = %q, entries = n, "trimmed acked queue history"),
            Err(e) => tracing::debug!(queue = %q, error = %e, "cannot trim the queue"),
        }
    }
}

/// A queue whose Redis came back empty lost the entries of every queued and running
/// session: mark them all un-enqueued so this sweep re-adds them. Duplicates are harmless.
pub async fn recover_lost(store: &dyn Store, queue: &dyn Queue, queues: &QueueRegistry) {
    for q in queues.names() {
        match queue.check_lost(&q).await {
            Ok(false) => {}
            Ok(true) => match store.reset_enqueued(&q).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::warn!(queue = %q, sessions = n, "queue data lost (Redis restarted empty?); re-adding its sessions");
                    }
                    if let Err(e) = queue.mark_queue(&q).await {
                        tracing::warn!(queue = %q, error = %e, "cannot mark the queue");
                    }
                }
                Err(e) => tracing::warn!(queue = %q, error = %e, "cannot reset enqueued marks"),
            },
            Err(e) => tracing::debug!(queue = %q, error = %e, "cannot check the queue marker"),
        }
    }
}

/// Sessions whose approval request ran out of time go back to the queue; their held calls
/// are then denied with `timeout` by the worker that resumes them.
pub async fn wake_expired_approvals(store: &dyn Store, queue: &dyn Queue) {
    match store.wake_expired_approvals(SWEEP_BATCH).await {
        Ok(woken) => {
            for w in woken {
                tracing::info!(session_id = %w.id, held = w.held, "approval timed out; resuming the session");
                if !w.held {
                    agentq_core::lifecycle::enqueue_woken(store, queue, &w.id, &w.queue).await;
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot check approval deadlines"),
    }
}

/// Finished sub-agents whose allowance did not go back to their parent (their worker died
/// between the finish and the give-back, or they were cancelled or dead-lettered without
/// a run) give it back now, and their parent hears of them: a parent's budget is never
/// held by a child that has ended, and a parent waiting for what its children hold is
/// woken (telling it twice is a no-op).
pub async fn return_budgets(store: &dyn Store, queue: &dyn Queue) {
    match store.unreturned_budgets(SWEEP_BATCH).await {
        Ok(ids) => {
            for id in ids {
                let told = match store.get(&id).await {
                    Ok(Some(child)) => {
                        agentq_core::lifecycle::notify_parent(store, queue, &child).await
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = told {
                    tracing::warn!(session_id = %id, error = %e, "cannot give a finished sub-agent's budget back");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot look for unreturned budgets"),
    }
}

/// The sweeper's pace and bounds ([`run_sweeper`]).
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// How often it passes.
    pub interval: Duration,
    /// How long a queued row without an entry, a finished session not announced or an
    /// expired lease is left to its worker before the sweeper acts on it.
    pub age: Duration,
    /// Length past which a queue stream's acked history is trimmed.
    pub stream_max_len: u64,
    /// How long the event stream of a finished session it settles is kept.
    pub event_ttl: Duration,
}

/// Finished sessions whose settling was not marked done `grace` after their finish (their
/// worker died between the terminal commit and the end of settling; the entry was acked
/// at the claim, so no redelivery does it) are settled again: stream expiry set (`event_ttl`),
/// parent told, follow-up started, completion published. Returns how many.
pub async fn settle_unannounced(
    store: &dyn Store,
    queue: &dyn Queue,
    grace: Duration,
    event_ttl: Duration,
) -> usize {
    let rows = match store.unannounced(grace, SWEEP_BATCH).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot look for unsettled finished sessions");
            return 0;
        }
    };
    let mut settled = 0;
    for row in rows {
        match agentq_core::lifecycle::settle_again(store, queue, &row, event_ttl).await {
            Ok(()) => {
                tracing::info!(session_id = %row.id, "settled a finished session its worker left unsettled");
                settled += 1;
            }
            Err(e) => {
                tracing::warn!(session_id = %row.id, error = %e, "cannot settle a finished session; retrying next tick")
            }
        }
    }
    settled
}

/// Sessions that suspended for a rate limit and whose wake time has come go back to the
/// queue, those due longest first, up to `SWEEP_BATCH × 20` a tick. Returns how many.
pub async fn wake_rate_limited(store: &dyn Store, queue: &dyn Queue) -> usize {
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_TICK {
        let woken = match store.wake_due(SWEEP_BATCH).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot wake rate-limited sessions; retrying next tick");
                break;
            }
        };
        let n = woken.len();
        let mut by_queue: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        // A capped one is held for the dispatcher, which lets it run within its cap.
        for w in woken.into_iter().filter(|w| !w.held) {
            by_queue.entry(w.queue).or_default().push(w.id);
        }
        for (q, ids) in by_queue {
            let items: Vec<(String, EnqueueReason)> = ids
                .iter()
                .map(|id| (id.clone(), EnqueueReason::Resume))
                .collect();
            // A failed enqueue leaves the rows queued without an entry: `sweep_once`
            // adds them.
            match queue.enqueue_many(&q, &items).await {
                Ok(()) => {
                    if let Err(e) = store.mark_enqueued(&ids).await {
                        tracing::warn!(queue = %q, error = %e, "cannot mark woken sessions enqueued");
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %q, error = %e, "cannot enqueue woken sessions; the sweeper will")
                }
            }
        }
        total += n;
        if n < SWEEP_BATCH as usize {
            break;
        }
    }
    if total > 0 {
        tracing::info!(
            sessions = total,
            "woke sessions whose rate-limit wait ended"
        );
    }
    total
}

/// Sweep every `sweep.interval` until `shutdown` is cancelled. Errors are logged; the next
/// tick tries again.
pub async fn run_sweeper(
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    queues: QueueRegistry,
    sweep: SweepSettings,
    shutdown: CancellationToken,
) {
    let SweepSettings {
        interval,
        age,
        stream_max_len,
        event_ttl,
    } = sweep;
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Queues configured at start whose group could not be created then.
        queues.ensure_configured(queue.as_ref()).await;
        recover_lost(store.as_ref(), queue.as_ref(), &queues).await;
        wake_expired_approvals(store.as_ref(), queue.as_ref()).await;
        return_budgets(store.as_ref(), queue.as_ref()).await;
        settle_unannounced(store.as_ref(), queue.as_ref(), age, event_ttl).await;
        wake_rate_limited(store.as_ref(), queue.as_ref()).await;
        let names = queues.names();
        match agentq_core::lifecycle::requeue_orphans(store.as_ref(), queue.as_ref(), &names).await
        {
            Ok(requeued) => {
                if !requeued.is_empty() {
                    tracing::warn!(
                        sessions = requeued.len(),
                        "sweeper: re-queued the sessions of workers that stopped heartbeating"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for dead workers' sessions; retrying next tick")
            }
        }
        if let Err(e) = store.forget_workers(FORGET_WORKERS_AFTER).await {
            tracing::warn!(error = %e, "cannot forget stopped workers; retrying next tick");
        }
        if let Err(e) = requeue_expired(store.as_ref(), age).await {
            tracing::warn!(error = %e, "cannot look for expired leases; retrying next tick");
        }
        trim_queues(queue.as_ref(), &queues, stream_max_len).await;
        let pass = sweep_once(store.as_ref(), queue.as_ref(), &queues, age);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = pass => if let Err(e) = r {
                tracing::warn!(error = %e, "sweeper pass failed; retrying next tick");
            }
        }
    }
}
