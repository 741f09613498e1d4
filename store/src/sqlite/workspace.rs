//! Workspaces on SQLite (the embedded mode): the `blobs` table as the blob store, each
//! tree's manifest in `workspace_files`, a new session's files inside its creation's
//! transaction, a checkpoint's manifest changes inside its commit's, and expiry and
//! collection. Writes are serialized by the file lock, so a collection can never race a
//! commit's statements; only an upload made before its commit relies on the grace period.
//! With an object store, contents are uploaded before the write transaction that indexes
//! them, under the store's upload guard (see `SqliteStore::uploads`), never inside it.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::SqliteConnection;

use crate::blob::{BlobStore, check_keys};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::NewSession;
use crate::rowconv::to_i64;
use crate::sql::files;
use crate::store::WorkspaceStore;
use crate::workspace::FileEntry;

use super::SqliteStore;
use super::tx::{dur_us, now_us};
use crate::blob::s3::S3Blobs;

const PUT_BLOB: &str = "
INSERT INTO blobs (sha256, size, data, touched_at) VALUES ($1, $2, $3, $4)
ON CONFLICT (sha256) DO UPDATE SET touched_at = excluded.touched_at,
    data = COALESCE(blobs.data, excluded.data)";

const PUT_INDEX: &str = "
INSERT INTO blobs (sha256, size, data, touched_at) VALUES ($1, $2, NULL, $3)
ON CONFLICT (sha256) DO UPDATE SET touched_at = excluded.touched_at";

/// With an object store, the index row is the truth.
const TOUCH_INDEX: &str = "UPDATE blobs SET touched_at = $2 WHERE sha256 = $1 RETURNING sha256";

const TOUCH_BLOB: &str =
    "UPDATE blobs SET touched_at = $2 WHERE sha256 = $1 AND data IS NOT NULL RETURNING sha256";

const FILES: &str = "SELECT path, size, sha256, modified_at_seq FROM workspace_files \
     WHERE root_id = $1 ORDER BY path";

const PUT_FILE: &str = "
INSERT INTO workspace_files (root_id, path, sha256, size, modified_at_seq)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (root_id, path) DO UPDATE SET sha256 = excluded.sha256, size = excluded.size,
    modified_at_seq = excluded.modified_at_seq";

const DELETE_FILE: &str = "DELETE FROM workspace_files WHERE root_id = $1 AND path = $2";

/// A change as a version too (see `migrations/0023_forks.sql`): the root's own at the
/// history length it commits (`$6`, the change's seq, plus one), a sub-agent's (`$5` not
/// the root) at the root's next.
const PUT_VERSION: &str = "
INSERT INTO workspace_versions (root_id, path, sha256, size, step_len)
VALUES ($1, $2, $3, $4, CASE WHEN $5 = $1 THEN $6 + 1
    ELSE COALESCE((SELECT r.history_len FROM sessions r WHERE r.id = $1), 0) + 1 END)";

/// Store `blobs`, inside the caller's write transaction: in the table, or with an object
/// store (`indexed`) only their index rows, their objects uploaded already by
/// [`SqliteStore::upload`], whose guard the caller holds until this transaction ends: no
/// collection can come between an object and its row, so no index row is ever left
/// without its object.
async fn put_blobs_in(
    conn: &mut SqliteConnection,
    blobs: &[(String, Vec<u8>)],
    now: i64,
    indexed: bool,
) -> Result<()> {
    check_keys(blobs)?;
    for (key, data) in blobs {
        if indexed {
            sqlx::query(PUT_INDEX)
                .bind(key)
                .bind(to_i64(data.len() as u64, "blob")?)
                .bind(now)
                .execute(&mut *conn)
                .await?;
        } else {
            put_blob(conn, key, data, now).await?;
        }
    }
    Ok(())
}

/// The contents of the input files of the sessions of `new` that have any, to upload
/// before their creation's transaction. A session whose files are refused is left for its
/// creation to refuse.
pub(super) fn input_blobs(new: &[NewSession]) -> Vec<(String, Vec<u8>)> {
    let mut blobs = Vec::new();
    for s in new.iter().filter(|s| !s.files.is_empty()) {
        if let Ok(inputs) = files::inputs(s) {
            blobs.extend(inputs.blobs);
        }
    }
    blobs
}

/// Held from before a content's upload until the write transaction that indexes it ends
/// (see `SqliteStore::uploads`); `None` without an object store.
pub(super) type Uploading = Option<tokio::sync::OwnedRwLockReadGuard<()>>;

impl SqliteStore {
    /// Upload `blobs` to the object store, if there is one, before the write transaction
    /// that indexes them: the file lock is not held while the object store answers. The
    /// guard returned is to be held until that transaction ends, and taken before it
    /// begins (the guard, then the file lock, as a collection takes them).
    pub(super) async fn upload(&self, blobs: &[(String, Vec<u8>)]) -> Result<Uploading> {
        let Some(objects) = &self.objects else {
            return Ok(None);
        };
        let guard = self.uploads.clone().read_owned().await;
        if !blobs.is_empty() {
            objects.put_all(blobs).await?;
        }
        Ok(Some(guard))
    }

