//! Workspaces on Postgres: the `blobs` table as the blob store (and the collector's
//! index), each tree's manifest in `workspace_files`, the files a new session brings in
//! (inside its creation's transaction), and expiry and collection for the sweeper. The
//! manifest changes of a checkpoint are part of the group commit's one statement
//! (`batch`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgConnection;

use crate::blob::{BlobStore, check_keys};
use crate::error::{Error, Result};
use crate::model::NewSession;
use crate::rowconv::{to_i64, to_u64};
use crate::sql::files;
use crate::store::WorkspaceStore;
use crate::workspace::FileEntry;

use super::{PgStore, secs};
use crate::blob::s3::S3Blobs;

/// Upload: a blob stored already is only touched (its bytes are not sent twice to disk).
const PUT_BLOBS: &str = "
INSERT INTO blobs (sha256, size, data)
SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[])
ON CONFLICT (sha256) DO UPDATE SET touched_at = now(),
    data = COALESCE(blobs.data, EXCLUDED.data)";

/// The index rows of blobs whose bytes are in the object store (`data` NULL); locked
/// until the transaction that uploads their objects ends.
const PUT_INDEX: &str = "
INSERT INTO blobs (sha256, size, data)
SELECT k, n, NULL FROM UNNEST($1::text[], $2::bigint[]) AS b(k, n)
ON CONFLICT (sha256) DO UPDATE SET touched_at = now()";

/// [`TOUCH_BLOBS`] when the bytes are in the object store: the index row is the truth.
const TOUCH_INDEX: &str = "
UPDATE blobs SET touched_at = now() WHERE sha256 = ANY($1) RETURNING sha256";

/// The stored ones of the keys, touched; the rest are missing. A blob the collector holds
/// locked is waited for, and is then gone (so reported missing and uploaded again).
const TOUCH_BLOBS: &str = "
UPDATE blobs SET touched_at = now()
WHERE sha256 = ANY($1) AND data IS NOT NULL
RETURNING sha256";

/// Only unreferenced blobs, whoever asks.
const DELETE_BLOBS: &str = "
DELETE FROM blobs b WHERE b.sha256 = ANY($1)
  AND NOT EXISTS (SELECT 1 FROM workspace_files w WHERE w.sha256 = b.sha256)
  AND NOT EXISTS (SELECT 1 FROM workspace_versions v WHERE v.sha256 = b.sha256)
RETURNING b.sha256";

/// Byte order (`COLLATE \"C\"`), as SQLite sorts and as the API documents.
const FILES: &str = "
SELECT path, size, sha256, modified_at_seq FROM workspace_files
WHERE root_id = $1 ORDER BY path COLLATE \"C\"";

/// The tree (of the same tenant) whose files a new session forks.
const FORK_SOURCE: &str = "SELECT root_id FROM sessions WHERE id = $1 AND tenant = $2";

/// The fork's blobs are touched first: held by the collector, they are waited for.
const FORK_TOUCH: &str = "
UPDATE blobs SET touched_at = now()
WHERE sha256 IN (SELECT sha256 FROM workspace_files WHERE root_id = $1)";

const FORK: &str = "
INSERT INTO workspace_files (root_id, path, sha256, size, modified_at_seq)
SELECT $1, path, sha256, size, 0 FROM workspace_files WHERE root_id = $2
ON CONFLICT (root_id, path) DO NOTHING";

const PUT_INPUTS: &str = "
INSERT INTO workspace_files (root_id, path, sha256, size, modified_at_seq)
SELECT $1, p, s, n, 0 FROM UNNEST($2::text[], $3::text[], $4::bigint[]) AS f(p, s, n)
ON CONFLICT (root_id, path) DO UPDATE
    SET sha256 = EXCLUDED.sha256, size = EXCLUDED.size, modified_at_seq = 0";

