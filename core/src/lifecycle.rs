//! Session lifecycle steps that both the worker and the scheduler take, built from `Store`
//! and `Queue` calls: waking a session (and queueing it), telling a parent its child
//! finished, and cancelling a subtree; settling again a finished session whose worker
//! died before it was done ([`settle_again`]); re-queueing the sessions of workers that died
//! ([`requeue_orphans`]); and the embedded process's recovery at start
//! ([`requeue_runnable`], also `agentq_core::sqlite::requeue_runnable`).

// The crates below core by their own paths, not core's root: the root re-exports
// `requeue_runnable` from here, and a file must not import what imports it.
use std::time::Duration;

use agentq_error::{Error, Result};
use agentq_queue::queue::{Queue, WorkQueue};
use agentq_store::sqlite::SqliteStore;
use agentq_store::store::{Store, SweepStore};
use agentq_types::model::{
    CancelResult, Completion, EnqueueReason, ListFilter, SessionRow, SessionStatus, SpawnInfo,
    inbox_past,
};
use agentq_types::protocol::{ChildOutcome, InboxKind, InboxPayload, WorkerSignal};

/// Most descendants a cancel reaches (a runaway tree must not make it unbounded).
pub const MAX_CANCEL_CASCADE: usize = 10_000;

/// Put a session that was just woken (status back to `queued`, no stream entry) on its
/// queue. If the XADD fails the sweeper adds it later (its `enqueued_at` is unset).
pub async fn enqueue_woken(store: &dyn Store, queue: &dyn Queue, id: &str, queue_name: &str) {
    enqueue_one(store, queue, id, queue_name, EnqueueReason::Resume).await;
}

/// Give a queued session without a stream entry (new or woken) its entry, and mark it
/// enqueued. If the XADD fails the sweeper adds it later (its `enqueued_at` is unset).
pub async fn enqueue_one(
    store: &dyn Store,
    queue: &dyn Queue,
    id: &str,
    queue_name: &str,
    reason: EnqueueReason,
) {
    match queue.enqueue(queue_name, id, reason).await {
        Ok(()) => {
            if let Err(e) = store.mark_enqueued(&[id.to_string()]).await {
                tracing::warn!(session_id = id, error = %e, "cannot mark a session enqueued");
            }
        }
        Err(e) => {
            tracing::warn!(session_id = id, error = %e, "cannot enqueue a session; the sweeper will")
        }
    }
}

/// Deliver a finished child's result to its parent (idempotent: redelivering the same
/// completion is a no-op) and queue the parent if this woke it. Background children's
/// results go to the parent's inbox for injection; a foreground child only wakes it (the
/// parent's `spawn_agent` call reads the child's row).
pub async fn notify_parent(store: &dyn Store, queue: &dyn Queue, child: &SessionRow) -> Result<()> {
    let Some(parent) = child.parent_id.as_deref() else {
        return Ok(());
    };
    if !child.status.is_terminal() {
        return Ok(());
    }
    // The allowance goes back before the parent hears, so that the parent, woken by the
    // news, sees its budget with the child's unspent part in it. Once per child (the
    // store marks it); a crash before this leaves it to the sweeper.
    if child.spec.token_budget.is_some() {
        store.return_budget(&child.id).await?;
    }
    let info = SpawnInfo::of(&child.spec).unwrap_or_default();
    let kind = if info.wait {
        InboxKind::ChildDone
    } else {
        InboxKind::ChildResult
    };
    let payload = InboxPayload::Child(ChildOutcome::of(child, info));
    // Once per outcome: a redelivery of the same one is a no-op, and a child redriven
    // after a failure tells its parent its new outcome too (a parent still waiting for it
    // is woken to read it; one that moved on after the failure gets it as news).
    let dedupe = match child.retries {
        0 => format!("child:{}", child.id),
        n => format!("child:{}:retry:{n}", child.id),
    };
    let delivered = store
        .deliver(parent, kind, &dedupe, &payload, &[SessionStatus::Waiting])
        .await?;
    match delivered {
        // (Woken held for the dispatcher, it is not enqueued here: `d.woken` is false.)
        Some(d) if d.woken => enqueue_woken(store, queue, parent, &d.queue).await,
        // Running: tell its worker to look at the inbox at the next boundary rather
        // than only when it next suspends.
        Some(d) if d.inserted && d.status == SessionStatus::Running => {
            if let Err(e) = queue
                .publish_signal(&WorkerSignal::Wake(parent.to_string()))
                .await
            {
                tracing::debug!(session_id = parent, error = %e, "cannot signal the parent's worker");
            }
        }
        _ => {}
    }
    Ok(())
}

