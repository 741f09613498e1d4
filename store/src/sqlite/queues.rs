//! Named queues in the SQLite file: creating one under the limit, and listing them.

use async_trait::async_trait;

use crate::error::Result;
use crate::sql::read;
use crate::sql::statements::SQLITE as SQL;
use crate::store::{QueueCreate, QueueStore};

use super::SqliteStore;
use super::tx::now_us;

#[async_trait]
impl QueueStore for SqliteStore {
    async fn create_queue(&self, name: &str, limit: usize) -> Result<QueueCreate> {
        // The one writer's transaction: the count and the insert cannot interleave.
        let mut tx = self.write_tx().await?;
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
            .bind(now_us())
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
        read::queues(&self.readers, &SQL).await
    }
}
