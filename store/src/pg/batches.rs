//! Batches as objects of the API on Postgres (`BatchStore`; not the group commit's batch
//! of checkpoints, which is `batch.rs`): a batch is created in one transaction, its
//! sessions inserted a chunk at a time as the caller reads them, each chunk one multi-row
//! insert; its reads are the shared ones (`sql::batches`).

use std::collections::HashSet;

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::batch::{
    BatchCreate, BatchItem, BatchOutcome, BatchRow, BatchTally, ItemRefused, NewBatch,
};
use crate::error::Result;
use crate::model::{NewSession, SessionRow};
use crate::rowconv::to_i64;
use crate::sql::batches::{self, POSTGRES as SQL};
use crate::sql::escape::to_stored_json;
use crate::sql::record::SessionRecord;
use crate::store::{BatchSource, BatchStore};

use super::{PgStore, create, workspace};

#[async_trait]
impl BatchStore for PgStore {
    async fn create_batch(
        &self,
        batch: &NewBatch,
        items: &mut dyn BatchSource,
    ) -> Result<BatchCreate> {
        // Dropped without a commit on every early return: nothing of the batch stays.
        let mut tx = self.pool.begin().await?;
        sqlx::query(&SQL.insert_batch)
            .bind(&batch.id)
            .bind(&batch.tenant)
            .bind(to_stored_json(&batch.metadata)?)
            .bind(batch.max_running.map(i64::from))
            .execute(&mut *tx)
            .await?;
        let mut count: u64 = 0;
        while let Some(chunk) = items.next_chunk().await? {
            let n = u64::try_from(chunk.len()).unwrap_or(u64::MAX);
            if let Some((i, reason)) = self.add_chunk(&mut tx, chunk).await? {
                let index = count.saturating_add(u64::try_from(i).unwrap_or(u64::MAX));
                return Ok(BatchCreate::Refused { index, reason });
            }
            count = count.saturating_add(n);
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
        batches::batch(&self.pool, &SQL, id).await
    }

    async fn list_batches(
        &self,
        tenant: Option<&str>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchRow>> {
        let records = batches::list::<sqlx::Postgres>(tenant, cursor, limit)
            .build_query_as()
            .fetch_all(&self.pool)
            .await?;
        batches::rows(records)
    }

    async fn batch_tally(&self, ids: &[String]) -> Result<Vec<BatchTally>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        batches::tally(&self.pool, &SQL, ids.to_vec()).await
    }

    async fn batch_outcomes(
        &self,
        id: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchOutcome>> {
        batches::outcomes(&self.pool, &SQL, id, after, limit).await
    }

    async fn cancel_batch(&self, id: &str, limit: u32) -> Result<Vec<SessionRow>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&SQL.mark_cancelled)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let rows: Vec<SessionRecord> = sqlx::query_as(&SQL.cancel_queued)
            .bind(id)
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }
}

impl PgStore {
    /// Insert one chunk of a batch (with the files of its items) inside the creation's
    /// transaction; the first item not inserted (its place in the chunk) and why.
    async fn add_chunk(
        &self,
        tx: &mut PgConnection,
        chunk: Vec<BatchItem>,
    ) -> Result<Option<(usize, ItemRefused)>> {
        let (sessions, custom_ids): (Vec<NewSession>, Vec<Option<String>>) =
            chunk.into_iter().map(|i| (i.session, i.custom_id)).unzip();
        let customs: Vec<Option<&str>> = custom_ids.iter().map(Option::as_deref).collect();
        let inserted: HashSet<String> = create::insert_ids(&mut *tx, &sessions, &customs).await?;
        if let Some(i) = sessions.iter().position(|s| !inserted.contains(&s.id)) {
            return Ok(Some((i, refused_why(tx, &sessions[i]).await?)));
        }
        workspace::add_inputs(tx, &sessions, |_| true, self.objects.as_deref()).await?;
        Ok(None)
    }
}

/// Why `s` was not inserted: its idempotency key names a session (a fresh id conflicts
/// with nothing else), else its `custom_id` repeats an earlier item's.
async fn refused_why(tx: &mut PgConnection, s: &NewSession) -> Result<ItemRefused> {
    if let Some(key) = &s.idempotency_key {
        let owner: Option<String> = sqlx::query_scalar(&SQL.key_owner)
            .bind(&s.tenant)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(session_id) = owner.filter(|o| *o != s.id) {
            return Ok(ItemRefused::IdempotencyKeyUsed { session_id });
        }
    }
    Ok(ItemRefused::CustomIdRepeated)
}
