//! What the sweeper and the dispatcher ask of Postgres: queue entries to add or forget,
//! waits that are over, held sessions to release, and the counts behind the metrics.

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::model::{SessionRow, Woken};
use crate::rowconv::{WokenRow, woken};
use crate::scheduling::{ActiveCount, Candidate};
use crate::sql::dispatch;
use crate::sql::record::SessionRecord;
use crate::sql::statements::POSTGRES as SQL;
use crate::store::SweepStore;
use crate::wait::WaitReason;

use super::{PgStore, secs};

#[async_trait]
impl SweepStore for PgStore {
    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(&SQL.mark_enqueued)
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn reset_enqueued(&self, queue: &str) -> Result<u64> {
        let n = sqlx::query(&SQL.reset_enqueued)
            .bind(queue)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n)
    }

    async fn forget_expired_entries(&self, grace: Duration, limit: u32) -> Result<u64> {
        let n = sqlx::query(&SQL.forget_expired)
            .bind(secs(grace))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?
            .rows_affected();
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
        Ok(sqlx::query_as(&SQL.requeue_orphans)
            .bind(queues)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    async fn forget_workers(&self, age: Duration) -> Result<u64> {
        let n = sqlx::query(&SQL.forget_workers)
            .bind(secs(age))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n)
    }

    async fn unannounced(&self, grace: Duration, limit: u32) -> Result<Vec<SessionRow>> {
        let recs: Vec<SessionRecord> = sqlx::query_as(&SQL.unannounced)
            .bind(secs(grace))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        recs.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(&SQL.unenqueued)
            .bind(secs(age))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    async fn expire_workspaces(&self, ttl: Duration, limit: u32) -> Result<u64> {
        self.expire_trees(ttl, limit).await
    }

    async fn collect_blobs(&self, grace: Duration, limit: u32) -> Result<u64> {
        self.collect(grace, limit).await
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<Woken>> {
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_expired)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(woken(rows))
    }

    async fn wake_due(&self, limit: u32) -> Result<Vec<Woken>> {
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_due)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(woken(rows))
    }

    async fn wake_budget_waiters(&self, tenant: &str, limit: u32) -> Result<Vec<Woken>> {
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_budget)
            .bind(tenant)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(woken(rows))
    }

    async fn waiting_by_reason(&self) -> Result<Vec<(WaitReason, u64)>> {
        dispatch::waiting_by_reason(&self.pool, &SQL).await
    }

    async fn held_by_queue(&self) -> Result<Vec<(String, u64)>> {
        dispatch::held_by_queue(&self.pool, &SQL).await
    }

    async fn dispatch_load(&self) -> Result<Vec<ActiveCount>> {
        dispatch::load(&self.pool, &SQL).await
    }

    async fn held(&self, queue: &str, per_group: u32, limit: u32) -> Result<Vec<Candidate>> {
        dispatch::held(&self.pool, &SQL, queue, per_group, limit).await
    }

    async fn any_held(&self, queue: Option<&str>) -> Result<bool> {
        dispatch::any_held(&self.pool, &SQL, queue).await
    }

    async fn release_held(&self, ids: &[String]) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar(&SQL.release_held)
            .bind(ids)
            .fetch_all(&self.pool)
            .await?)
    }
}
