//! The embedded [`Store`]: one SQLite file (`migrations_sqlite/`) with the same tables,
//! columns and lease protocol as [`crate::pg::PgStore`], for running agentq as a single
//! process without Postgres or Redis. This module owns that file: its connections, its
//! schema and migrator, and what the recovery step a restarted embedded process runs
//! (`agentq_core::sqlite::requeue_runnable`, which needs the queue too) reads and marks.
//! The statements it shares with Postgres, and the mapping of rows to the model, are in
//! `crate::sql`; the writes SQLite runs as several steps of one transaction (where
//! Postgres runs one statement) are in `writes`.
//!
//! This file owns the store itself (its connections, the migrator, the schema check);
//! the write transaction and the clock are in `tx`, and each trait's implementation has
//! its own module: `sessions`, `leases`, `inbox`, `sweep`, `keys`, `queues`, `budget`,
//! `workspace` and `batches`.
//!
//! Semantics are Postgres': a claim bumps `lease_epoch`; every later write is conditional
//! on `(lease_owner, lease_epoch)`; a checkpoint writes the row's scalars and only the new
//! messages in ONE transaction, fenced in that same transaction, so a fenced-off worker
//! writes nothing; a retried final checkpoint or release that finds its own earlier
//! attempt committed is a success. Message 0 (the prompt, which the spec holds) is not
//! stored, and `history_len` tells a claim whether there is a stored history to read.
//!
//! # Connections and durability
//! - SQLite allows one writer at a time. Every write goes through a pool of exactly one
//!   connection, so writers queue in the pool (in order, without spinning) instead of
//!   meeting `SQLITE_BUSY`; every write transaction is `BEGIN IMMEDIATE`, so it takes the
//!   file's write lock before it reads anything and never has to upgrade a read lock
//!   (which fails at once with `SQLITE_BUSY` when another process wrote meanwhile). The
//!   5 s `busy_timeout` only matters when another process writes the same file.
//! - Writes that return rows (`… RETURNING`) always run inside such a transaction and
//!   are read to the end before the commit: a `RETURNING` statement in autocommit mode
//!   that is not stepped to completion is not committed when it returns (sqlx#3430).
//! - Reads go through a few reader connections; in WAL mode they do not block the writer
//!   and see every committed transaction. The claim reads the history on the writer,
//!   inside its transaction, so a resumed state is exactly what was committed.
//! - WAL with `synchronous = NORMAL`: a commit is in the WAL file when it returns, so it
//!   survives the process being killed (not an OS crash or power loss, which may lose the
//!   last commits; never corrupts the file).
//!
//! # Faults
//! - A write that fails part way (the disk full, an I/O error) may leave the writer
//!   connection in a transaction sqlx cannot end: SQLite rolls some failures back by
//!   itself, the `ROLLBACK` sqlx then sends fails, and sqlx still counts the transaction
//!   open, refusing every later `BEGIN`. The writer pool never hands out a connection in a
//!   transaction: it closes it (which ends whatever SQLite still held) and opens a fresh
//!   one, so the write after the fault works once its cause is gone.
//! - Whether the store can write is what [`SessionStore::ping`] answers (and `/readyz`
//!   with it). A write that fails marks the store suspect; while it is, `ping` makes a
//!   real write (a row inserted and deleted in one committed transaction), and the first
//!   that succeeds clears the mark. A healthy store's `ping` only reads.
//! - [`SqliteStore::open`] refuses a file that `PRAGMA quick_check` finds damaged, or that
//!   is not a database at all ([`Error::Corrupt`]), naming it.
//!
//! # Time
//! Timestamps are INTEGER unix microseconds (UTC): Postgres' `timestamptz` precision, so a
//! state read back compares equal on both backends. "Now" is taken in Rust and bound into
//! each statement (lease expiry is compared against it), never from SQLite's clock.
//!
//! # Recovery
//! The embedded queue (`agentq_core::mem_queue::MemQueue`) lives in memory and is lost
//! with the process. On start, an embedded process calls
//! `agentq_core::sqlite::requeue_runnable`: every session that is `queued` or `running` in
//! the file gets a queue entry again. A `running` one
//! whose lease is still live (its owner was the killed process) is answered `Busy` until
//! the lease expires; the worker's reclaimer then hands the entry out again and the claim
//! resumes it from its last checkpoint.

