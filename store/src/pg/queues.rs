//! Named queues on Postgres: creating one under the limit, and listing them (`queues`).

use async_trait::async_trait;

use crate::error::Result;
use crate::sql::read;
use crate::sql::statements::POSTGRES as SQL;
use crate::store::{QueueCreate, QueueStore};

use super::PgStore;

#[async_trait]
impl QueueStore for PgStore {
    async fn create_queue(&self, name: &str, limit: usize) -> Result<QueueCreate> {
        let mut tx = self.pool.begin().await?;
        // Schedulers creating queues at once take turns, so the count they check holds.
        sqlx::query("LOCK TABLE queues IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await?;
        let exists: i64 = sqlx::query_scalar(&SQL.queue_exists)
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        if exists > 0 {
            return Ok(QueueCreate::Exists);
        }
        let added = sqlx::query(&SQL.insert_queue)
            .bind(name)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(if added > 0 {
            QueueCreate::Created
        } else {
            QueueCreate::Full
        })
    }

    async fn stored_queues(&self) -> Result<Vec<String>> {
        read::queues(&self.pool, &SQL).await
    }
}
