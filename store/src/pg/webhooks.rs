//! Webhooks on Postgres: the shared statements of `crate::sql::webhooks` on the pool,
//! each write in one transaction.

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

use super::PgStore;

static SQL: LazyLock<WebhookStatements> = LazyLock::new(WebhookStatements::postgres);

#[async_trait]
impl WebhookStore for PgStore {
    async fn create_webhook(&self, new: &NewWebhook, max: u32) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        sql::create::<sqlx::Postgres>(&mut *conn, new, max).await
    }

    async fn webhook(&self, id: &str) -> Result<Option<WebhookRow>> {
        let mut conn = self.pool.acquire().await?;
        sql::endpoint::<sqlx::Postgres>(&mut *conn, id).await
    }

    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookRow>> {
        let mut conn = self.pool.acquire().await?;
        sql::endpoints::<sqlx::Postgres>(&mut *conn, tenant).await
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        Ok(sql::exec::<sqlx::Postgres>(&mut *conn, sql::DELETE_ENDPOINT, id).await? > 0)
    }

    async fn rotate_webhook(&self, id: &str, salt: &str, old_until: DateTime<Utc>) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        sql::rotate::<sqlx::Postgres>(&mut *conn, id, old_until, salt).await
    }

    async fn enable_webhook(&self, id: &str) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        Ok(sql::exec::<sqlx::Postgres>(&mut *conn, sql::ENABLE, id).await? > 0)
    }

    async fn disable_webhook(&self, id: &str, now: DateTime<Utc>, reason: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let disabled = sql::disable::<sqlx::Postgres>(&mut *tx, id, now, reason).await?;
        tx.commit().await?;
        Ok(disabled)
    }

    async fn delivery_counts(&self, id: &str) -> Result<DeliveryCounts> {
        let mut conn = self.pool.acquire().await?;
        sql::counts::<sqlx::Postgres>(&mut *conn, id).await
    }

    async fn list_deliveries(
        &self,
        id: &str,
        state: Option<DeliveryState>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>> {
        let recs: Vec<sql::DeliveryRecord> =
            sql::deliveries::<sqlx::Postgres>(id, state, cursor, limit)
                .build_query_as()
                .fetch_all(&self.pool)
                .await?;
        sql::delivery_rows(recs)
    }

    async fn redrive_deliveries(&self, id: &str, now: DateTime<Utc>) -> Result<u64> {
        let mut conn = self.pool.acquire().await?;
        sql::redrive::<sqlx::Postgres>(&mut *conn, id, now).await
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>> {
        let mut tx = self.pool.begin().await?;
        let claimed = sql::claim::<sqlx::Postgres>(&mut *tx, &SQL, now, lease, limit).await?;
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
        let mut tx = self.pool.begin().await?;
        let recorded =
            sql::record::<sqlx::Postgres>(&mut *tx, delivery, now, outcome, rule).await?;
        tx.commit().await?;
        Ok(recorded)
    }

    async fn announce_batches(&self, now: DateTime<Utc>, limit: u32) -> Result<u64> {
        let checks = {
            let mut conn = self.pool.acquire().await?;
            sql::batch_checks::<sqlx::Postgres>(&mut *conn, limit).await?
        };
        let mut announced = 0;
        for check in &checks {
            let mut tx = self.pool.begin().await?;
            announced += sql::settle_check::<sqlx::Postgres>(&mut *tx, check, now).await?;
            tx.commit().await?;
        }
        Ok(announced)
    }

    async fn prune_deliveries(&self, before: DateTime<Utc>, limit: u32) -> Result<u64> {
        let mut conn = self.pool.acquire().await?;
        sql::prune::<sqlx::Postgres>(&mut *conn, before, limit).await
    }
}
