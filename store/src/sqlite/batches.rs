//! Batches as objects of the API in the SQLite file (`BatchStore`): a batch is created in
//! one write transaction, its sessions inserted one by one (in-process calls) as the
//! caller reads them; its reads are the shared ones (`sql::batches`).

use async_trait::async_trait;
use sqlx::SqliteConnection;

use crate::batch::{
    BatchCreate, BatchItem, BatchOutcome, BatchRow, BatchTally, ItemRefused, NewBatch,
};
use crate::error::Result;
use crate::model::{NewSession, SessionRow};
use crate::rowconv::to_i64;
use crate::sql::batches::{self, SQLITE as SQL};
use crate::sql::escape::to_stored_json;
use crate::sql::record::SessionRecord;
use crate::store::{BatchSource, BatchStore};

use super::tx::now_us;
use super::{SqliteStore, workspace, writes};

#[async_trait]
impl BatchStore for SqliteStore {
    async fn create_batch(
        &self,
        batch: &NewBatch,
        items: &mut dyn BatchSource,
    ) -> Result<BatchCreate> {
        let now = now_us();
        // A batch streams its items into one transaction, so its input files' contents
        // are uploaded inside it (`add_item`), under the upload guard taken first, as
        // every upload takes it (see `SqliteStore::uploads`).
        let _uploading = self.upload(&[]).await?;
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.insert_batch)
            .bind(&batch.id)
            .bind(&batch.tenant)
            .bind(to_stored_json(&batch.metadata)?)
            .bind(batch.max_running.map(i64::from))
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let mut count: u64 = 0;
        loop {
            let chunk = match items.next_chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                // The caller's refusal, not the file's: end cleanly (a transaction left
                // open would mark the store suspect).
                Err(e) => {
                    tx.rollback().await?;
                    return Err(e);
                }
            };
            for item in chunk {
                if let Some(reason) = self.add_item(&mut tx, &item, now).await? {
                    tx.rollback().await?;
                    return Ok(BatchCreate::Refused {
                        index: count,
                        reason,
                    });
                }
                count = count.saturating_add(1);
            }
        }
        sqlx::query(&SQL.set_items)
            .bind(&batch.id)
            .bind(to_i64(count, "items")?)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(BatchCreate::Created { items: count })
    }

    async fn batch(&self, id: &str) -> Result<Option<BatchRow>> {
        batches::batch(&self.readers, &SQL, id).await
    }

    async fn list_batches(
        &self,
        tenant: Option<&str>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchRow>> {
        let records = batches::list::<sqlx::Sqlite>(tenant, cursor, limit)
            .build_query_as()
            .fetch_all(&self.readers)
            .await?;
        batches::rows(records)
    }

    async fn batch_tally(&self, ids: &[String]) -> Result<Vec<BatchTally>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        batches::tally(&self.readers, &SQL, serde_json::to_string(ids)?).await
    }

    async fn batch_outcomes(
        &self,
        id: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchOutcome>> {
        batches::outcomes(&self.readers, &SQL, id, after, limit).await
    }

    async fn cancel_batch(&self, id: &str, limit: u32) -> Result<Vec<SessionRow>> {
        let now = now_us();
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.mark_cancelled)
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        // Read to the end before the commit (see the module docs of the store).
        let rows: Vec<SessionRecord> = sqlx::query_as(&SQL.cancel_queued)
            .bind(id)
            .bind(i64::from(limit))
            .bind(now)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }
}

impl SqliteStore {
    /// Insert one item of a batch (with its files) inside the creation's transaction;
    /// why not, when it cannot be.
    async fn add_item(
        &self,
        conn: &mut SqliteConnection,
        item: &BatchItem,
        now: i64,
    ) -> Result<Option<ItemRefused>> {
        let s = &item.session;
        if !writes::insert(conn, s, item.custom_id.as_deref(), now).await? {
            return Ok(Some(refused_why(conn, s).await?));
        }
        if !s.files.is_empty() || s.workspace_from.is_some() {
            // Under the guard `create_batch` holds (a second read of it could wait
            // behind a collection waiting for the first).
            if let Some(objects) = &self.objects {
                objects
                    .put_all(&workspace::input_blobs(std::slice::from_ref(s)))
                    .await?;
            }
            workspace::add_inputs(conn, s, now, self.objects.is_some()).await?;
        }
        Ok(None)
    }
}

/// Why `s` was not inserted: its idempotency key names a session (a fresh id conflicts
/// with nothing else), else its `custom_id` repeats an earlier item's.
async fn refused_why(conn: &mut SqliteConnection, s: &NewSession) -> Result<ItemRefused> {
    if let Some(key) = &s.idempotency_key {
        let owner: Option<String> = sqlx::query_scalar(&SQL.key_owner)
            .bind(&s.tenant)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(session_id) = owner.filter(|o| *o != s.id) {
            return Ok(ItemRefused::IdempotencyKeyUsed { session_id });
        }
    }
    Ok(ItemRefused::CustomIdRepeated)
}
