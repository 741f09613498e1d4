//! The heartbeat: every `heartbeat_interval`, renew the leases of the sessions running
//! here and touch their queue entries (so the reclaimer of another worker does not take
//! them); stop a run whose lease was lost, and cancel one whose cancel was requested.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use agentq_core::Lease;

use crate::inner::Inner;

pub(crate) async fn heartbeat_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.cfg.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        beat(&inner).await;
    }
}

async fn beat(inner: &Inner) {
    let (leases, entries): (Vec<Lease>, HashMap<String, Vec<String>>) = {
        let active = inner.runs.lock();
        let leases = active
            .values()
            .filter(|a| !a.settling.load(Ordering::SeqCst))
            .map(|a| a.lease.clone())
            .collect();
        let mut entries: HashMap<String, Vec<String>> = HashMap::new();
        for a in active.values() {
            entries
                .entry(a.queue.clone())
                .or_default()
                .push(a.entry_id.clone());
        }
        (leases, entries)
    };
    if entries.is_empty() {
        return;
    }
    for (q, ids) in &entries {
        if let Err(e) = inner.queue.touch(q, &inner.cfg.consumer, ids).await {
            debug!(error = %e, "touching pending entries failed");
        }
    }
    if leases.is_empty() {
        return;
    }
    match inner.store.heartbeat(&leases, inner.cfg.lease_ttl).await {
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
        Err(e) => warn!(error = %e, "lease heartbeat failed"),
    }
}
