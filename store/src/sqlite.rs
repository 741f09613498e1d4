//! The embedded [`Store`]: one SQLite file (`migrations_sqlite/`) with the same tables,
//! columns and lease protocol as [`crate::pg::PgStore`], for running agentq as a single
//! process without Postgres or Redis. This module owns that file: its connections, its
//! schema and migrator, and what the recovery step a restarted embedded process runs
//! (`agentq_core::sqlite::requeue_runnable`, which needs the queue too) reads and marks.
//! The statements it shares with Postgres, and the mapping of rows to the model, are in
//! `crate::sql`; the writes SQLite runs as several steps of one transaction (where
//! Postgres runs one statement) are in `writes`.
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

mod budget;
mod workspace;
mod writes;

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Connection, Sqlite, SqliteConnection, Transaction};

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::state::SessionState;

use crate::auth::{ApiKey, NewApiKey, Scope};
use crate::budget::{
    HoldRefused, Ledger, ModelUsage, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{
    ApprovalRecorded, CancelResult, Claim, Delivered, InboxItem, Lease, ListFilter, NewSession,
    SessionRow, SessionStatus, Woken,
};
use crate::protocol::{InboxKind, InboxPayload};
use crate::rowconv::{WokenRow, check_applied, to_i64, unique_as_conflict, woken};
use crate::scheduling::{ActiveCount, Candidate};
use crate::sql::escape::{escape_text, stored_ids, stored_json};
use crate::sql::record::{InboxRecord, KeyRecord, PendingRow, SessionRecord, StoredMessage};
use crate::sql::statements::{self, APPLIED_MIGRATIONS, SQLITE as SQL};
use crate::sql::{outcome, read};
use crate::store::{
    BudgetStore, Committed, InboxStore, KeyStore, LeaseStatus, LeaseStore, QueueCreate, QueueStore,
    RetryResult, SessionStore, Store, SweepStore, checkpoint_alone,
};
use crate::wait::WaitReason;

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
}

/// A write transaction that tells the store how it ended: one dropped without a commit or
/// a rollback was left by a failed statement, and marks the store suspect.
struct WriteTx {
    tx: Option<Transaction<'static, Sqlite>>,
    suspect: Arc<AtomicBool>,
}

impl WriteTx {
    async fn commit(mut self) -> Result<()> {
        let Some(tx) = self.tx.take() else {
            return Ok(());
        };
        let r = tx.commit().await;
        self.suspect.store(r.is_err(), Ordering::Relaxed);
        Ok(r?)
    }

    async fn rollback(mut self) -> Result<()> {
        let Some(tx) = self.tx.take() else {
            return Ok(());
        };
        let r = tx.rollback().await;
        if r.is_err() {
            self.suspect.store(true, Ordering::Relaxed);
        }
        Ok(r?)
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match &self.tx {
            Some(tx) => tx,
            // Taken only by `commit` and `rollback`, which consume the value.
            None => unreachable!("a settled write transaction is not used"),
        }
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match &mut self.tx {
            Some(tx) => tx,
            None => unreachable!("a settled write transaction is not used"),
        }
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        if self.tx.is_some() {
            self.suspect.store(true, Ordering::Relaxed);
        }
    }
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

/// Now, in unix microseconds.
fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

fn dur_us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Run a `… RETURNING COLS` write on `conn` and read it to the end (see the module docs);
/// at most one row is expected.
async fn returning_one<'a>(
    conn: &mut SqliteConnection,
    query: sqlx::query::QueryAs<'a, Sqlite, SessionRecord, sqlx::sqlite::SqliteArguments<'a>>,
) -> Result<Option<SessionRecord>> {
    Ok(query.fetch_all(conn).await?.pop())
}

