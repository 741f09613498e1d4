//! Settling a session once it is past running here: tell the family of a terminal
//! session, start its follow-up turn, publish its completion and mark it announced; hand
//! a stopped session back to the queue; fail one outside any checkpoint; dead-letter one
//! delivered too often. Every step is idempotent: after a crash at any point before the
//! mark, the sweeper settles the session again (`SweepStore::unannounced`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{error, info, warn};

use agentq_core::lifecycle;
use agentq_core::queue::Delivery;
use agentq_core::{Completion, Lease, SessionRow, SessionStatus};

use super::processed::Processed;
use crate::backoff::Backoff;
use crate::inner::Inner;

/// A session reached a terminal status: its parent learns (idempotently), a failed or
/// cancelled one leaves no child running.
pub(super) async fn tell_family(inner: &Arc<Inner>, row: &SessionRow) {
    if let Err(e) = lifecycle::notify_parent(inner.store.as_ref(), inner.queue.as_ref(), row).await
    {
        warn!(error = %e, "notifying the parent failed; the sweeper retries");
    }
    if matches!(row.status, SessionStatus::Failed | SessionStatus::Cancelled) {
        lifecycle::cancel_descendants(
            inner.store.as_ref(),
            inner.queue.as_ref(),
            &row.id,
            inner.cfg.event_ttl,
        )
        .await;
    }
}

/// Everything after a terminal commit, in an order that survives a crash at any point
/// (each step is idempotent and the mark comes last): the event stream's expiry, parent,
/// children, follow-up turn, completion, the announced mark (and the entry's ack, unless
/// `acked`: the claim acked it already). Whether it got to the end.
pub(super) async fn settle_finished(
    inner: &Arc<Inner>,
    d: &Delivery,
    row: &SessionRow,
    acked: bool,
) -> bool {
    expire_stream(inner, &row.id).await;
    tell_family(inner, row).await;
    match lifecycle::start_next_followup(inner.store.as_ref(), inner.queue.as_ref(), row).await {
        Ok(true) => info!("started an enqueued follow-up turn"),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "starting a follow-up turn failed; the sweeper retries"),
    }
    publish_and_ack(inner, d, row, acked).await
}

/// Let a terminal session's event stream expire (after `event_ttl`): through the event
/// writer, behind the session's events still on their way, or here if the writer's
/// channel stayed full (or it stopped), which misses a stream one of those events makes
/// afterwards. Every way a session ends here passes through this ([`settle_finished`],
/// or beside it where a session is settled otherwise), or its stream (made without an
/// expiry) would be kept for good.
pub(super) async fn expire_stream(inner: &Arc<Inner>, session_id: &str) {
    if inner.pipeline.events.expire(session_id).await {
        return;
    }
    if let Err(e) = inner
        .queue
        .expire_events(session_id, inner.cfg.event_ttl)
        .await
    {
        warn!(error = %e, "setting the event stream's expiry failed");
    }
}

/// Fail the session with `reason` outside any checkpoint (the state may be what cannot be
/// stored, or unknown after a panic), then settle it like any finished session (`acked`:
/// the claim acked its entry). If the store cannot be reached the entry is left: the lease
/// expires and a redelivery decides.
pub(super) async fn fail_and_settle(
    inner: &Arc<Inner>,
    d: &Delivery,
    reason: &str,
    acked: bool,
) -> Processed {
    let failed = match inner.store.fail(&d.session_id, reason).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            ack_unless(inner, d, acked).await;
            return Processed::Dropped;
        }
        Err(e) => {
            warn!(error = %e, "failing the session failed; the lease expires instead");
            return Processed::Left;
        }
    };
    inner
        .metrics
        .sessions_finished
        .with_label_values(&[d.queue.as_str(), "error"])
        .inc();
    Processed::Finished {
        acked: settle_finished(inner, d, &failed, acked).await,
    }
}

