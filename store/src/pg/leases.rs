//! The lease protocol on Postgres: the claim, the fenced checkpoint, heartbeat, release
//! and suspension of a running session. Every write after the claim is conditional on
//! `(lease_owner, lease_epoch)`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::StreamExt;

use agentq_agent::state::SessionState;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{Claim, Lease, SessionRow, SessionStatus};
use crate::single_checkpoint::checkpoint_alone;
use crate::sql::outcome;
use crate::sql::record::{SessionRecord, StoredMessage};
use crate::sql::statements::POSTGRES as SQL;
use crate::sql::suspension::Suspension;
use crate::store::{Committed, LeaseStatus, LeaseStore};
use crate::wait::WaitReason;

use super::{PgStore, secs};

/// A group claim's reads after its statement in flight at once (each on a connection of
/// the main pool).
const READS_AT_ONCE: usize = 8;

#[async_trait]
impl LeaseStore for PgStore {
    async fn claim(
        &self,
        id: &str,
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Claim> {
        let claimed: Option<SessionRecord> = sqlx::query_as(&SQL.claim)
            .bind(id)
            .bind(owner)
            .bind(secs(ttl))
            .fetch_optional(&self.pool)
            .await?;
        match claimed {
            Some(rec) => self.taken(rec, owner, max_attempts).await,
            None => self.refused(id).await,
        }
    }

    /// One statement for every claim of the batch (a batch of one is [`Self::claim`]'s
    /// own statement); the reads after it (a claimed session's history, why a claim was
    /// refused) go one per session, as for a lone claim, [`READS_AT_ONCE`] at a time.
    async fn claim_batch(
        &self,
        ids: &[&str],
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Vec<Result<Claim>>> {
        if let [id] = ids {
            return Ok(vec![self.claim(id, owner, ttl, max_attempts).await]);
        }
        let claimed: Vec<SessionRecord> = sqlx::query_as(&SQL.claim_batch)
            .bind(ids)
            .bind(owner)
            .bind(secs(ttl))
            .fetch_all(&self.pool)
            .await?;
        let mut claimed: HashMap<String, SessionRecord> =
            claimed.into_iter().map(|r| (r.id.clone(), r)).collect();
        let mut seen = HashSet::with_capacity(ids.len());
        let mut answers = Vec::with_capacity(ids.len());
        for id in ids {
            let first = seen.insert(*id);
            let rec = claimed.remove(*id);
            answers.push(async move {
                match rec {
                    _ if !first => Ok(Claim::Busy),
                    Some(rec) => self.taken(rec, owner, max_attempts).await,
                    None => self.refused(id).await,
                }
            });
        }
        // In order, a few at a time: a batch of entries for sessions that are gone (or
        // hostile ids) must not take the whole pool for its reads.
        Ok(futures::stream::iter(answers)
            .buffered(READS_AT_ONCE)
            .collect()
            .await)
    }

    async fn checkpoint(&self, lease: &Lease, state: &SessionState, from: usize) -> Result<()> {
        checkpoint_alone(self, lease, state, from).await
    }

    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        self.commit_batch(batch).await
    }

    async fn heartbeat(
        &self,
        worker: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<LeaseStatus>> {
        self.extend_leases(worker, leases, ttl).await
    }

    async fn leases_of(&self, worker: &str) -> Result<Vec<(Lease, String)>> {
        let rows: Vec<(String, String, i64, String)> = sqlx::query_as(&SQL.leases_of)
            .bind(worker)
            .fetch_all(&self.pool)
            .await?;
        Ok(crate::sql::outcome::leases(worker, rows))
    }

    async fn retire_worker(&self, worker: &str) -> Result<()> {
        sqlx::query(&SQL.retire)
            .bind(worker)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let done = sqlx::query(&SQL.release)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(&lease.owner)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if done > 0
            || self
                .gave_up_lease(lease, |s| s == SessionStatus::Queued)
                .await?
        {
            return Ok(());
        }
        Err(Error::LeaseLost(lease.session_id.clone()))
    }

    async fn suspend(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let s = Suspension::of(status, seen_wake, approval_deadline);
        self.suspend_with(lease, &s).await
    }

    async fn suspend_for(
        &self,
        lease: &Lease,
        seen_wake: i64,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let s = Suspension::waiting(seen_wake, reason, wake_at);
        self.suspend_with(lease, &s).await
    }
}

impl PgStore {
    /// The answer for a row the claim took: `Exhausted` past `max_attempts` (the claim
    /// stands), else the lease with the session's state.
    async fn taken(&self, rec: SessionRecord, owner: &str, max_attempts: u32) -> Result<Claim> {
        if outcome::exhausted(&rec, max_attempts) {
            return outcome::exhausted_claim(rec);
        }
        // A second statement, after the claim committed: from here on the previous holder
        // is fenced off, so this read sees everything it will ever have written. The
        // claimed row is the latest version (the claim waited for any write in flight).
        let messages: Vec<StoredMessage> = if !rec.has_stored_history() {
            Vec::new()
        } else if rec.forked_from.is_some() {
            // A fork's prefix is its origins' messages (`sql::fork`).
            sqlx::query_as(&crate::sql::fork::POSTGRES.history)
                .bind(&rec.id)
                .fetch_all(&self.pool)
                .await?
        } else {
            sqlx::query_as(&SQL.claim_history)
                .bind(&rec.root_id)
                .bind(&rec.id)
                .fetch_all(&self.pool)
                .await?
        };
        outcome::acquired(rec, owner, messages)
    }

    /// Why a claim of `id` took nothing, from the row as it is now.
    async fn refused(&self, id: &str) -> Result<Claim> {
        let rec = self.get_record(id).await?;
        let settled = match &rec {
            Some(r) if r.status()?.is_terminal() => {
                sqlx::query_scalar(outcome::SETTLED)
                    .bind(id)
                    .fetch_one(&self.pool)
                    .await?
            }
            _ => false,
        };
        outcome::claim_refused(rec, settled)
    }

    async fn suspend_with(&self, lease: &Lease, s: &Suspension) -> Result<SessionRow> {
        let rec: Option<SessionRecord> = sqlx::query_as(&SQL.suspend)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(s.status.as_str())
            .bind(s.seen_wake)
            .bind(s.approval_deadline)
            .bind(&lease.owner)
            .bind(s.reason.as_str())
            .bind(s.wake_at)
            .fetch_optional(&self.pool)
            .await?;
        match rec {
            Some(r) => r.into_row(),
            None => Err(Error::LeaseLost(lease.session_id.clone())),
        }
    }
}
