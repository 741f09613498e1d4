//! The heartbeat: every `heartbeat_interval`, renew this worker's liveness row in the
//! store (which keeps the lease of every session it owns: one row written, whatever the
//! number of sessions) and read what its runs' rows show; stop a run whose lease was lost,
//! and cancel one whose cancel was requested. After a run ended without settling its
//! session (and now and then regardless), give back the sessions this worker owns in the
//! store but no longer handles: their lease would otherwise live as long as this worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use agentq_core::{EnqueueReason, Error, Lease};

use crate::inner::Inner;

/// Beats between two looks for sessions owned here that nothing handles, besides the look
/// after a run that ended without settling.
const AUDIT_EVERY: u32 = 60;

pub(crate) async fn heartbeat_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.cfg.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats: u32 = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        beat(&inner).await;
        beats = beats.wrapping_add(1);
        if inner.runs.audit_due.swap(false, Ordering::SeqCst) || beats.is_multiple_of(AUDIT_EVERY) {
            give_back_unhandled(&inner).await;
        }
    }
}

async fn beat(inner: &Inner) {
    let leases: Vec<Lease> = inner
        .runs
        .lock()
        .values()
        .filter(|a| !a.settling.load(Ordering::SeqCst))
        .map(|a| a.lease.clone())
        .collect();
    match inner
        .store
        .heartbeat(&inner.cfg.consumer, &leases, inner.cfg.lease_ttl)
        .await
    {
        Ok(statuses) => {
            let active = inner.runs.lock();
            for s in statuses {
                let Some(a) = active.get(&s.session_id) else {
                    continue;
                };
                if s.lost && !a.settling.load(Ordering::SeqCst) {
                    warn!(session_id = %s.session_id, "lease lost; stopping the run");
                    a.abort.cancel();
                } else if s.cancel_requested {
                    a.cancel.cancel();
                }
            }
        }
        Err(e) => warn!(error = %e, "heartbeat failed"),
    }
}

/// Sessions this worker owns in the store with no delivery of them handled here: each is
/// released (fenced by the epoch read, so a session claimed again since is left alone)
/// and put back on its queue.
async fn give_back_unhandled(inner: &Inner) {
    let owned = match inner.store.leases_of(&inner.cfg.consumer).await {
        Ok(owned) => owned,
        Err(e) => {
            debug!(error = %e, "cannot list the sessions owned here; trying again later");
            inner.runs.audit_due.store(true, Ordering::SeqCst);
            return;
        }
    };
    for (lease, queue) in owned {
        if inner.runs.is_handling(&lease.session_id) {
            continue;
        }
        match inner.store.release(&lease).await {
            Ok(()) => {}
            // Moved on since the read (finished, suspended, claimed again): not ours.
            Err(Error::LeaseLost(_)) => continue,
            Err(e) => {
                debug!(error = %e, "cannot give back a session nothing runs; trying again later");
                inner.runs.audit_due.store(true, Ordering::SeqCst);
                continue;
            }
        }
        warn!(session_id = %lease.session_id, "gave back a session owned here that nothing ran");
        let id = lease.session_id;
        // Without an entry the sweeper adds one (the release forgot the old one).
        if inner
            .queue
            .enqueue(&queue, &id, EnqueueReason::Resume)
            .await
            .is_ok()
        {
            let _ = inner.store.mark_enqueued(std::slice::from_ref(&id)).await;
        }
    }
}