/// A session's row read inside a write transaction, so that the answer is consistent
/// with what the transaction did.
async fn record_in(conn: &mut SqliteConnection, id: &str) -> Result<Option<SessionRecord>> {
    Ok(sqlx::query_as::<_, SessionRecord>(&SQL.select_session)
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

/// After a fenced write matched nothing, inside the same transaction: did an earlier
/// attempt of the same write commit? (See [`outcome::gave_up`].)
async fn gave_up_lease(
    conn: &mut SqliteConnection,
    lease: &Lease,
    want: fn(SessionStatus) -> bool,
) -> Result<bool> {
    let row: Option<outcome::LeaseRow> = sqlx::query_as(&SQL.lease_of)
        .bind(&lease.root_id)
        .bind(&lease.session_id)
        .fetch_optional(conn)
        .await?;
    Ok(outcome::gave_up(row, lease, want))
}

#[async_trait]
impl KeyStore for SqliteStore {
    async fn create_key(&self, key: &NewApiKey) -> Result<ApiKey> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.insert_key)
            .bind(&key.id)
            .bind(&key.tenant)
            .bind(Scope::join(&key.scopes))
            .bind(key.label.as_deref())
            .bind(&key.secret_hash)
            .bind(key.expires_at.map(|t| t.timestamp_micros()))
            .bind(now_us())
            .fetch_all(&self.writer)
            .await
            .map_err(|e| unique_as_conflict(e, &format!("api key {}", key.id)))?
            .pop();
        rec.ok_or_else(|| Error::Conflict(format!("api key {} was not stored", key.id)))?
            .into_key()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>> {
        let recs: Vec<KeyRecord> = sqlx::query_as(&SQL.list_keys)
            .fetch_all(&self.readers)
            .await?;
        recs.into_iter().map(KeyRecord::into_key).collect()
    }

    async fn revoke_key(&self, id: &str) -> Result<Option<ApiKey>> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.revoke_key)
            .bind(id)
            .bind(now_us())
            .fetch_all(&self.writer)
            .await?
            .pop();
        rec.map(KeyRecord::into_key).transpose()
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.key_by_id)
            .bind(id)
            .fetch_optional(&self.readers)
            .await?;
        rec.map(KeyRecord::into_key).transpose()
    }
}

#[async_trait]
impl BudgetStore for SqliteStore {
    async fn spawn_session(&self, new: &NewSession, limits: &SpawnLimits) -> Result<Spawned> {
        self.spawn_in_tree(new, limits).await
    }

    async fn ledger(&self, id: &str) -> Result<Option<Ledger>> {
        self.ledger_of(id).await
    }

    async fn return_budget(&self, id: &str) -> Result<bool> {
        self.give_back(id).await
    }

    async fn unreturned_budgets(&self, limit: u32) -> Result<Vec<String>> {
        self.unreturned(limit).await
    }

    async fn tree_usage(&self, root_id: &str) -> Result<Vec<ModelUsage>> {
        self.usage_of_tree(root_id).await
    }

    async fn add_tenant_spend(&self, tenant: &str, day: &str, spend: Spend) -> Result<()> {
        self.add_spend(tenant, day, spend).await
    }

    async fn tenant_spend(&self, tenant: &str, from: &str, to: &str) -> Result<Spend> {
        self.spend(tenant, from, to).await
    }

    async fn hold_tenant_spend(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<HoldRefused>> {
        self.hold(hold, budgets, now).await
    }

    async fn settle_tenant_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<()> {
        self.settle_hold(id, tenant, day, spend).await
    }

    async fn set_tenant_budget(&self, b: &TenantBudget) -> Result<()> {
        self.set_budget(b).await
    }

    async fn tenant_budgets(&self) -> Result<Vec<TenantBudget>> {
        self.budgets().await
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

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)> {
        let out = self.create_sessions(std::slice::from_ref(new)).await?;
        outcome::only_created(new, out)
    }

    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>> {
        if new.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_us();
        // One transaction for the batch; statements are in-process calls, so a few per
        // item cost little, and each sees the rows of the items before it.
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(new.len());
        for s in new {
            let created = writes::create(&mut tx, s, now).await?;
            if created.1 && (!s.files.is_empty() || s.workspace_from.is_some()) {
                workspace::add_inputs(&mut tx, s, now, self.objects.as_deref()).await?;
            }
            out.push(created);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        self.get_record(id)
            .await?
            .map(SessionRecord::into_row)
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        let rows: Vec<SessionRecord> = statements::list::<Sqlite>(filter)
            .build_query_as()
            .fetch_all(&self.readers)
            .await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        read::history(&self.readers, &SQL, id).await
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        let mut tx = self.write_tx().await?;
        let failed = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.fail)
                .bind(id)
                .bind(escape_text(reason))
                .bind(now_us()),
        )
        .await?;
        tx.commit().await?;
        match failed {
            Some(rec) => rec.into_row().map(Some),
            // Missing, or finished already: leave it as it is.
            None => self.get(id).await,
        }
    }