    /// [`Self::upload`] of the input files of the sessions of `new`.
    pub(super) async fn upload_inputs(&self, new: &[NewSession]) -> Result<Uploading> {
        if self.objects.is_none() {
            return Ok(None);
        }
        self.upload(&input_blobs(new)).await
    }

    /// The objects of `gone` (contents whose rows a collection deleted and committed)
    /// deleted from the object store, if there is one.
    async fn delete_objects(&self, gone: &[String]) -> Result<()> {
        match &self.objects {
            Some(o) => o.delete_all(gone).await,
            None => Ok(()),
        }
    }

    /// A collection's hold on the uploads: none runs while it deletes contents' rows and
    /// objects (see `SqliteStore::uploads`); `None` without an object store.
    async fn collecting(&self) -> Option<tokio::sync::RwLockWriteGuard<'_, ()>> {
        match self.objects {
            Some(_) => Some(self.uploads.write().await),
            None => None,
        }
    }
}

/// One content's row in the table (touched if stored already).
async fn put_blob(conn: &mut SqliteConnection, key: &str, data: &[u8], now: i64) -> Result<()> {
    sqlx::query(PUT_BLOB)
        .bind(key)
        .bind(to_i64(data.len() as u64, "blob")?)
        .bind(data)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The workspace of a session just inserted: the tree of `workspace_from` copied, then
/// the input files over it; inside the creation's transaction. With an object store
/// (`indexed`), the files' contents were uploaded before it ([`SqliteStore::upload`]).
pub(super) async fn add_inputs(
    conn: &mut SqliteConnection,
    s: &NewSession,
    now: i64,
    indexed: bool,
) -> Result<()> {
    if let Some(from) = &s.workspace_from {
        let source: Option<String> =
            sqlx::query_scalar("SELECT root_id FROM sessions WHERE id = $1 AND tenant = $2")
                .bind(from)
                .bind(&s.tenant)
                .fetch_optional(&mut *conn)
                .await?;
        // Another tenant's session is as unknown as a missing one.
        let source = source.ok_or_else(|| Error::NotFound(from.clone()))?;
        sqlx::query(
            "UPDATE blobs SET touched_at = $2 \
             WHERE sha256 IN (SELECT sha256 FROM workspace_files WHERE root_id = $1)",
        )
        .bind(&source)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "INSERT INTO workspace_files (root_id, path, sha256, size, modified_at_seq) \
             SELECT $1, path, sha256, size, 0 FROM workspace_files WHERE root_id = $2 \
             ON CONFLICT (root_id, path) DO NOTHING",
        )
        .bind(&s.root_id)
        .bind(&source)
        .execute(&mut *conn)
        .await?;
    }
    let files::Inputs { by_path, blobs } = files::inputs(s)?;
    for blob in blobs {
        put_blobs_in(conn, std::slice::from_ref(&blob), now, indexed).await?;
    }
    for (path, (key, size)) in by_path {
        sqlx::query(PUT_FILE)
            .bind(&s.root_id)
            .bind(path)
            .bind(key)
            .bind(size)
            .bind(0i64)
            .execute(&mut *conn)
            .await?;
    }
    // The tree's files as of its first step, for a fork of it (`sql::fork`).
    sqlx::query(&crate::sql::fork::SQLITE.versions)
        .bind(&s.root_id)
        .bind(0i32)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A checkpoint's manifest changes, after its fenced row update matched.
pub(super) async fn commit_files(conn: &mut SqliteConnection, cp: &Checkpoint) -> Result<()> {
    let root = &cp.lease.root_id;
    let seq = cp.file_seq();
    // The contents the checkpoint carries, in the same transaction as the manifest rows
    // that reference them (no collector can come between the two).
    let now = now_us();
    for (key, data) in &cp.blobs {
        put_blob(conn, key, data, now).await?;
    }
    for f in &cp.files {
        sqlx::query(PUT_VERSION)
            .bind(root)
            .bind(&f.path)
            .bind(f.blob.as_ref().map(|b| b.sha256.as_str()))
            .bind(f.blob.as_ref().map_or(Ok(0), |b| to_i64(b.size, "files"))?)
            .bind(&cp.lease.session_id)
            .bind(seq)
            .execute(&mut *conn)
            .await?;
        match &f.blob {
            Some(b) => {
                sqlx::query(PUT_FILE)
                    .bind(root)
                    .bind(&f.path)
                    .bind(&b.sha256)
                    .bind(to_i64(b.size, "files")?)
                    .bind(seq)
                    .execute(&mut *conn)
                    .await?;
            }
            None => {
                sqlx::query(DELETE_FILE)
                    .bind(root)
                    .bind(&f.path)
                    .execute(&mut *conn)
                    .await?;
            }
        }
    }
    Ok(())
}

#[async_trait]
impl BlobStore for SqliteStore {
    async fn put_blobs(&self, blobs: &[(String, Vec<u8>)]) -> Result<()> {
        if blobs.is_empty() {
            return Ok(());
        }
        check_keys(blobs)?;
        let uploaded = self.upload(blobs).await?;
        let mut tx = self.write_tx().await?;
        put_blobs_in(&mut tx, blobs, now_us(), uploaded.is_some()).await?;
        let committed = tx.commit().await;
        drop(uploaded);
        committed
    }

    async fn get_blob(&self, key: &str) -> Result<Option<Vec<u8>>> {
        files::blob(&self.readers, self.objects.as_deref(), key).await
    }

    async fn missing_blobs(&self, keys: &[String]) -> Result<Vec<String>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_us();
        let touch = if self.objects.is_some() {
            TOUCH_INDEX
        } else {
            TOUCH_BLOB
        };
        let mut tx = self.write_tx().await?;
        let mut missing = Vec::new();
        for key in keys {
            let found: Option<String> = sqlx::query_scalar(touch)
                .bind(key)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            if found.is_none() {
                missing.push(key.clone());
            }
        }
        tx.commit().await?;
        Ok(missing)
    }

    async fn delete_blobs(&self, keys: &[String]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let _alone = self.collecting().await;
        let mut tx = self.write_tx().await?;
        let mut gone = Vec::new();
        for key in keys {
            let n = sqlx::query(
                "DELETE FROM blobs WHERE sha256 = $1 \
                 AND NOT EXISTS (SELECT 1 FROM workspace_files w WHERE w.sha256 = $1) \
                 AND NOT EXISTS (SELECT 1 FROM workspace_versions v WHERE v.sha256 = $1)",
            )
            .bind(key)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n > 0 {
                gone.push(key.clone());
            }
        }
        tx.commit().await?;
        // See `collect` on the objects' deletion after the rows'.
        self.delete_objects(&gone).await
    }

    fn inline_limit(&self) -> u64 {
        files::inline_limit(self.objects.as_deref())
    }
}