/// Tell the world about a cancel: for a session cancelled now, its event stream's expiry
/// (`event_ttl`; a session cancelled while waiting has a stream from its earlier runs, and
/// no worker settles it), its parent and its completion; a cancel request to the owning
/// worker for a running one. Best effort: the row is the truth (a worker that misses the
/// message sees the flag at its next heartbeat; what is not told now, the sweeper settles
/// again, the expiry included).
pub async fn announce_cancel(
    store: &dyn Store,
    queue: &dyn Queue,
    result: &CancelResult,
    event_ttl: Duration,
) {
    match result {
        CancelResult::CancelledNow(row) => {
            let mut told = true;
            if let Err(e) = queue.expire_events(&row.id, event_ttl).await {
                told = false;
                tracing::warn!(session_id = %row.id, error = %e, "cannot set the event stream's expiry of a cancelled session");
            }
            if let Err(e) = notify_parent(store, queue, row).await {
                told = false;
                tracing::warn!(session_id = %row.id, error = %e, "cannot notify the parent of a cancelled session");
            }
            if let Err(e) = queue.publish_completion(&Completion::from_row(row)).await {
                told = false;
                tracing::warn!(session_id = %row.id, error = %e, "cannot publish the completion of a cancelled session");
            }
            // Else the sweeper settles it again.
            if told && let Err(e) = store.mark_announced(&row.id).await {
                tracing::debug!(session_id = %row.id, error = %e, "cannot mark a cancelled session announced");
            }
        }
        CancelResult::Requested(row) => {
            let signal = WorkerSignal::Cancel(row.id.clone());
            if let Err(e) = queue.publish_signal(&signal).await {
                tracing::warn!(session_id = %row.id, error = %e, "cannot broadcast a cancel request");
            }
        }
        CancelResult::AlreadyFinished(_) | CancelResult::NotFound => {}
    }
}

/// Cancel every unfinished descendant of `root`, breadth first: cancelling a parent
/// cancels its children, and a parent that fails leaves no orphan running up its bill.
/// `event_ttl`: how long the stream of one cancelled now is kept ([`announce_cancel`]).
pub async fn cancel_descendants(
    store: &dyn Store,
    queue: &dyn Queue,
    root: &str,
    event_ttl: Duration,
) {
    let mut frontier = vec![root.to_string()];
    let mut reached = 0usize;
    while let Some(parent) = frontier.pop() {
        let children = match store
            .list(&ListFilter {
                parent_id: Some(parent.clone()),
                limit: 10_000,
                ..Default::default()
            })
            .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(session_id = %parent, error = %e, "cannot list children to cancel");
                continue;
            }
        };
        for child in children.into_iter().filter(|c| !c.status.is_terminal()) {
            reached += 1;
            if reached > MAX_CANCEL_CASCADE {
                tracing::warn!(
                    session_id = root,
                    "cancel cascade stopped at {MAX_CANCEL_CASCADE} descendants"
                );
                return;
            }
            match store.request_cancel(&child.id).await {
                Ok(r) => announce_cancel(store, queue, &r, event_ttl).await,
                Err(e) => tracing::warn!(session_id = %child.id, error = %e, "cannot cancel child"),
            }
            frontier.push(child.id);
        }
    }
}