/// Trees whose root finished (and did not start again) before the cutoff and that still
/// hold files.
const EXPIRE: &str = "
WITH t AS (
    SELECT s.id FROM sessions s
    WHERE s.parent_id IS NULL AND s.finished_at IS NOT NULL
      AND s.finished_at < now() - make_interval(secs => $1)
      AND s.status IN ('completed', 'failed', 'cancelled')
      AND EXISTS (SELECT 1 FROM workspace_files w WHERE w.root_id = s.id)
    ORDER BY s.finished_at
    LIMIT $2
), d AS (
    DELETE FROM workspace_files w USING t WHERE w.root_id = t.id
), v AS (
    DELETE FROM workspace_versions v USING t WHERE v.root_id = t.id
)
SELECT count(*) FROM t";

/// Unreferenced blobs (by no tree's files, nor any earlier version of them) untouched for the grace period, locked (a concurrent check that
/// would touch one waits, then finds it gone) and deleted in one statement.
const COLLECT: &str = "
WITH g AS (
    SELECT b.sha256 FROM blobs b
    WHERE b.touched_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM workspace_files w WHERE w.sha256 = b.sha256)
      AND NOT EXISTS (SELECT 1 FROM workspace_versions v WHERE v.sha256 = b.sha256)
    ORDER BY b.touched_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM blobs b USING g WHERE b.sha256 = g.sha256
RETURNING b.sha256";

/// Each key once (a batch may hold a content twice: one insert may not touch a row twice).
fn dedupe(blobs: &[(String, Vec<u8>)]) -> BTreeMap<&str, &[u8]> {
    blobs
        .iter()
        .map(|(k, d)| (k.as_str(), d.as_slice()))
        .collect()
}