/// The session was delivered `row.attempts` times and no run of it finished: its entry
/// moves to the dead-letter stream, and then it fails.
///
/// In that order: a row that says "moved to the dead-letter stream" is never without its
/// entry there. Failed first, a dead letter that could not be written (Redis down, the
/// worker gone) was never written: the entry's next delivery finds the session finished.
/// Dead-lettered first, the entry is acked and the claim's lease stands: a row that could
/// not be failed is given back by this worker's heartbeat (or its lease expires, if the
/// worker died) and queued again, and its next claim, exhausted again, dead-letters it
/// again. The dead-letter stream is at least once, as the queue is.
pub(super) async fn dead_letter(inner: &Arc<Inner>, d: &Delivery, row: &SessionRow) -> Processed {
    let reason = format!(
        "delivered {} times without finishing (each run died); moved to the dead-letter stream",
        row.attempts
    );
    error!(%reason, "dead-lettering session");
    if let Err(e) = inner.queue.dead_letter(d, &reason).await {
        warn!(error = %e, "dead-lettering failed; will retry");
        return Processed::Left;
    }
    let failed = match inner.store.fail(&d.session_id, &reason).await {
        Ok(Some(r)) => r,
        // Finished meanwhile by someone else (a cancel): its entry is acked already.
        Ok(None) => return Processed::Dropped,
        Err(e) => {
            warn!(error = %e, "failing a dead-lettered session failed; it is given back");
            return Processed::Left;
        }
    };
    inner.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
    expire_stream(inner, &d.session_id).await;
    inner.metrics.dead_letter.inc();
    inner
        .metrics
        .sessions_finished
        .with_label_values(&[d.queue.as_str(), "error"])
        .inc();
    tell_family(inner, &failed).await;
    if publish(inner, &failed).await {
        let _ = inner.store.mark_announced(&failed.id).await;
    }
    Processed::DeadLettered
}

/// Give a session back after a graceful stop: release the lease, put a fresh entry on the
/// queue so any worker resumes it at once, and ack the old one (unless `acked`: the claim
/// did). A crash in between only leaves duplicates, which the lease makes harmless.
/// `HandedBack` when it got that far, else `Left`.
pub(super) async fn hand_back(
    inner: &Arc<Inner>,
    d: &Delivery,
    lease: &Lease,
    acked: bool,
) -> Processed {
    if let Err(e) = inner.store.release(lease).await {
        warn!(error = %e, "releasing the lease failed; it will expire instead");
        return Processed::Left;
    }
    if let Err(e) = inner
        .queue
        .enqueue(&d.queue, &d.session_id, agentq_core::EnqueueReason::Resume)
        .await
    {
        warn!(error = %e, "re-enqueueing failed; the sweeper adds an entry");
        return Processed::Left;
    }
    // Else the sweeper adds another entry (the release forgot the old one).
    let _ = inner
        .store
        .mark_enqueued(std::slice::from_ref(&d.session_id))
        .await;
    if ack_unless(inner, d, acked).await {
        Processed::HandedBack
    } else {
        Processed::Left
    }
}

pub(super) async fn publish(inner: &Arc<Inner>, row: &SessionRow) -> bool {
    let completion = Completion::from_row(row);
    let mut backoff = Backoff::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match inner.queue.publish_completion(&completion).await {
            Ok(()) => return true,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let wait = backoff.next();
                warn!(error = %e, ?wait, "publishing the completion failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                error!(error = %e, "publishing the completion failed; the sweeper publishes it");
                return false;
            }
        }
    }
}

async fn publish_and_ack(inner: &Arc<Inner>, d: &Delivery, row: &SessionRow, acked: bool) -> bool {
    if !publish(inner, row).await {
        return false;
    }
    if let Err(e) = inner.store.mark_announced(&row.id).await {
        warn!(error = %e, "marking the session announced failed; the sweeper settles it again");
        return false;
    }
    ack_unless(inner, d, acked).await
}

/// [`ack`] unless the entry is acked already (`acked`: the claim's ack went through), which
/// spares every finished run a second round trip to Redis for the same entry.
pub(super) async fn ack_unless(inner: &Arc<Inner>, d: &Delivery, acked: bool) -> bool {
    acked || ack(inner, d).await
}

/// Whether the entry was acked (a few tries).
pub(super) async fn ack(inner: &Arc<Inner>, d: &Delivery) -> bool {
    let mut backoff = Backoff::new();
    for _ in 0..10 {
        match inner
            .queue
            .ack(&d.queue, std::slice::from_ref(&d.entry_id))
            .await
        {
            Ok(()) => return true,
            Err(e) => {
                warn!(error = %e, "ack failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
    false
}
