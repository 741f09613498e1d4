//! The lease protocol in the SQLite file: the claim, the fenced checkpoint (the group
//! commit as one write transaction), heartbeat, release and suspension of a running
//! session. Every write after the claim is conditional on `(lease_owner, lease_epoch)`.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use agentq_agent::state::SessionState;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{Claim, Lease, SessionRow, SessionStatus};
use crate::single_checkpoint::checkpoint_alone;
use crate::sql::outcome;
use crate::sql::record::StoredMessage;
use crate::sql::statements::SQLITE as SQL;
use crate::sql::suspension::Suspension;
use crate::store::{Committed, LeaseStatus, LeaseStore};
use crate::wait::WaitReason;

use super::tx::{dur_us, gave_up_lease, now_us, record_in, returning_one};
use super::{SqliteStore, writes};

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim(
        &self,
        id: &str,
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Claim> {
        let now = now_us();
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.ensure_worker)
            .bind(owner)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let claimed = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.claim)
                .bind(id)
                .bind(owner)
                .bind(now.saturating_add(dur_us(ttl)))
                .bind(now),
        )
        .await?;
        let Some(rec) = claimed else {
            // Why not? Read in the same transaction, so the answer is consistent.
            let rec = record_in(&mut tx, id).await?;
            let settled = match &rec {
                Some(r) if r.status()?.is_terminal() => {
                    sqlx::query_scalar(outcome::SETTLED)
                        .bind(id)
                        .fetch_one(&mut *tx)
                        .await?
                }
                _ => false,
            };
            tx.rollback().await?;
            return outcome::claim_refused(rec, settled);
        };
        if outcome::exhausted(&rec, max_attempts) {
            // The claim itself stands (as on Postgres): the caller fails the session.
            tx.commit().await?;
            return outcome::exhausted_claim(rec);
        }
        // The history, read under the same write lock as the claim: exactly what the
        // previous holder committed, which is all it will ever have written.
        let messages: Vec<StoredMessage> = if !rec.has_stored_history() {
            Vec::new()
        } else if rec.forked_from.is_some() {
            // A fork's prefix is its origins' messages (`sql::fork`).
            sqlx::query_as(&crate::sql::fork::SQLITE.history)
                .bind(&rec.id)
                .fetch_all(&mut *tx)
                .await?
        } else {
            sqlx::query_as(&SQL.claim_history)
                .bind(&rec.root_id)
                .bind(&rec.id)
                .fetch_all(&mut *tx)
                .await?
        };
        tx.commit().await?;
        outcome::acquired(rec, owner, messages)
    }

    async fn checkpoint(&self, lease: &Lease, state: &SessionState, from: usize) -> Result<()> {
        checkpoint_alone(self, lease, state, from).await
    }

    /// Returns no rows: a read of an embedded database is cheap, and the caller makes it.
    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        let now = now_us();
        // One transaction for the whole batch (SQLite's group commit); within it each
        // checkpoint's messages are written only if its fenced row update matched.
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(batch.len());
        for cp in batch {
            out.push(writes::checkpoint(&mut tx, cp, now).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn heartbeat(
        &self,
        worker: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<LeaseStatus>> {
        let now = now_us();
        let mut out = Vec::with_capacity(leases.len());
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.beat)
            .bind(worker)
            .bind(now.saturating_add(dur_us(ttl)))
            .bind(now)
            .execute(&mut *tx)
            .await?;
        for l in leases {
            out.push(writes::lease_status(&mut tx, l).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn leases_of(&self, worker: &str) -> Result<Vec<(Lease, String)>> {
        let rows: Vec<(String, String, i64, String)> = sqlx::query_as(&SQL.leases_of)
            .bind(worker)
            .fetch_all(&self.readers)
            .await?;
        Ok(crate::sql::outcome::leases(worker, rows))
    }

    async fn retire_worker(&self, worker: &str) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.retire)
            .bind(worker)
            .bind(now_us())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(&SQL.release)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(&lease.owner)
            .bind(now_us())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if done > 0 {
            tx.commit().await?;
            return Ok(());
        }
        let retried = gave_up_lease(&mut tx, lease, |s| s == SessionStatus::Queued).await?;
        tx.rollback().await?;
        if retried {
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

impl SqliteStore {
    async fn suspend_with(&self, lease: &Lease, s: &Suspension) -> Result<SessionRow> {
        let mut tx = self.write_tx().await?;
        let rec = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.suspend)
                .bind(&lease.root_id)
                .bind(&lease.session_id)
                .bind(lease.epoch)
                .bind(s.status.as_str())
                .bind(s.seen_wake)
                .bind(s.approval_deadline.map(|t| t.timestamp_micros()))
                .bind(&lease.owner)
                .bind(s.reason.as_str())
                .bind(s.wake_at.map(|t| t.timestamp_micros()))
                .bind(now_us()),
        )
        .await?;
        match rec {
            Some(r) => {
                tx.commit().await?;
                r.into_row()
            }
            None => {
                tx.rollback().await?;
                Err(Error::LeaseLost(lease.session_id.clone()))
            }
        }
    }
}
