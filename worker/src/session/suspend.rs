//! Suspending a run that gave its session up to wait (for children, an approval, a rate
//! limit, a budget): the wait recorded in the store, fenced by the lease, and announced on
//! the event stream; then the entry settled by what the session became meanwhile.

use std::sync::atomic::Ordering;

use tracing::{info, warn};

use agentq_agent::bounds;
use agentq_agent::driver::SuspendReason;
use agentq_agent::state::SessionState;
use agentq_core::lifecycle;
use agentq_core::{SessionRow, SessionStatus, WaitReason};

use super::processed::Processed;
use super::settle::{ack_unless, expire_stream, publish, tell_family};
use super::wiring::Claimed;

/// The run gave its session up to wait (children, an approval): record that, fenced, and
/// drop the entry — whatever it waits for puts it back on the queue.
pub(super) async fn suspend(
    run: &Claimed<'_>,
    state: &SessionState,
    reason: SuspendReason,
) -> Processed {
    let wait = wait_reason(&reason);
    match record_wait(run, state, reason, wait).await {
        Ok(now) => settle_suspended(run, wait, now).await,
        Err(agentq_core::Error::LeaseLost(_)) => {
            run.inner.stats.lost_leases.fetch_add(1, Ordering::Relaxed);
            run.inner.metrics.lease_lost.inc();
            warn!("lease lost while suspending: another worker owns the session");
            Processed::LeaseLost
        }
        Err(e) => {
            // The entry stays; the lease expires and another claim resumes (and, with
            // nothing new, suspends again).
            warn!(error = %e, "suspending failed");
            Processed::Left
        }
    }
}

/// Give the lease up for the wait `reason` names, announcing it on the event stream
/// where the session wakes by a time of its own. The row as the store left it.
async fn record_wait(
    run: &Claimed<'_>,
    state: &SessionState,
    reason: SuspendReason,
    wait: WaitReason,
) -> agentq_core::Result<SessionRow> {
    let Claimed {
        inner,
        lease,
        row,
        sink,
        ..
    } = *run;
    match reason {
        SuspendReason::Children => {
            inner
                .store
                .suspend_for(lease, row.wake_seq, wait, None)
                .await
        }
        // Its own status (`awaiting_approval`, with the decision's deadline), which the
        // store records as waiting for an approval. Clamped: the spec may hold any number
        // (a row written before the API bounded it).
        SuspendReason::Approval { .. } => {
            let deadline = bounds::after(chrono::Utc::now(), state.spec.approval_timeout_secs);
            inner
                .store
                .suspend(
                    lease,
                    SessionStatus::AwaitingApproval,
                    row.wake_seq,
                    Some(deadline),
                )
                .await
        }
        // No lease and no slot until the sweeper wakes it at `until`.
        SuspendReason::RateLimit { until } => {
            info!(wake_at = %until, "suspending for a rate limit");
            sink.waiting(state.messages.len(), wait, Some(until));
            inner
                .store
                .suspend_for(lease, row.wake_seq, wait, Some(until))
                .await
        }
        // Parked until the budget is raised (`SweepStore::wake_budget_waiters`), or until
        // its period turns over (the sweeper wakes it then).
        SuspendReason::Budget { message } => {
            info!(budget = %message, "parking for a spent budget");
            let wake_at = crate::budget::park_until(inner, &row.tenant).await;
            sink.waiting(state.messages.len(), wait, wake_at);
            inner
                .store
                .suspend_for(lease, row.wake_seq, wait, wake_at)
                .await
        }
    }
}

/// The session is suspended and its row is `now`: counted, and its entry settled by what
/// it became meanwhile (woken already: back on the queue; terminal: settled as finished).
async fn settle_suspended(run: &Claimed<'_>, wait: WaitReason, now: SessionRow) -> Processed {
    let Claimed { inner, d, .. } = *run;
    info!(status = %now.status, "session suspended");
    if matches!(
        now.status,
        SessionStatus::Waiting | SessionStatus::AwaitingApproval
    ) {
        inner
            .metrics
            .sessions_suspended
            .with_label_values(&[wait.as_str()])
            .inc();
    }
    match now.status {
        SessionStatus::Queued => {
            // Woken while it was suspending: straight back on the queue.
            lifecycle::enqueue_woken(
                inner.store.as_ref(),
                inner.queue.as_ref(),
                &now.id,
                &now.queue,
            )
            .await;
        }
        s if s.is_terminal() => {
            expire_stream(inner, &now.id).await;
            tell_family(inner, &now).await;
            if !publish(inner, &now).await {
                return Processed::Finished { acked: false };
            }
            return Processed::Finished {
                acked: ack_unless(inner, d, run.acked).await,
            };
        }
        _ => {}
    }
    ack_unless(inner, d, run.acked).await;
    Processed::Suspended
}

/// What the store, the event stream and the metrics call the wait a run suspended for:
/// the one place an agent's [`SuspendReason`] becomes core's [`WaitReason`], which stays
/// typed up to the store's column, the event's wire name and the metric's label.
fn wait_reason(reason: &SuspendReason) -> WaitReason {
    match reason {
        SuspendReason::Children => WaitReason::Children,
        SuspendReason::Approval { .. } => WaitReason::Approval,
        SuspendReason::RateLimit { .. } => WaitReason::RateLimit,
        SuspendReason::Budget { .. } => WaitReason::Budget,
    }
}