mod batches;
mod budget;
mod fork;
mod inbox;
mod keys;
mod leases;
mod queues;
mod report;
mod retention;
mod schedules;
mod sessions;
mod sweep;
mod tx;
mod webhooks;
mod workspace;
mod writes;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection, Error as SqlxError};

use crate::error::{Error, Result};
use crate::rowconv::check_applied;
use crate::sql::read;
use crate::sql::record::SessionRecord;
use crate::sql::statements::{APPLIED_MIGRATIONS, SQLITE as SQL};
use crate::store::Store;

use tx::WriteTx;

/// The migrations this binary was built with (SQLite dialect).
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations_sqlite");

/// Reader connections of a file store.
const READERS: u32 = 4;
/// How long a write waits for the file lock held by another process.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write waits for the (single) writer connection. Writes are short; a long
/// queue means overload, and the caller gets a retryable error.
const WRITER_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Lines of `PRAGMA quick_check` kept in the message for a damaged file.
const QUICK_CHECK_LINES: usize = 5;

/// The SQLite store. Cheap to clone (the pools are shared).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The one connection that writes (see the module docs).
    writer: SqlitePool,
    /// Connections for reads; the writer itself for an in-memory database.
    readers: SqlitePool,
    /// Set when a write failed, until a write succeeds again (see the module docs).
    write_suspect: Arc<AtomicBool>,
    /// Where the bytes of blobs live when not in the `blobs` table (see
    /// [`SqliteStore::with_objects`]).
    objects: Option<Arc<crate::blob::s3::S3Blobs>>,
    /// Uploads to `objects` hold it shared from before their first object until their
    /// index rows commit; a collection holds it alone while it deletes rows and objects.
    /// An upload is not made inside a write transaction, whose file lock would stop every
    /// other writer (every session's checkpoint) for as long as the object store takes;
    /// this keeps a collection from deleting an object between its upload and its row.
    /// The embedded store's uploads and collections run in its one process.
    uploads: Arc<tokio::sync::RwLock<()>>,
}

/// A committed write that leaves nothing behind: whether the file takes writes.
const PROBE_INSERT: &str = "INSERT INTO api_keys (id, tenant, scopes, secret_hash, created_at) \
    VALUES ('agentq-write-probe', '', '', '', 0)";
const PROBE_DELETE: &str = "DELETE FROM api_keys WHERE id = 'agentq-write-probe'";

