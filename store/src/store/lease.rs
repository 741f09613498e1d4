//! [`LeaseStore`]: what a worker running sessions needs of the store (claims, fenced
//! checkpoints, heartbeats, release, suspension), and the answers of its batch calls.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use agentq_agent::state::SessionState;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::model::{Claim, Lease, SessionRow, SessionStatus};
use crate::wait::WaitReason;

/// A committed checkpoint's answer. For a final checkpoint, the row as that commit left it
/// (outcome stored, lease given up, and whatever arrived meanwhile, such as a bumped
/// `wake_seq`) when the store can return it with the commit, which spares the finishing
/// worker a read; `None` for a step, or when the row must be read.
pub type Committed = Option<Box<SessionRow>>;

/// What a heartbeat learned about one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseStatus {
    pub session_id: String,
    /// Still ours, and extended.
    pub held: bool,
    /// Someone else has it (a newer claim, or the row is gone): the run must stop. Not set
    /// for a lease its holder gave up itself (a final checkpoint, a suspension or a
    /// release that committed while the heartbeat was on its way), nor when the
    /// heartbeat lost a race it cannot judge: the next checkpoint's fencing decides then.
    pub lost: bool,
    pub cancel_requested: bool,
}

/// What a worker needs to run sessions: leases and the writes fenced by them.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Take the session for `owner` if it is runnable and not leased by a live worker:
    /// bump the epoch, set the lease, mark it running, and return its state.
    /// `max_attempts`: past this many claims without finishing, return `Exhausted`.
    async fn claim(&self, id: &str, owner: &str, ttl: Duration, max_attempts: u32)
    -> Result<Claim>;

    /// Group claim: [`LeaseStore::claim`] of each of `ids` for `owner`, in one durable
    /// commit where the store can (one statement on Postgres; one claim after another
    /// here). `Err` when the batch as a whole failed: nothing of it may be assumed taken
    /// or not, and each session may be claimed again (a claim by the same owner takes its
    /// own lease again). Otherwise one answer per id, in order; an id given twice is
    /// answered `Busy` after the first, which alone may take it.
    async fn claim_batch(
        &self,
        ids: &[&str],
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Vec<Result<Claim>>> {
        let mut seen = std::collections::HashSet::with_capacity(ids.len());
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(if seen.insert(*id) {
                self.claim(id, owner, ttl, max_attempts).await
            } else {
                Ok(Claim::Busy)
            });
        }
        Ok(out)
    }

    /// One round trip: append `state.messages[from..]` and update the row's scalars (and
    /// its terminal status when `state.outcome` is set), only if `lease` still holds.
    /// `Error::LeaseLost` when it does not. Safe to retry after an ambiguous failure.
    async fn checkpoint(&self, lease: &Lease, state: &SessionState, from: usize) -> Result<()>;

    /// Group commit: many sessions' checkpoints in one durable commit (one statement on
    /// Postgres). `Err` when the batch as a whole failed, in which case none of it was
    /// written and all of it may be retried; otherwise one result per checkpoint, in
    /// order, each `Ok` or `Error::LeaseLost` on its own: one fenced-off session does not
    /// hold back the others. At most one checkpoint per session in a batch.
    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>>;

    /// `worker`'s heartbeat, one round trip: its liveness row is live for `ttl` more, and
    /// with it the lease of every session it owns (one row written, whatever the number
    /// of sessions: no session row is). Returns, per lease of `leases` (the ones it runs),
    /// whether it still holds and whether a cancel was requested for it.
    async fn heartbeat(
        &self,
        worker: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<LeaseStatus>>;

    /// The running sessions `worker` owns, as leases with their queue: a worker gives
    /// back the ones it no longer runs (a run that ended without settling).
    async fn leases_of(&self, worker: &str) -> Result<Vec<(Lease, String)>>;

    /// `worker` stops: its liveness row expires now, so any session it still owns is
    /// taken over at once rather than after its heartbeats' `ttl`.
    async fn retire_worker(&self, worker: &str) -> Result<()>;

    /// Give the session back (graceful shutdown): status `queued`, no owner, attempts
    /// reset, no queue entry recorded (the caller adds one; else the sweeper does).
    /// Fenced by the lease.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Give the session up until something wakes it (fenced by the lease): status
    /// `waiting` or `awaiting_approval`, no owner. If anything arrived after `seen_wake`
    /// (the row's `wake_seq` at the claim), the session goes back to `queued` instead; if
    /// a cancel was requested, it is cancelled. Returns the status set; `queued` means
    /// the caller must enqueue it.
    async fn suspend(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Result<SessionRow>;

    /// [`LeaseStore::suspend`] to `waiting` for `reason`, recording it, and, with
    /// `wake_at`, when the sweeper puts the session back on the queue by itself
    /// ([`SweepStore::wake_due`]). Fenced and woken-or-cancelled like `suspend`.
    async fn suspend_for(
        &self,
        lease: &Lease,
        seen_wake: i64,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow>;
}