#[async_trait]
impl WorkspaceStore for SqliteStore {
    async fn workspace_files(&self, root_id: &str) -> Result<Vec<FileEntry>> {
        files::files(&self.readers, FILES, root_id).await
    }

    async fn workspace_file(
        &self,
        root_id: &str,
        path: &str,
    ) -> Result<Option<(FileEntry, Vec<u8>)>> {
        files::file(&self.readers, self.objects.as_deref(), root_id, path).await
    }
}

impl SqliteStore {
    /// [`crate::SweepStore::expire_workspaces`].
    pub(super) async fn expire_trees(&self, ttl: Duration, limit: u32) -> Result<u64> {
        let cutoff = now_us().saturating_sub(dur_us(ttl));
        let mut tx = self.write_tx().await?;
        let trees: Vec<String> = sqlx::query_scalar(
            "SELECT s.id FROM sessions s \
             WHERE s.parent_id IS NULL AND s.finished_at IS NOT NULL AND s.finished_at < $1 \
               AND s.status IN ('completed', 'failed', 'cancelled') \
               AND EXISTS (SELECT 1 FROM workspace_files w WHERE w.root_id = s.id) \
             ORDER BY s.finished_at LIMIT $2",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        for t in &trees {
            for table in ["workspace_files", "workspace_versions"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE root_id = $1"))
                    .bind(t)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(trees.len() as u64)
    }

    /// [`crate::SweepStore::collect_blobs`].
    ///
    /// With an object store, the index rows are deleted and committed first, and their
    /// objects deleted then, with no upload running from before the rows' deletion to
    /// after the objects' (the upload guard), and no other write held up by the object
    /// store (the file lock is let go first). A failed object delete leaves the object as
    /// garbage, never an index row pointing nowhere; the failure is reported for the log.
    pub(super) async fn collect(&self, grace: Duration, limit: u32) -> Result<u64> {
        let cutoff = now_us().saturating_sub(dur_us(grace));
        let _alone = self.collecting().await;
        let mut tx = self.write_tx().await?;
        let gone: Vec<String> = sqlx::query_scalar(
            "DELETE FROM blobs WHERE sha256 IN (SELECT b.sha256 FROM blobs b \
                 WHERE b.touched_at < $1 \
                   AND NOT EXISTS (SELECT 1 FROM workspace_files w WHERE w.sha256 = b.sha256) \
                   AND NOT EXISTS (SELECT 1 FROM workspace_versions v WHERE v.sha256 = b.sha256) \
                 ORDER BY b.touched_at LIMIT $2) RETURNING sha256",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        self.delete_objects(&gone).await.map(|()| gone.len() as u64)
    }

    /// Keep the bytes of blobs in `objects` (an S3-compatible bucket) and only their
    /// index in the `blobs` table. Contents stored in the table before stay readable.
    pub fn with_objects(mut self, objects: std::sync::Arc<S3Blobs>) -> Self {
        self.objects = Some(objects);
        self
    }
}
