//! What the sweeper and the dispatcher ask of the SQLite file: queue entries to add or
//! forget, waits that are over, held sessions to release, and the counts behind the
//! metrics.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::model::{SessionRow, Woken};
use crate::rowconv::{WokenRow, woken};
use crate::scheduling::{ActiveCount, Candidate};
use crate::sql::dispatch;
use crate::sql::record::SessionRecord;
use crate::sql::statements::SQLITE as SQL;
use crate::store::SweepStore;
use crate::wait::WaitReason;

use super::SqliteStore;
use super::tx::{dur_us, now_us};

#[async_trait]
impl SweepStore for SqliteStore {
    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.mark_enqueued)
            // The ids as one JSON array parameter: no limit on the number of ids.
            .bind(serde_json::to_string(ids)?)
            .bind(now_us())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn reset_enqueued(&self, queue: &str) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(&SQL.reset_enqueued)
            .bind(queue)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    async fn forget_expired_entries(&self, grace: Duration, limit: u32) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(&SQL.forget_expired)
            .bind(now_us().saturating_sub(dur_us(grace)))
            .bind(i64::from(limit))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    async fn requeue_orphans(
        &self,
        queues: &[String],
        limit: u32,
    ) -> Result<Vec<(String, String)>> {
        if queues.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write_tx().await?;
        // Read to the end inside the transaction (see the module docs on `RETURNING`).
        let rows: Vec<(String, String)> = sqlx::query_as(&SQL.requeue_orphans)
            .bind(serde_json::to_string(queues)?)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn forget_workers(&self, age: Duration) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(&SQL.forget_workers)
            .bind(now_us().saturating_sub(dur_us(age)))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    async fn unannounced(&self, grace: Duration, limit: u32) -> Result<Vec<SessionRow>> {
        let recs: Vec<SessionRecord> = sqlx::query_as(&SQL.unannounced)
            .bind(now_us().saturating_sub(dur_us(grace)))
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?;
        recs.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(&SQL.unenqueued)
            .bind(now_us().saturating_sub(dur_us(age)))
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?)
    }

    async fn expire_workspaces(&self, ttl: Duration, limit: u32) -> Result<u64> {
        self.expire_trees(ttl, limit).await
    }

    async fn collect_blobs(&self, grace: Duration, limit: u32) -> Result<u64> {
        self.collect(grace, limit).await
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<Woken>> {
        let mut tx = self.write_tx().await?;
        // Read to the end inside the transaction (see the module docs on `RETURNING`).
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_expired)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken(rows))
    }

    async fn wake_due(&self, limit: u32) -> Result<Vec<Woken>> {
        let mut tx = self.write_tx().await?;
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_due)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken(rows))
    }

    async fn wake_budget_waiters(&self, tenant: &str, limit: u32) -> Result<Vec<Woken>> {
        let mut tx = self.write_tx().await?;
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_budget)
            .bind(tenant)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken(rows))
    }

    async fn waiting_by_reason(&self) -> Result<Vec<(WaitReason, u64)>> {
        dispatch::waiting_by_reason(&self.readers, &SQL).await
    }

    async fn held_by_queue(&self) -> Result<Vec<(String, u64)>> {
        dispatch::held_by_queue(&self.readers, &SQL).await
    }

    async fn dispatch_load(&self) -> Result<Vec<ActiveCount>> {
        dispatch::load(&self.readers, &SQL).await
    }

    async fn held(&self, queue: &str, per_group: u32, limit: u32) -> Result<Vec<Candidate>> {
        dispatch::held(&self.readers, &SQL, queue, per_group, limit).await
    }

    async fn any_held(&self, queue: Option<&str>) -> Result<bool> {
        dispatch::any_held(&self.readers, &SQL, queue).await
    }

    async fn release_held(&self, ids: &[String]) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write_tx().await?;
        // Read to the end inside the transaction (see the module docs on `RETURNING`).
        let released: Vec<String> = sqlx::query_scalar(&SQL.release_held)
            .bind(serde_json::to_string(ids)?)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(released)
    }
}
