//! The heartbeat: every `heartbeat_interval`, renew this worker's liveness row in the
//! store (which keeps the lease of every session it owns: one row written, whatever the
//! number of sessions) and read what its runs' rows show, at most [`CHECKED_PER_BEAT`] of
//! them a beat, in turn; stop a run whose lease was lost, and cancel one whose cancel was
//! requested. After a run ended without settling its
//! session (and now and then regardless), give back the sessions this worker owns in the
//! store but no longer handles: their lease would otherwise live as long as this worker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use agentq_core::{EnqueueReason, Error, Lease};

use crate::inner::Inner;

/// Beats between two looks for sessions owned here that nothing handles, besides the look
/// after a run that ended without settling.
const AUDIT_EVERY: u32 = 60;

/// Most runs' rows one beat reads. The beat renews the liveness row in the same statement,
/// so the statement must end well within the lease's TTL: one that read 12,000 rows on a
/// loaded Postgres took up to 1.9 s, past the default 1.5 s, and the worker's 50,000
/// sessions were taken for a dead worker's. A worker with more runs checks them in turns
/// ([`part_of`]). Another worker can take a session only once this one's liveness row has
/// lapsed, so after a beat that may have let it lapse the next reads every run's row
/// ([`lapsed`]); a cancel is signalled to the worker directly first.
pub(crate) const CHECKED_PER_BEAT: usize = 2_000;

pub(crate) async fn heartbeat_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.cfg.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats: u32 = 0;
    // The start of the last beat that renewed the row, and whether the next reads every
    // run's row (the first does).
    let mut renewed_at: Option<Instant> = None;
    let mut read_all = true;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let started = Instant::now();
        if beat(&inner, beats, read_all).await {
            read_all = lapsed(renewed_at, Instant::now(), inner.cfg.lease_ttl);
            renewed_at = Some(started);
        }
        beats = beats.wrapping_add(1);
        if inner.runs.audit_due.swap(false, Ordering::SeqCst) || beats.is_multiple_of(AUDIT_EVERY) {
            give_back_unhandled(&inner).await;
        }
    }
}

/// Whether the liveness row may have lapsed before a renewal that ended `now`: it was live
/// until the last renewal's start (`renewed_at`) plus `ttl`, and the store's clock started
/// it no earlier than this one's.
fn lapsed(renewed_at: Option<Instant>, now: Instant, ttl: Duration) -> bool {
    renewed_at.is_some_and(|at| now.saturating_duration_since(at) >= ttl)
}

/// One beat: the row renewed, and this beat's turn of the runs' rows read (every one when
/// `read_all`). Whether the row was renewed.
async fn beat(inner: &Inner, beats: u32, read_all: bool) -> bool {
    let leases: Vec<Lease> = {
        let runs = inner.runs.lock();
        let parts = if read_all {
            1
        } else {
            parts(runs.len(), CHECKED_PER_BEAT)
        };
        let part = beats % parts;
        runs.values()
            .filter(|a| !a.settling.load(Ordering::SeqCst))
            .filter(|a| part_of(&a.lease.session_id, parts) == part)
            .map(|a| a.lease.clone())
            .collect()
    };
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
            true
        }
        Err(e) => {
            warn!(error = %e, "heartbeat failed");
            false
        }
    }
}

/// Into how many turns `runs` runs' rows are read, at most `per_beat` a turn on average.
fn parts(runs: usize, per_beat: usize) -> u32 {
    u32::try_from(runs.div_ceil(per_beat.max(1)))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// The turn (of `parts`) in which a session's row is read: from its id, so that it stays
/// the same from beat to beat while the runs come and go.
fn part_of(session_id: &str, parts: u32) -> u32 {
    if parts <= 1 {
        return 0;
    }
    // Stable, and cheap enough for every run at every beat.
    let hash = agentq_core::shard::fnv1a(&[session_id.as_bytes()]);
    u32::try_from(hash % u64::from(parts)).unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_that_ends_a_ttl_after_the_last_ones_start_may_have_lapsed() {
        let ttl = Duration::from_millis(1500);
        let at = Instant::now();
        assert!(!lapsed(None, at, ttl));
        assert!(!lapsed(Some(at), at + Duration::from_millis(1499), ttl));
        assert!(lapsed(Some(at), at + ttl, ttl));
        assert!(lapsed(Some(at), at + Duration::from_secs(60), ttl));
        // A clock read before the start (it cannot be) is no lapse.
        assert!(!lapsed(Some(at + ttl), at, ttl));
    }

    #[test]
    fn a_few_runs_are_all_read_at_every_beat() {
        assert_eq!(parts(0, CHECKED_PER_BEAT), 1);
        assert_eq!(parts(CHECKED_PER_BEAT, CHECKED_PER_BEAT), 1);
        assert!((0..100).all(|i| part_of(&format!("s{i}"), 1) == 0));
    }

    #[test]
    fn many_runs_are_read_in_turns_each_once_a_round_and_about_evenly() {
        let ids: Vec<String> = (0..50_000)
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        let parts = parts(ids.len(), CHECKED_PER_BEAT);
        assert_eq!(parts, 25);
        let mut read = vec![0usize; ids.len()];
        let mut per_beat = Vec::new();
        // One round of beats: every run's row is read in exactly one of them.
        for beat in 0..parts {
            let mut n = 0;
            for (i, id) in ids.iter().enumerate() {
                if part_of(id, parts) == beat {
                    read[i] += 1;
                    n += 1;
                }
            }
            per_beat.push(n);
        }
        assert!(read.iter().all(|&r| r == 1));
        let most = per_beat.iter().copied().max().unwrap_or(0);
        assert!(most < CHECKED_PER_BEAT * 5 / 4, "{per_beat:?}");
    }
}
