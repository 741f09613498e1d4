//! Webhooks in the SQLite file: the shared statements of `crate::sql::webhooks`, reads on
//! the readers, each write in the one writer's transaction.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::sql::webhooks::{self as sql, WebhookStatements};
use crate::store::WebhookStore;
use crate::webhook::{
    AttemptOutcome, DeliveryCounts, DeliveryRow, DeliveryState, NewWebhook, Recorded, RetryRule,
    WebhookRow,
};

use super::SqliteStore;

static SQL: LazyLock<WebhookStatements> = LazyLock::new(WebhookStatements::sqlite);

#[async_trait]
impl WebhookStore for SqliteStore {
    async fn create_webhook(&self, new: &NewWebhook, max: u32) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let created = sql::create::<sqlx::Sqlite>(&mut *tx, new, max).await?;
        tx.commit().await?;
        Ok(created)
    }

    async fn webhook(&self, id: &str) -> Result<Option<WebhookRow>> {
        let mut conn = self.readers.acquire().await?;
        sql::endpoint::<sqlx::Sqlite>(&mut *conn, id).await
    }

    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookRow>> {
        let mut conn = self.readers.acquire().await?;
        sql::endpoints::<sqlx::Sqlite>(&mut *conn, tenant).await
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let deleted = sql::exec::<sqlx::Sqlite>(&mut *tx, sql::DELETE_ENDPOINT, id).await? > 0;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn rotate_webhook(&self, id: &str, salt: &str, old_until: DateTime<Utc>) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let rotated = sql::rotate::<sqlx::Sqlite>(&mut *tx, id, old_until, salt).await?;
        tx.commit().await?;
        Ok(rotated)
    }

    async fn enable_webhook(&self, id: &str) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let enabled = sql::exec::<sqlx::Sqlite>(&mut *tx, sql::ENABLE, id).await? > 0;
        tx.commit().await?;
        Ok(enabled)
    }

    async fn disable_webhook(&self, id: &str, now: DateTime<Utc>, reason: &str) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let disabled = sql::disable::<sqlx::Sqlite>(&mut *tx, id, now, reason).await?;
        tx.commit().await?;
        Ok(disabled)
    }

    async fn delivery_counts(&self, id: &str) -> Result<DeliveryCounts> {
        let mut conn = self.readers.acquire().await?;
        sql::counts::<sqlx::Sqlite>(&mut *conn, id).await
    }

    async fn list_deliveries(
        &self,
        id: &str,
        state: Option<DeliveryState>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>> {
        let recs: Vec<sql::DeliveryRecord> =
            sql::deliveries::<sqlx::Sqlite>(id, state, cursor, limit)
                .build_query_as()
                .fetch_all(&self.readers)
                .await?;
        sql::delivery_rows(recs)
    }

    async fn redrive_deliveries(&self, id: &str, now: DateTime<Utc>) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let queued = sql::redrive::<sqlx::Sqlite>(&mut *tx, id, now).await?;
        tx.commit().await?;
        Ok(queued)
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>> {
        let mut tx = self.write_tx().await?;
        let claimed = sql::claim::<sqlx::Sqlite>(&mut *tx, &SQL, now, lease, limit).await?;
        tx.commit().await?;
        Ok(claimed)
    }

    async fn record_attempt(
        &self,
        delivery: &DeliveryRow,
        now: DateTime<Utc>,
        outcome: &AttemptOutcome,
        rule: &RetryRule,
    ) -> Result<Recorded> {
        let mut tx = self.write_tx().await?;
        let recorded = sql::record::<sqlx::Sqlite>(&mut *tx, delivery, now, outcome, rule).await?;
        tx.commit().await?;
        Ok(recorded)
    }

    async fn announce_batches(&self, now: DateTime<Utc>, limit: u32) -> Result<u64> {
        let checks = {
            let mut conn = self.readers.acquire().await?;
            sql::batch_checks::<sqlx::Sqlite>(&mut *conn, limit).await?
        };
        let mut announced = 0;
        for check in &checks {
            let mut tx = self.write_tx().await?;
            announced += sql::settle_check::<sqlx::Sqlite>(&mut *tx, check, now).await?;
            tx.commit().await?;
        }
        Ok(announced)
    }

    async fn prune_deliveries(&self, before: DateTime<Utc>, limit: u32) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let pruned = sql::prune::<sqlx::Sqlite>(&mut *tx, before, limit).await?;
        tx.commit().await?;
        Ok(pruned)
    }
}