impl SqliteStore {
    /// Open (creating it if missing) the database file at `path`: WAL,
    /// `synchronous = NORMAL`, 5 s busy timeout, foreign keys on. Call
    /// [`migrate`](Self::migrate) before use.
    pub async fn open(path: &Path) -> Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let corrupt = |detail: String| Error::Corrupt {
            path: path.display().to_string(),
            detail,
        };
        // The writer first: it creates the file and switches it to WAL (persistent in the
        // file), before any reader opens it.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(WRITER_ACQUIRE_TIMEOUT)
            // Never a connection left in a transaction (see the module docs): closed, and
            // the pool opens another.
            .before_acquire(|conn, _| Box::pin(async move { Ok(!conn.is_in_transaction()) }))
            .connect_with(options.clone())
            .await
            .map_err(|e| {
                if not_a_database(&e) {
                    corrupt(e.to_string())
                } else {
                    e.into()
                }
            })?;
        let problems: Vec<String> = sqlx::query_scalar("PRAGMA quick_check")
            .fetch_all(&writer)
            .await
            .map_err(|e| {
                if not_a_database(&e) {
                    corrupt(e.to_string())
                } else {
                    e.into()
                }
            })?;
        if problems.iter().any(|p| p != "ok") {
            writer.close().await;
            let mut detail = problems
                .iter()
                .take(QUICK_CHECK_LINES)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ");
            if problems.len() > QUICK_CHECK_LINES {
                detail.push_str("; …");
            }
            return Err(corrupt(format!("PRAGMA quick_check: {detail}")));
        }
        let readers = SqlitePoolOptions::new()
            .max_connections(READERS)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.create_if_missing(false))
            .await?;
        Ok(Self {
            writer,
            readers,
            write_suspect: Arc::default(),
            objects: None,
            uploads: Arc::default(),
        })
    }

    /// A private in-memory database, for tests. One connection serves reads and writes,
    /// and is never closed by the pool (the database lives only as long as it does).
    pub async fn memory() -> Result<Self> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?.foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(WRITER_ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        Ok(Self {
            writer: pool.clone(),
            readers: pool,
            write_suspect: Arc::default(),
            objects: None,
            uploads: Arc::default(),
        })
    }

    /// Apply the embedded migrations (idempotent).
    pub async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.writer).await?;
        Ok(())
    }

    /// The writer pool, for tests and tools that need raw SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// Close every connection (waits for those in use to come back).
    pub async fn close(&self) {
        self.readers.close().await;
        self.writer.close().await;
    }

    /// Sessions an embedded process must put back on its queue when it starts:
    /// `(id, queue)` of every session `queued` or `running` (the lease decides whether a
    /// running one can be taken yet), oldest first.
    pub async fn runnable_sessions(&self) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT id, queue FROM sessions WHERE status IN ('queued', 'running') ORDER BY id",
        )
        .fetch_all(&self.readers)
        .await?)
    }

    /// A write transaction holding the file's write lock from its first statement.
    async fn write_tx(&self) -> Result<WriteTx> {
        match self.writer.begin_with("BEGIN IMMEDIATE").await {
            Ok(tx) => Ok(WriteTx {
                tx: Some(tx),
                suspect: self.write_suspect.clone(),
            }),
            Err(e) => {
                self.write_suspect.store(true, Ordering::Relaxed);
                Err(e.into())
            }
        }
    }

    /// Whether the file takes a write now: one committed transaction that leaves
    /// nothing behind. Clears the suspect mark when it does.
    async fn probe_write(&self) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(PROBE_INSERT).execute(&mut *tx).await?;
        sqlx::query(PROBE_DELETE).execute(&mut *tx).await?;
        tx.commit().await
    }

    async fn get_record(&self, id: &str) -> Result<Option<SessionRecord>> {
        read::session(&self.readers, &SQL, id).await
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn check_schema(&self) -> Result<()> {
        let applied: Option<Vec<i64>> = match sqlx::query_scalar(APPLIED_MIGRATIONS)
            .fetch_all(&self.readers)
            .await
        {
            Ok(v) => Some(v),
            // Never migrated.
            Err(sqlx::Error::Database(e)) if e.message().contains("no such table") => None,
            Err(e) => return Err(e.into()),
        };
        check_applied(&MIGRATOR, applied)
    }
}

/// SQLite's answer for a file that is damaged or not a database (`SQLITE_CORRUPT`,
/// `SQLITE_NOTADB`).
fn not_a_database(e: &SqlxError) -> bool {
    const SQLITE_CORRUPT: u32 = 11;
    const SQLITE_NOTADB: u32 = 26;
    match e {
        SqlxError::Database(d) => d
            .code()
            .and_then(|c| c.parse::<u32>().ok())
            .is_some_and(|c| matches!(c & 0xff, SQLITE_CORRUPT | SQLITE_NOTADB)),
        _ => false,
    }
}

/// An embedded database is one shard: it records no map. It still answers which session a
/// key created, as every store does.
#[async_trait]
impl crate::shard_map::ShardStore for SqliteStore {
    async fn shard_generations(&self) -> Result<Vec<agentq_types::shard::Generation>> {
        Ok(Vec::new())
    }

    async fn session_with_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<crate::model::SessionRow>> {
        let owner: Option<String> = sqlx::query_scalar(&crate::sql::batches::SQLITE.key_owner)
            .bind(tenant)
            .bind(key)
            .fetch_optional(&self.readers)
            .await?;
        match owner {
            Some(id) => crate::store::SessionStore::get(self, &id).await,
            None => Ok(None),
        }
    }
}
