//! Recording what a run came to: a finished session counted and settled, a suspended one
//! parked, one stopped for shutdown handed back, one whose checkpoint the store refused
//! failed, and a lost lease or an unreachable store left to the next claim.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::{error, info, warn};

use agentq_agent::CheckpointFailure;
use agentq_agent::driver::{Receipt, RunEnd};
use agentq_agent::state::{Outcome, SessionState};
use agentq_core::SessionRow;
use agentq_core::queue::Delivery;

use super::drive::Ran;
use super::processed::Processed;
use super::settle::{expire_stream, fail_and_settle, hand_back, settle_finished};
use super::suspend::suspend;
use super::wiring::Claimed;
use crate::backoff::Backoff;
use crate::checkpoint::StoreCheckpointer;
use crate::inner::Inner;

/// Record what the run came to (`ran`), with the session's state as the run left it.
pub(super) async fn record(run: &Claimed<'_>, state: &SessionState, ran: Ran) -> Processed {
    let Claimed {
        inner,
        d,
        lease,
        acked,
        ..
    } = *run;
    match ran {
        None => {
            lease_lost(inner);
            warn!("run aborted: lease lost");
            Processed::LeaseLost
        }
        Some(Ok((RunEnd::Finished(outcome), receipt))) => {
            finished(run, state, &outcome, receipt).await
        }
        Some(Ok((RunEnd::Suspended(reason), _))) => suspend(run, state, reason).await,
        Some(Err(agentq_agent::Error::LeaseLost)) => {
            lease_lost(inner);
            warn!(
                "lease lost at a checkpoint: another worker owns the session; stopping without writes"
            );
            Processed::LeaseLost
        }
        Some(Err(agentq_agent::Error::Stopped)) => {
            info!("stopped at a checkpoint for shutdown; handing the session back");
            hand_back(inner, d, lease, acked).await
        }
        Some(Err(agentq_agent::Error::Checkpoint(CheckpointFailure::Refused {
            reason,
            durable,
        }))) => fail_refused(inner, d, &reason, durable, acked).await,
        Some(Err(e)) => {
            // The store stayed unreachable: leave everything; the lease expires and the
            // reclaimer resumes the session from its last checkpoint.
            error!(error = %e, "run stopped: checkpoint failed");
            Processed::Left
        }
    }
}

/// Another worker owns the session now: counted.
fn lease_lost(inner: &Inner) {
    inner.stats.lost_leases.fetch_add(1, Ordering::Relaxed);
    inner.metrics.lease_lost.inc();
}

/// The store refused a checkpoint for what it holds (or no row could hold the state): a
/// redelivery would replay the same step into the same refusal, so the session fails now,
/// with the reason, and its lease is given up. Its stored history stays as the last
/// checkpoint left it (the refused step is not in it). Not through a checkpoint: the
/// state that could not be stored may be what is wrong.
async fn fail_refused(
    inner: &Arc<Inner>,
    d: &Delivery,
    refused: &str,
    durable: usize,
    acked: bool,
) -> Processed {
    let reason = format!("a checkpoint could not be stored: {refused}");
    error!(%reason, durable, "failing the session");
    fail_and_settle(inner, d, &reason, acked).await
}

/// The run finished the session: count it, and settle it (its event stream's expiry
/// first) with the row its final checkpoint returned (the run's receipt), or read back.
async fn finished(
    run: &Claimed<'_>,
    state: &SessionState,
    outcome: &Outcome,
    receipt: Receipt,
) -> Processed {
    let Claimed {
        inner, d, acked, ..
    } = *run;
    let m = inner.metrics;
    info!(finish_reason = %outcome.reason, iterations = state.iteration, "session finished");
    inner.stats.completed.fetch_add(1, Ordering::Relaxed);
    m.sessions_finished
        .with_label_values(&[d.queue.as_str(), outcome.reason.as_str()])
        .inc();
    m.session_iterations.observe(f64::from(state.iteration));
    m.session_tokens.observe(state.usage.total() as f64);
    let row = match StoreCheckpointer::finished_row(receipt) {
        Some(row) => Some(row),
        None => get_row(inner, &d.session_id).await,
    };
    let acked = match row {
        Some(row) => settle_finished(inner, d, &row, acked).await,
        None => {
            warn!("finished, but its row could not be read; the entry will be redelivered");
            // Unsettled, but its run is over: its stream still expires.
            expire_stream(inner, &d.session_id).await;
            false
        }
    };
    Processed::Finished { acked }
}

async fn get_row(inner: &Arc<Inner>, id: &str) -> Option<SessionRow> {
    let mut backoff = Backoff::new();
    for _ in 0..20 {
        match inner.store.get(id).await {
            Ok(r) => return r,
            Err(e) => {
                warn!(error = %e, "reading the finished row failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
    None
}
