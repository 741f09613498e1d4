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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::Value;

    use super::*;

    /// Rows of `sessions` a plan's nodes read (returned or filtered out), and rows any
    /// join compared and dropped, over all their loops (`EXPLAIN` gives each per loop).
    fn rows_read(node: &Value) -> f64 {
        let n = |key: &str| node[key].as_f64().unwrap_or(0.0);
        let own = if node["Relation Name"] == "sessions" {
            n("Actual Rows") + n("Rows Removed by Filter") + n("Rows Removed by Index Recheck")
        } else {
            0.0
        };
        let joined = n("Rows Removed by Join Filter");
        let this = (own + joined) * n("Actual Loops");
        let below: f64 = node["Plans"]
            .as_array()
            .map(|plans| plans.iter().map(rows_read).sum())
            .unwrap_or(0.0);
        this + below
    }

    /// The plan `statement` (prepared as `name`) ran on `args` (a literal: `EXPLAIN`
    /// takes no parameters of its own), in a transaction rolled back after it.
    async fn explained(
        conn: &mut sqlx::PgConnection,
        name: &str,
        statement: &str,
        args: &str,
    ) -> Value {
        sqlx::query(&format!("PREPARE {name} AS {statement}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
        let plan: Value = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})"
        ))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
        plan[0]["Plan"].clone()
    }

    /// A claim, alone or in a group, reads its own sessions' rows, whatever the backlog
    /// and whatever the statistics say: here 2,000 sessions, all finished when the table
    /// was analyzed (so the planner expects few runnable rows), then all queued again,
    /// and the plans generic, as on a worker's connections. As a join, the group claim
    /// read the whole backlog, once per id.
    #[tokio::test]
    async fn a_claim_reads_only_its_own_rows() {
        let url = agentq_testkit::shared_postgres()
            .expect("shared postgres")
            .fresh_database()
            .expect("fresh database");
        let store = PgStore::connect(&url, 2).await.unwrap();
        store.migrate().await.unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        for sql in [
            "INSERT INTO sessions (id, root_id, queue, status, finished_at) \
             SELECT 's' || g, 's' || g, 'q', 'completed', now() FROM generate_series(1, 2000) g",
            "ANALYZE sessions",
            "UPDATE sessions SET status = 'queued', finished_at = NULL",
            "SET plan_cache_mode = force_generic_plan",
        ] {
            sqlx::query(sql).execute(&mut *conn).await.unwrap();
        }
        let group = explained(
            &mut conn,
            "group_claim",
            &SQL.claim_batch,
            "'{s7, s1500, s42, s7, absent}'::text[], 'w1', 30",
        )
        .await;
        assert_eq!(group["Actual Rows"].as_f64(), Some(3.0), "{group:#}");
        // Each of the four distinct ids is looked up, and each of the three claimed is
        // read twice more (locked, updated): ten rows, a few more as `EXPLAIN` rounds each
        // loop's rows up; never the other 1,997.
        let read = rows_read(&group);
        assert!(read <= 20.0, "read {read} rows of sessions: {group:#}");

        let lone = explained(&mut conn, "claim", &SQL.claim, "'s9', 'w1', 30").await;
        assert_eq!(lone["Actual Rows"].as_f64(), Some(1.0), "{lone:#}");
        let read = rows_read(&lone);
        assert!(read <= 2.0, "read {read} rows of sessions: {lone:#}");
    }
}