    async fn retry(&self, id: &str, hold: bool) -> Result<RetryResult> {
        let mut tx = self.write_tx().await?;
        let retried = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.retry)
                .bind(id)
                .bind(hold)
                .bind(now_us()),
        )
        .await?;
        let Some(rec) = retried else {
            tx.commit().await?;
            return Ok(outcome::not_retried(self.get(id).await?));
        };
        let row = rec.into_row()?;
        // A retried sub-agent draws from its tree again, in the transaction that queues it.
        if let Err(e) = budget::reopen_in(&mut tx, &row).await {
            tx.rollback().await?;
            return Err(e);
        }
        tx.commit().await?;
        Ok(RetryResult::Retried(Box::new(row)))
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        let mut tx = self.write_tx().await?;
        let changed =
            returning_one(&mut tx, sqlx::query_as(&SQL.cancel).bind(id).bind(now_us())).await?;
        if let Some(rec) = changed {
            tx.commit().await?;
            return outcome::cancel_changed(rec);
        }
        // Read under the same lock, so no race can make the answer wrong.
        let rec = record_in(&mut tx, id).await?;
        tx.rollback().await?;
        outcome::cancel_unchanged(id, rec)
    }

    /// Reads, and while a failed write left the store suspect, writes (see the module
    /// docs).
    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        if self.write_suspect.load(Ordering::Relaxed) {
            self.probe_write().await?;
        }
        Ok(())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        read::unfinished(&self.readers).await
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim(
        &self,
        id: &str,
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Claim> {
        let now = now_us();
        let mut tx = self.write_tx().await?;
        let claimed = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.claim)
                .bind(id)
                .bind(owner)
                .bind(now.saturating_add(dur_us(ttl)))
                .bind(now),
        )
        .await?;
        let Some(rec) = claimed else {
            // Why not? Read in the same transaction, so the answer is consistent.
            let rec = record_in(&mut tx, id).await?;
            tx.rollback().await?;
            return outcome::claim_refused(rec);
        };
        if outcome::exhausted(&rec, max_attempts) {
            // The claim itself stands (as on Postgres): the caller fails the session.
            tx.commit().await?;
            return outcome::exhausted_claim(rec);
        }
        // The history, read under the same write lock as the claim: exactly what the
        // previous holder committed, which is all it will ever have written.
        let messages: Vec<StoredMessage> = if rec.has_stored_history() {
            sqlx::query_as(&SQL.claim_history)
                .bind(&rec.root_id)
                .bind(&rec.id)
                .fetch_all(&mut *tx)
                .await?
        } else {
            Vec::new()
        };
        tx.commit().await?;
        outcome::acquired(rec, owner, messages)
    }

    async fn checkpoint(&self, lease: &Lease, state: &SessionState, from: usize) -> Result<()> {
        checkpoint_alone(self, lease, state, from).await
    }

    /// Returns no rows: a read of an embedded database is cheap, and the caller makes it.
    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        let now = now_us();
        // One transaction for the whole batch (SQLite's group commit); within it each
        // checkpoint's messages are written only if its fenced row update matched.
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(batch.len());
        for cp in batch {
            out.push(writes::checkpoint(&mut tx, cp, now).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn heartbeat(&self, leases: &[Lease], ttl: Duration) -> Result<Vec<LeaseStatus>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let expires = now_us().saturating_add(dur_us(ttl));
        let mut out = Vec::with_capacity(leases.len());
        let mut tx = self.write_tx().await?;
        for l in leases {
            out.push(writes::extend_lease(&mut tx, l, expires).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(&SQL.release)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(&lease.owner)
            .bind(now_us())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if done > 0 {
            tx.commit().await?;
            return Ok(());
        }
        let retried = gave_up_lease(&mut tx, lease, |s| s == SessionStatus::Queued).await?;
        tx.rollback().await?;
        if retried {
            return Ok(());
        }
        Err(Error::LeaseLost(lease.session_id.clone()))
    }

    async fn suspend(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let reason = match status {
            SessionStatus::AwaitingApproval => WaitReason::Approval,
            _ => WaitReason::Children,
        };
        self.suspend_with(lease, status, seen_wake, approval_deadline, reason, None)
            .await
    }

    async fn suspend_for(
        &self,
        lease: &Lease,
        seen_wake: i64,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        self.suspend_with(
            lease,
            SessionStatus::Waiting,
            seen_wake,
            None,
            reason,
            wake_at,
        )
        .await
    }
}

impl SqliteStore {
    async fn suspend_with(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let mut tx = self.write_tx().await?;
        let rec = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.suspend)
                .bind(&lease.root_id)
                .bind(&lease.session_id)
                .bind(lease.epoch)
                .bind(status.as_str())
                .bind(seen_wake)
                .bind(approval_deadline.map(|t| t.timestamp_micros()))
                .bind(&lease.owner)
                .bind(reason.as_str())
                .bind(wake_at.map(|t| t.timestamp_micros()))
                .bind(now_us()),
        )
        .await?;
        match rec {
            Some(r) => {
                tx.commit().await?;
                r.into_row()
            }
            None => {
                tx.rollback().await?;
                Err(Error::LeaseLost(lease.session_id.clone()))
            }
        }
    }
}

