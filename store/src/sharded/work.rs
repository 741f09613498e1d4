//! Workspaces, blobs and batches on the sharded store. A tree's files are on its shard;
//! blobs are content-addressed and each shard's collector deletes those its own
//! workspaces no longer reference, so a blob is written to every shard (a checkpoint on
//! any of them may reference it) and read from the first that has it. A batch's row and
//! all its sessions are on the batch id's shard: its creation stays one transaction and
//! its tallies one statement.

use async_trait::async_trait;

use agentq_types::shard::ShardMap;

use super::ShardedStore;
use super::merge::{cap, merge_pages};
use crate::batch::{BatchCreate, BatchItem, BatchOutcome, BatchRow, BatchTally, NewBatch};
use crate::blob::BlobStore;
use crate::error::{Error, Result};
use crate::model::SessionRow;
use crate::store::{BatchSource, BatchStore, Store, WorkspaceStore};
use crate::workspace::FileEntry;

#[async_trait]
impl<S: Store> BlobStore for ShardedStore<S> {
    async fn put_blobs(&self, blobs: &[(String, Vec<u8>)]) -> Result<()> {
        self.each(|s| s.put_blobs(blobs)).await.map(|_| ())
    }

    async fn get_blob(&self, key: &str) -> Result<Option<Vec<u8>>> {
        for i in 0..self.len() {
            if let Some(bytes) = self.on(i).get_blob(key).await? {
                return Ok(Some(bytes));
            }
        }
        Ok(None)
    }

    /// Missing on any shard counts as missing: the upload then reaches every shard.
    async fn missing_blobs(&self, keys: &[String]) -> Result<Vec<String>> {
        let missing: std::collections::BTreeSet<String> = self
            .concat(|s| s.missing_blobs(keys))
            .await?
            .into_iter()
            .collect();
        Ok(keys
            .iter()
            .filter(|k| missing.contains(*k))
            .cloned()
            .collect())
    }

    async fn delete_blobs(&self, keys: &[String]) -> Result<()> {
        self.each(|s| s.delete_blobs(keys)).await.map(|_| ())
    }

    fn inline_limit(&self) -> u64 {
        self.control().inline_limit()
    }
}

#[async_trait]
impl<S: Store> WorkspaceStore for ShardedStore<S> {
    async fn workspace_files(&self, root_id: &str) -> Result<Vec<FileEntry>> {
        by_id!(self, "workspace_files", root_id, |s| s
            .workspace_files(root_id))
    }

    async fn workspace_file(
        &self,
        root_id: &str,
        path: &str,
    ) -> Result<Option<(FileEntry, Vec<u8>)>> {
        by_id!(self, "workspace_file", root_id, |s| s
            .workspace_file(root_id, path))
    }
}

/// A batch's items, checked to be on the batch's shard (the API mints their ids in the
/// batch's partition): a batch is never written across shards.
struct Beside<'a> {
    items: &'a mut dyn BatchSource,
    batch_id: &'a str,
    map: std::sync::Arc<ShardMap>,
}

impl Beside<'_> {
    fn shard(&self, id: &str) -> usize {
        self.map.shard(id)
    }
}

#[async_trait]
impl BatchSource for Beside<'_> {
    async fn next_chunk(&mut self) -> Result<Option<Vec<BatchItem>>> {
        let Some(chunk) = self.items.next_chunk().await? else {
            return Ok(None);
        };
        let home = self.shard(self.batch_id);
        if let Some(item) = chunk.iter().find(|i| self.shard(&i.session.id) != home) {
            return Err(Error::Invalid {
                field: "id".into(),
                message: format!(
                    "session {} of batch {} is not in the batch's partition",
                    item.session.id, self.batch_id
                ),
            });
        }
        Ok(Some(chunk))
    }
}

#[async_trait]
impl<S: Store> BatchStore for ShardedStore<S> {
    async fn create_batch(
        &self,
        batch: &NewBatch,
        items: &mut dyn BatchSource,
    ) -> Result<BatchCreate> {
        let mut beside = Beside {
            items,
            batch_id: &batch.id,
            map: self.shard_map(),
        };
        by_id!(self, "create_batch", &batch.id, |s| s
            .create_batch(batch, &mut beside))
    }

    async fn batch(&self, id: &str) -> Result<Option<BatchRow>> {
        by_id!(self, "batch", id, |s| s.batch(id))
    }

    async fn list_batches(
        &self,
        tenant: Option<&str>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchRow>> {
        let pages = self.each(|s| s.list_batches(tenant, cursor, limit)).await?;
        Ok(merge_pages(pages, |b| b.id.clone(), true, cap(limit)))
    }

    async fn batch_tally(&self, ids: &[String]) -> Result<Vec<BatchTally>> {
        let groups = self.split(ids.iter().map(String::as_str));
        let calls = groups.into_iter().map(|(i, positions)| {
            let part: Vec<String> = positions.iter().map(|p| ids[*p].clone()).collect();
            async move { self.on(i).batch_tally(&part).await }
        });
        let lists = futures::future::try_join_all(calls).await?;
        Ok(lists.into_iter().flatten().collect())
    }

    async fn batch_outcomes(
        &self,
        id: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchOutcome>> {
        by_id!(self, "batch_outcomes", id, |s| s
            .batch_outcomes(id, after, limit))
    }

    async fn cancel_batch(&self, id: &str, limit: u32) -> Result<Vec<SessionRow>> {
        by_id!(self, "cancel_batch", id, |s| s.cancel_batch(id, limit))
    }
}