/// Store `blobs`: in the table, or with an object store, their index rows (locked until
/// `conn`'s transaction ends, so the collector skips them) and then their objects. The
/// collector deletes an index row and then its object inside one transaction holding the
/// row, so an upload of the same content waits for it to finish and then writes the
/// object afresh: no index row is left without its object.
async fn put_blobs_in(
    conn: &mut PgConnection,
    blobs: &[(String, Vec<u8>)],
    objects: Option<&S3Blobs>,
) -> Result<()> {
    if blobs.is_empty() {
        return Ok(());
    }
    check_keys(blobs)?;
    let unique = dedupe(blobs);
    let keys: Vec<&str> = unique.keys().copied().collect();
    let mut sizes = Vec::with_capacity(keys.len());
    for d in unique.values() {
        sizes.push(to_i64(d.len() as u64, "blob")?);
    }
    if let Some(objects) = objects {
        sqlx::query(PUT_INDEX)
            .bind(&keys)
            .bind(&sizes)
            .execute(&mut *conn)
            .await?;
        let unique: Vec<(String, Vec<u8>)> = unique
            .iter()
            .map(|(k, d)| ((*k).to_string(), d.to_vec()))
            .collect();
        return objects.put_all(&unique).await;
    }
    let data: Vec<&[u8]> = unique.values().copied().collect();
    sqlx::query(PUT_BLOBS)
        .bind(&keys)
        .bind(&sizes)
        .bind(&data)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The workspace of each session of `new` that was inserted (`inserted(id)`): the tree of
/// `workspace_from` copied, then the input files over it. Inside the creation's
/// transaction: a session is created with all of its files or not at all.
pub(super) async fn add_inputs(
    conn: &mut PgConnection,
    new: &[NewSession],
    inserted: impl Fn(&str) -> bool,
    objects: Option<&S3Blobs>,
) -> Result<()> {
    for s in new
        .iter()
        .filter(|s| !s.files.is_empty() || s.workspace_from.is_some())
    {
        if !inserted(&s.id) {
            continue;
        }
        if let Some(from) = &s.workspace_from {
            let source: Option<String> = sqlx::query_scalar(FORK_SOURCE)
                .bind(from)
                .bind(&s.tenant)
                .fetch_optional(&mut *conn)
                .await?;
            // Another tenant's session is as unknown as a missing one.
            let source = source.ok_or_else(|| Error::NotFound(from.clone()))?;
            sqlx::query(FORK_TOUCH)
                .bind(&source)
                .execute(&mut *conn)
                .await?;
            sqlx::query(FORK)
                .bind(&s.root_id)
                .bind(&source)
                .execute(&mut *conn)
                .await?;
        }
        if !s.files.is_empty() {
            let files::Inputs { by_path, blobs } = files::inputs(s)?;
            put_blobs_in(conn, &blobs, objects).await?;
            let paths: Vec<&str> = by_path.keys().copied().collect();
            let keys: Vec<&str> = by_path.values().map(|(k, _)| k.as_str()).collect();
            let sizes: Vec<i64> = by_path.values().map(|(_, n)| *n).collect();
            sqlx::query(PUT_INPUTS)
                .bind(&s.root_id)
                .bind(&paths)
                .bind(&keys)
                .bind(&sizes)
                .execute(&mut *conn)
                .await?;
        }
        // The tree's files as of its first step, for a fork of it (`sql::fork`).
        sqlx::query(&crate::sql::fork::POSTGRES.versions)
            .bind(&s.root_id)
            .bind(0i32)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

#[async_trait]
impl BlobStore for PgStore {
    async fn put_blobs(&self, blobs: &[(String, Vec<u8>)]) -> Result<()> {
        if blobs.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        put_blobs_in(&mut tx, blobs, self.objects.as_deref()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_blob(&self, key: &str) -> Result<Option<Vec<u8>>> {
        files::blob(&self.pool, self.objects.as_deref(), key).await
    }

    async fn missing_blobs(&self, keys: &[String]) -> Result<Vec<String>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let touch = if self.objects.is_some() {
            TOUCH_INDEX
        } else {
            TOUCH_BLOBS
        };
        let present: Vec<String> = sqlx::query_scalar(touch)
            .bind(keys)
            .fetch_all(&self.pool)
            .await?;
        let present: std::collections::HashSet<String> = present.into_iter().collect();
        Ok(keys
            .iter()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect())
    }

    async fn delete_blobs(&self, keys: &[String]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        let gone: Vec<String> = sqlx::query_scalar(DELETE_BLOBS)
            .bind(keys)
            .fetch_all(&mut *tx)
            .await?;
        let deleted = match &self.objects {
            Some(o) => o.delete_all(&gone).await,
            None => Ok(()),
        };
        // Committed even when an object's delete failed: an object without its index row
        // is only garbage, while an index row without its object would be served as held.
        tx.commit().await?;
        deleted
    }

    fn inline_limit(&self) -> u64 {
        files::inline_limit(self.objects.as_deref())
    }
}

#[async_trait]
impl WorkspaceStore for PgStore {
    async fn workspace_files(&self, root_id: &str) -> Result<Vec<FileEntry>> {
        files::files(&self.pool, FILES, root_id).await
    }

    async fn workspace_file(
        &self,
        root_id: &str,
        path: &str,
    ) -> Result<Option<(FileEntry, Vec<u8>)>> {
        files::file(&self.pool, self.objects.as_deref(), root_id, path).await
    }
}

impl PgStore {
    /// [`crate::SweepStore::expire_workspaces`].
    pub(super) async fn expire_trees(&self, ttl: Duration, limit: u32) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(EXPIRE)
            .bind(secs(ttl))
            .bind(i64::from(limit))
            .fetch_one(&self.pool)
            .await?;
        to_u64(n, "count")
    }

    /// [`crate::SweepStore::collect_blobs`].
    ///
    /// With an object store, the index rows are deleted first and their objects then,
    /// inside the transaction that holds the rows: a check or upload of one of these
    /// contents waits for it, then finds it gone (and uploads it again). A failed
    /// object delete still commits the rows' deletion (the object is left as garbage,
    /// never an index row pointing nowhere) and is reported for the log.
    pub(super) async fn collect(&self, grace: Duration, limit: u32) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let gone: Vec<String> = sqlx::query_scalar(COLLECT)
            .bind(secs(grace))
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        let deleted = match &self.objects {
            Some(o) => o.delete_all(&gone).await,
            None => Ok(()),
        };
        tx.commit().await?;
        deleted.map(|()| gone.len() as u64)
    }

    /// Keep the bytes of blobs in `objects` (an S3-compatible bucket) and only their
    /// index in the `blobs` table. Contents stored in the table before stay readable.
    pub fn with_objects(mut self, objects: std::sync::Arc<S3Blobs>) -> Self {
        self.objects = Some(objects);
        self
    }
}