#[async_trait]
impl InboxStore for SqliteStore {
    async fn deliver(
        &self,
        session_id: &str,
        kind: InboxKind,
        dedupe: &str,
        payload: &InboxPayload,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>> {
        let payload = payload.to_value()?;
        // Under the write lock (Postgres: `FOR UPDATE`): the item's position is the bumped
        // `wake_seq`, so positions increase in commit order, and a concurrent suspend
        // sees the bump.
        let mut tx = self.write_tx().await?;
        let item = writes::Item {
            session_id,
            kind: kind.as_str(),
            dedupe,
            payload: &payload,
        };
        let delivered = writes::deliver(&mut tx, &item, wake, now_us()).await?;
        match &delivered {
            Some(d) if d.inserted => tx.commit().await?,
            // Missing, or delivered before: nothing changed.
            _ => tx.rollback().await?,
        }
        Ok(delivered)
    }

    async fn inbox(
        &self,
        session_id: &str,
        kinds: &[InboxKind],
        after: u64,
    ) -> Result<Vec<InboxItem>> {
        let rows: Vec<InboxRecord> = sqlx::query_as(&SQL.inbox)
            .bind(session_id)
            // The kinds as one JSON array parameter (SQLite has no array binds).
            .bind(serde_json::to_string(kinds)?)
            .bind(to_i64(after, "after")?)
            .fetch_all(&self.readers)
            .await?;
        rows.into_iter().map(InboxRecord::into_item).collect()
    }

    async fn decide_approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<ApprovalRecorded> {
        // Under the write lock, like `deliver`: the decision and the wake-up are one step.
        let mut tx = self.write_tx().await?;
        let decision = writes::Decision {
            session_id,
            tool_call_id,
            approve,
            reason,
        };
        let recorded = writes::decide(&mut tx, &decision, now_us()).await?;
        match recorded {
            ApprovalRecorded::Recorded { .. } => tx.commit().await?,
            _ => tx.rollback().await?,
        }
        Ok(recorded)
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>> {
        read::approval(&self.readers, &SQL, session_id, tool_call_id).await
    }

    async fn pending_approvals(&self, session_id: &str, held: &[String]) -> Result<Vec<ToolCall>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<PendingRow> = sqlx::query_as(&SQL.pending_approvals)
            .bind(session_id)
            // The ids as one JSON array parameter (SQLite has no array binds), as stored.
            .bind(serde_json::to_string(&stored_ids(held))?)
            .fetch_all(&self.readers)
            .await?;
        Ok(outcome::pending_approvals(rows, held))
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        let mut tx = self.write_tx().await?;
        let rec = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.follow_up)
                .bind(session_id)
                .bind(to_i64(consume.unwrap_or(0), "consume")?)
                .bind(now_us()),
        )
        .await?;
        let Some(rec) = rec else {
            tx.rollback().await?;
            return Ok(None);
        };
        let (root_id, id, seq) = (rec.root_id.clone(), rec.id.clone(), rec.history_len);
        let row = rec.into_row()?;
        // A re-opened sub-agent draws from its tree again, in the transaction that
        // queues it.
        if let Err(e) = budget::reopen_in(&mut tx, &row).await {
            tx.rollback().await?;
            return Err(e);
        }
        // The update bumped `history_len`, so the new message's seq is one less.
        sqlx::query(&SQL.follow_up_message)
            .bind(&root_id)
            .bind(&id)
            .bind(stored_json(&Message::user(text))?)
            .bind(seq.map(|n| n - 1))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}

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
        Ok(sqlx::query_scalar(&SQL.stored_queues)
            .fetch_all(&self.readers)
            .await?)
    }
}