/// If a finished session has `enqueue`d messages waiting, start the oldest as a new turn
/// (and queue it). Safe to race: the store starts each follow-up at most once. Returns
/// whether a turn was started.
pub async fn start_next_followup(
    store: &dyn Store,
    queue: &dyn Queue,
    row: &SessionRow,
) -> Result<bool> {
    // Nothing delivered since the last follow-up started: the common case, spared a query.
    if !row.status.is_terminal() || !inbox_past(row.wake_seq, row.followup_cursor) {
        return Ok(false);
    }
    let pending = store
        .inbox(&row.id, &[InboxKind::Followup], row.followup_cursor)
        .await?;
    let Some(next) = pending.first() else {
        return Ok(false);
    };
    // A malformed item must not block every follow-up behind it: it still starts its turn
    // (with no text), which moves the cursor past it.
    let text = match next.steer_message() {
        Ok(m) => m.content,
        Err(e) => {
            tracing::warn!(session_id = %row.id, error = %e, "a follow-up item is malformed");
            String::new()
        }
    };
    match store.follow_up(&row.id, &text, Some(next.seq)).await {
        Ok(Some(reopened)) => {
            // A capped one is held for the dispatcher instead.
            if !reopened.held {
                enqueue_woken(store, queue, &reopened.id, &reopened.queue).await;
            }
            Ok(true)
        }
        Ok(None) => Ok(false),
        // The tree's token budget has nothing left to give the session: the follow-up is
        // not started (nobody is there to be refused), and stays in the inbox unconsumed.
        Err(Error::NoBudget(message)) => {
            tracing::info!(session_id = %row.id, %message, "a queued follow-up is not started");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Settle a finished session again, as its worker would have ([`SweepStore::unannounced`]
/// found it: that worker died between the terminal commit and the end of settling): set
/// its event stream's expiry (`event_ttl`; the worker may not have got to it, and a stream
/// without one is kept for good), tell its parent (once: the delivery is idempotent),
/// cancel what it left running if it failed or was cancelled, start its next follow-up,
/// publish its completion (at least once: a duplicate is possible if the worker published
/// before it died), then mark it announced. A step that fails leaves it for the next pass.
pub async fn settle_again(
    store: &dyn Store,
    queue: &dyn Queue,
    row: &SessionRow,
    event_ttl: Duration,
) -> Result<()> {
    queue.expire_events(&row.id, event_ttl).await?;
    notify_parent(store, queue, row).await?;
    if matches!(row.status, SessionStatus::Failed | SessionStatus::Cancelled) {
        cancel_descendants(store, queue, &row.id, event_ttl).await;
    }
    start_next_followup(store, queue, row).await?;
    queue.publish_completion(&Completion::from_row(row)).await?;
    store.mark_announced(&row.id).await
}

/// Most sessions of dead workers one [`requeue_orphans`] pass re-queues.
pub const ORPHANS_PER_PASS: u32 = 1_000;

/// Running sessions of `queues` whose worker stopped heartbeating go back on their queue
/// at once (a new entry each; the store says which, each to one caller among the workers
/// and sweepers that look): another worker claims them and resumes from the last
/// checkpoint. Workers run this every `reclaim_interval`, the scheduler's sweeper too. A
/// failed enqueue leaves the session without an entry, which the next pass (or the
/// sweeper) adds. Returns the (id, queue) of each one re-queued.
pub async fn requeue_orphans(
    store: &dyn Store,
    queue: &dyn Queue,
    queues: &[String],
) -> Result<Vec<(String, String)>> {
    let orphans = store.requeue_orphans(queues, ORPHANS_PER_PASS).await?;
    let mut by_queue: std::collections::BTreeMap<String, Vec<(String, EnqueueReason)>> =
        std::collections::BTreeMap::new();
    for (id, q) in orphans {
        by_queue
            .entry(q)
            .or_default()
            .push((id, EnqueueReason::Retry));
    }
    let mut requeued = Vec::new();
    for (q, items) in by_queue {
        if let Err(e) = queue.enqueue_many(&q, &items).await {
            tracing::warn!(queue = %q, sessions = items.len(), error = %e, "cannot re-queue a dead worker's sessions; the sweeper will");
            continue;
        }
        let ids: Vec<String> = items.into_iter().map(|(id, _)| id).collect();
        store.mark_enqueued(&ids).await?;
        requeued.extend(ids.into_iter().map(|id| (id, q.clone())));
    }
    Ok(requeued)
}

/// Put every runnable session of `store` back on `queue` (embedded mode, at start: the
/// in-process queue lost its entries with the previous process). Marks them enqueued so
/// the sweeper leaves them alone. Duplicates of entries that do exist are harmless: the
/// lease decides. Returns how many entries were added.
pub async fn requeue_runnable(store: &SqliteStore, queue: &dyn WorkQueue) -> Result<usize> {
    let runnable = store.runnable_sessions().await?;
    let mut by_queue: std::collections::BTreeMap<String, Vec<(String, EnqueueReason)>> =
        std::collections::BTreeMap::new();
    for (id, q) in &runnable {
        by_queue
            .entry(q.clone())
            .or_default()
            .push((id.clone(), EnqueueReason::Resume));
    }
    for (q, items) in &by_queue {
        queue.ensure_queue(q).await?;
        queue.enqueue_many(q, items).await?;
    }
    let ids: Vec<String> = runnable.into_iter().map(|(id, _)| id).collect();
    store.mark_enqueued(&ids).await?;
    Ok(ids.len())
}