#[async_trait]
impl SweepStore for SqliteStore {
    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.mark_enqueued)
            // The ids as one JSON array parameter: no limit on the number of ids.
            .bind(serde_json::to_string(ids)?)
            .bind(now_us())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn reset_enqueued(&self, queue: &str) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(&SQL.reset_enqueued)
            .bind(queue)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    async fn forget_expired_entries(&self, grace: Duration, limit: u32) -> Result<u64> {
        let mut tx = self.write_tx().await?;
        let n = sqlx::query(&SQL.forget_expired)
            .bind(now_us().saturating_sub(dur_us(grace)))
            .bind(i64::from(limit))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(&SQL.unenqueued)
            .bind(now_us().saturating_sub(dur_us(age)))
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?)
    }

    async fn expire_workspaces(&self, ttl: Duration, limit: u32) -> Result<u64> {
        self.expire_trees(ttl, limit).await
    }

    async fn collect_blobs(&self, grace: Duration, limit: u32) -> Result<u64> {
        self.collect(grace, limit).await
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<Woken>> {
        let mut tx = self.write_tx().await?;
        // Read to the end inside the transaction (see the module docs on `RETURNING`).
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_expired)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken(rows))
    }

    async fn wake_due(&self, limit: u32) -> Result<Vec<Woken>> {
        let mut tx = self.write_tx().await?;
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_due)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken(rows))
    }

    async fn wake_budget_waiters(&self, tenant: &str, limit: u32) -> Result<Vec<Woken>> {
        let mut tx = self.write_tx().await?;
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_budget)
            .bind(tenant)
            .bind(i64::from(limit))
            .bind(now_us())
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken(rows))
    }

    async fn waiting_by_reason(&self) -> Result<Vec<(WaitReason, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&SQL.waiting_by_reason)
            .fetch_all(&self.readers)
            .await?;
        Ok(crate::rowconv::tally(rows))
    }

    async fn held_by_queue(&self) -> Result<Vec<(String, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&SQL.held_by_queue)
            .fetch_all(&self.readers)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(q, n)| (q, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    async fn dispatch_load(&self) -> Result<Vec<ActiveCount>> {
        let rows: Vec<outcome::LoadRow> = sqlx::query_as(&SQL.dispatch_load)
            .fetch_all(&self.readers)
            .await?;
        rows.into_iter().map(outcome::LoadRow::into_count).collect()
    }

    async fn held(&self, queue: &str, per_group: u32, limit: u32) -> Result<Vec<Candidate>> {
        let rows: Vec<outcome::HeldRow> = sqlx::query_as(&SQL.held)
            .bind(queue)
            .bind(i64::from(per_group))
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?;
        rows.into_iter()
            .map(outcome::HeldRow::into_candidate)
            .collect()
    }

    async fn any_held(&self, queue: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(&SQL.any_held)
            .bind(queue)
            .fetch_one(&self.readers)
            .await?)
    }

    async fn release_held(&self, ids: &[String]) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write_tx().await?;
        // Read to the end inside the transaction (see the module docs on `RETURNING`).
        let released: Vec<String> = sqlx::query_scalar(&SQL.release_held)
            .bind(serde_json::to_string(ids)?)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(released)
    }
}

/// SQLite's answer for a file that is damaged or not a database (`SQLITE_CORRUPT`,
/// `SQLITE_NOTADB`).
fn not_a_database(e: &sqlx::Error) -> bool {
    const SQLITE_CORRUPT: u32 = 11;
    const SQLITE_NOTADB: u32 = 26;
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<u32>().ok())
            .is_some_and(|c| matches!(c & 0xff, SQLITE_CORRUPT | SQLITE_NOTADB)),
        _ => false,
    }
}
