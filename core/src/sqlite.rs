//! The embedded [`Store`]: one SQLite file (`migrations_sqlite/`) with the same tables,
//! columns and lease protocol as [`crate::pg::PgStore`], for running agentq as a single
//! process without Postgres or Redis. This module owns that file: its connections, its
//! schema and migrator, and the recovery step a restarted embedded process runs
//! ([`requeue_runnable`]).
//!
//! Semantics are Postgres' (see `pg.rs`): a claim bumps `lease_epoch`; every later write
//! is conditional on `(lease_owner, lease_epoch)`; a checkpoint writes the row's scalars
//! and only the new messages in ONE transaction, fenced in that same transaction, so a
//! fenced-off worker writes nothing; a retried final checkpoint or release that finds its
//! own earlier attempt committed is a success.
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
//! # Time
//! Timestamps are INTEGER unix microseconds (UTC): Postgres' `timestamptz` precision, so a
//! state read back compares equal on both backends. "Now" is taken in Rust and bound into
//! each statement (lease expiry is compared against it), never from SQLite's clock.
//!
//! # Recovery
//! The embedded queue ([`crate::mem_queue::MemQueue`]) lives in memory and is lost with
//! the process. On start, an embedded process calls [`requeue_runnable`]: every session
//! that is `queued` or `running` in the file gets a queue entry again. A `running` one
//! whose lease is still live (its owner was the killed process) is answered `Busy` until
//! the lease expires; the worker's reclaimer then hands the entry out again and the claim
//! resumes it from its last checkpoint.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::types::Json;
use sqlx::{Sqlite, SqliteConnection, Transaction};

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{
    ApprovalRecorded, CancelResult, Claim, Delivered, EnqueueReason, InboxItem, Lease, ListFilter,
    NewSession, SessionRow, SessionStatus,
};
use crate::queue::Queue;
use crate::rowconv::*;
use crate::store::{Committed, LeaseStatus, Store};

/// The migrations this binary was built with (SQLite dialect).
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations_sqlite");

/// Every column [`SqliteRecord`] reads, for `SELECT`/`RETURNING` lists.
const COLS: &str = "id, root_id, parent_id, depth, queue, status, finish_reason, spec, \
    iteration, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
    reasoning_tokens, drain_rounds, free_iteration, phase, started_at, turn_base, \
    not_started, result, error, lease_owner, lease_epoch, lease_expires_at, attempts, \
    cancel_requested, idempotency_key, created_at, updated_at, finished_at, wake_seq, \
    approval_deadline, bg_cursor, msg_cursor, followup_cursor";

/// `list` without a limit gets this many rows; no request gets more than `MAX_LIST`.
const DEFAULT_LIST: u32 = 100;
const MAX_LIST: u32 = 10_000;

/// Reader connections of a file store.
const READERS: u32 = 4;
/// How long a write waits for the file lock held by another process.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a write waits for the (single) writer connection. Writes are short; a long
/// queue means overload, and the caller gets a retryable error.
const WRITER_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages per multi-row insert: 6 parameters each, far below SQLite's 32 766 limit.
const INSERT_CHUNK: usize = 1000;

/// The SQLite store. Cheap to clone (the pools are shared).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The one connection that writes (see the module docs).
    writer: SqlitePool,
    /// Connections for reads; the writer itself for an in-memory database.
    readers: SqlitePool,
}

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
        // The writer first: it creates the file and switches it to WAL (persistent in the
        // file), before any reader opens it.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(WRITER_ACQUIRE_TIMEOUT)
            .connect_with(options.clone())
            .await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(READERS)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.create_if_missing(false))
            .await?;
        Ok(Self { writer, readers })
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
    async fn write_tx(&self) -> Result<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn get_record(&self, id: &str) -> Result<Option<SqliteRecord>> {
        let sql = format!("SELECT {COLS} FROM sessions WHERE id = ?1");
        Ok(sqlx::query_as::<_, SqliteRecord>(&sql)
            .bind(id)
            .fetch_optional(&self.readers)
            .await?)
    }
}

/// Put every runnable session of `store` back on `queue` (embedded mode, at start: the
/// in-process queue lost its entries with the previous process). Marks them enqueued so
/// the sweeper leaves them alone. Duplicates of entries that do exist are harmless: the
/// lease decides. Returns how many entries were added.
pub async fn requeue_runnable(store: &SqliteStore, queue: &dyn Queue) -> Result<usize> {
    let runnable = store.runnable_sessions().await?;
    let mut by_queue: std::collections::BTreeMap<String, Vec<(String, EnqueueReason)>> =
        std::collections::BTreeMap::new();
    for (id, q) in &runnable {
        by_queue
            .entry(q.clone())
            .or_default()
            .push((id.clone(), EnqueueReason::Resume));
    }
    for (q, items) in &by_queue {
        queue.ensure_queue(q).await?;
        queue.enqueue_many(q, items).await?;
    }
    let ids: Vec<String> = runnable.into_iter().map(|(id, _)| id).collect();
    store.mark_enqueued(&ids).await?;
    Ok(ids.len())
}

/// A `sessions` row as stored, with the loop scalars `SessionRow` does not carry.
#[derive(Debug, sqlx::FromRow)]
struct SqliteRecord {
    id: String,
    root_id: String,
    parent_id: Option<String>,
    depth: i64,
    queue: String,
    status: String,
    finish_reason: Option<String>,
    spec: Json<SessionSpec>,
    iteration: i64,
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    reasoning_tokens: i64,
    drain_rounds: i64,
    free_iteration: bool,
    phase: String,
    started_at: Option<i64>,
    turn_base: i64,
    not_started: Json<Vec<String>>,
    result: Option<String>,
    error: Option<String>,
    lease_owner: Option<String>,
    lease_epoch: i64,
    lease_expires_at: Option<i64>,
    attempts: i64,
    cancel_requested: bool,
    idempotency_key: Option<String>,
    created_at: i64,
    updated_at: i64,
    finished_at: Option<i64>,
    wake_seq: i64,
    approval_deadline: Option<i64>,
    bg_cursor: i64,
    msg_cursor: i64,
    followup_cursor: i64,
}

/// Unix microseconds → time.
fn to_time(us: i64, col: &str) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_micros(us).ok_or_else(|| bad_data(format_args!("{col} = {us}")))
}

fn to_opt_time(us: Option<i64>, col: &str) -> Result<Option<DateTime<Utc>>> {
    us.map(|v| to_time(v, col)).transpose()
}

/// Now, in unix microseconds.
fn now_us() -> i64 {
    Utc::now().timestamp_micros()
}

fn dur_us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl SqliteRecord {
    fn usage(&self) -> Result<Usage> {
        Ok(Usage {
            input_tokens: to_u64(self.input_tokens, "input_tokens")?,
            output_tokens: to_u64(self.output_tokens, "output_tokens")?,
            cache_read_tokens: to_u64(self.cache_read_tokens, "cache_read_tokens")?,
            cache_write_tokens: to_u64(self.cache_write_tokens, "cache_write_tokens")?,
            reasoning_tokens: to_u64(self.reasoning_tokens, "reasoning_tokens")?,
        })
    }

    fn status(&self) -> Result<SessionStatus> {
        parse_status(&self.status)
    }

    fn into_row(self) -> Result<SessionRow> {
        Ok(SessionRow {
            status: self.status()?,
            finish_reason: self.finish_reason.as_deref().map(parse_exit).transpose()?,
            depth: to_u32(self.depth, "depth")?,
            iteration: to_u32(self.iteration, "iteration")?,
            usage: self.usage()?,
            attempts: to_u32(self.attempts, "attempts")?,
            lease_expires_at: to_opt_time(self.lease_expires_at, "lease_expires_at")?,
            created_at: to_time(self.created_at, "created_at")?,
            updated_at: to_time(self.updated_at, "updated_at")?,
            finished_at: to_opt_time(self.finished_at, "finished_at")?,
            approval_deadline: to_opt_time(self.approval_deadline, "approval_deadline")?,
            id: self.id,
            root_id: self.root_id,
            parent_id: self.parent_id,
            queue: self.queue,
            spec: self.spec.0,
            result: self.result,
            error: self.error,
            lease_owner: self.lease_owner,
            lease_epoch: self.lease_epoch,
            cancel_requested: self.cancel_requested,
            idempotency_key: self.idempotency_key,
            wake_seq: self.wake_seq,
            followup_cursor: to_u64(self.followup_cursor, "followup_cursor")?,
        })
    }

    /// The loop state to resume from: this row's scalars plus the stored history.
    fn state(&self, messages: Vec<(i64, Json<Message>)>) -> Result<SessionState> {
        // Message i has seq i. A row created without its first (user) message — not by
        // this store — gets the prompt back in front, exactly as a fresh state has it.
        let mut history = Vec::with_capacity(messages.len() + 1);
        if messages.first().is_none_or(|(seq, _)| *seq != 0) {
            history.push(Message::user(self.spec.0.prompt.clone()));
        }
        history.extend(messages.into_iter().map(|(_, m)| m.0));
        Ok(SessionState {
            session_id: self.id.clone(),
            spec: self.spec.0.clone(),
            messages: history,
            iteration: to_u32(self.iteration, "iteration")?,
            usage: self.usage()?,
            drain_rounds: to_u32(self.drain_rounds, "drain_rounds")?,
            free_iteration: self.free_iteration,
            phase: parse_phase(&self.phase)?,
            started_at: to_opt_time(self.started_at, "started_at")?,
            outcome: None,
            not_started: self.not_started.0.clone(),
            turn_base: to_u32(self.turn_base, "turn_base")?,
            bg_cursor: to_u64(self.bg_cursor, "bg_cursor")?,
            msg_cursor: to_u64(self.msg_cursor, "msg_cursor")?,
        })
    }
}

fn with_cols(sql: &str) -> String {
    sql.replace("COLS", COLS)
}

/// Run a `… RETURNING COLS` write on `conn` and read it to the end (see the module docs);
/// at most one row is expected.
async fn returning_one<'a>(
    conn: &mut SqliteConnection,
    query: sqlx::query::QueryAs<'a, Sqlite, SqliteRecord, sqlx::sqlite::SqliteArguments<'a>>,
) -> Result<Option<SqliteRecord>> {
    Ok(query.fetch_all(conn).await?.pop())
}

const INSERT_SESSION: &str = "
INSERT INTO sessions (id, root_id, parent_id, depth, queue, status, spec, phase,
                      idempotency_key, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9, ?9)
ON CONFLICT DO NOTHING
RETURNING COLS";

/// The claim: one conditional update. Runnable (`queued`, or `running` under an expired
/// lease or our own), never terminal or suspended. ?3 = now, ?4 = new expiry.
const CLAIM: &str = "
UPDATE sessions SET
    lease_owner = ?2,
    lease_epoch = lease_epoch + 1,
    lease_expires_at = ?4,
    status = 'running',
    attempts = attempts + 1,
    updated_at = ?3
WHERE id = ?1
  AND status IN ('queued', 'running')
  AND (lease_owner IS NULL OR lease_expires_at < ?3 OR lease_owner = ?2)
RETURNING COLS";

/// The checkpoint's row update, fenced by the lease. With an outcome (?14 not null) the
/// row becomes terminal and the lease is given up in the same statement. ?19 = now; ?22:
/// new messages are saved (progress: the count of claims that died without finishing
/// starts again); ?23, ?24: the inbox cursors, advanced with the history they delivered.
const CHECKPOINT: &str = "
UPDATE sessions SET
    iteration = ?4,
    input_tokens = ?5,
    output_tokens = ?6,
    cache_read_tokens = ?7,
    cache_write_tokens = ?8,
    reasoning_tokens = ?9,
    drain_rounds = ?10,
    free_iteration = ?11,
    phase = ?12,
    started_at = ?13,
    status = COALESCE(?14, status),
    finish_reason = CASE WHEN ?14 IS NULL THEN finish_reason ELSE ?15 END,
    result = CASE WHEN ?14 IS NULL THEN result ELSE ?16 END,
    error = CASE WHEN ?14 IS NULL THEN error ELSE ?17 END,
    finished_at = CASE WHEN ?14 IS NULL THEN finished_at ELSE ?19 END,
    lease_owner = CASE WHEN ?14 IS NULL THEN lease_owner ELSE NULL END,
    lease_expires_at = CASE WHEN ?14 IS NULL THEN lease_expires_at ELSE NULL END,
    updated_at = ?19,
    turn_base = ?20,
    not_started = ?21,
    attempts = CASE WHEN ?22 THEN 0 ELSE attempts END,
    bg_cursor = ?23,
    msg_cursor = ?24
WHERE root_id = ?1 AND id = ?2 AND lease_epoch = ?3 AND lease_owner = ?18";

/// Cancel in one statement: queued or suspended → cancelled now; running → the flag for
/// its owner. Terminal rows do not match. (SET expressions all see the old row.)
const CANCEL: &str = "
UPDATE sessions SET
    status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
    finish_reason = CASE WHEN status = 'running' THEN finish_reason ELSE 'interrupted' END,
    finished_at = CASE WHEN status = 'running' THEN finished_at ELSE ?2 END,
    lease_owner = CASE WHEN status = 'running' THEN lease_owner ELSE NULL END,
    lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at ELSE NULL END,
    cancel_requested = 1,
    updated_at = ?2
WHERE id = ?1 AND status IN ('queued', 'running', 'waiting', 'awaiting_approval')
RETURNING COLS";

/// Fenced suspension (see `pg.rs`). A wake that arrived after the claim (`wake_seq > ?5`)
/// sends the session back to the queue; a cancel request cancels it. Every waker bumps
/// `wake_seq` in its own write transaction, and write transactions are serialized (one
/// writer, `BEGIN IMMEDIATE`): Postgres' row lock. So no wake-up can fall between the
/// check and the sleep. ?8 = now.
const SUSPEND: &str = "
UPDATE sessions SET
    status = CASE WHEN cancel_requested THEN 'cancelled'
                  WHEN wake_seq > ?5 THEN 'queued' ELSE ?4 END,
    finish_reason = CASE WHEN cancel_requested THEN 'interrupted' ELSE finish_reason END,
    finished_at = CASE WHEN cancel_requested THEN ?8 ELSE finished_at END,
    enqueued_at = CASE WHEN wake_seq > ?5 AND NOT cancel_requested THEN NULL
                       ELSE enqueued_at END,
    approval_deadline = ?6,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = 0,
    updated_at = ?8
WHERE root_id = ?1 AND id = ?2 AND lease_epoch = ?3 AND lease_owner = ?7 AND status = 'running'
RETURNING COLS";

/// Sessions awaiting an approval past their deadline (?1 = now) go back to the queue.
const WAKE_EXPIRED: &str = "
UPDATE sessions SET status = 'queued', enqueued_at = NULL, wake_seq = wake_seq + 1,
    updated_at = ?1
WHERE id IN (SELECT id FROM sessions WHERE status = 'awaiting_approval'
             AND approval_deadline < ?1 ORDER BY approval_deadline LIMIT ?2)
  AND status = 'awaiting_approval'
RETURNING id, queue";

/// A new turn on a finished session: queued again with a fresh per-turn allowance. With
/// ?2 (the follow-up's inbox position) not 0, only once per position: `followup_cursor`,
/// not `msg_cursor` (steering messages share the inbox's positions and are injected by
/// the run, so their cursor may be past a follow-up that has not run). ?3 = now.
const FOLLOW_UP: &str = "
UPDATE sessions SET
    status = 'queued', finish_reason = NULL, result = NULL, error = NULL,
    finished_at = NULL, turn_base = iteration, drain_rounds = 0, free_iteration = 0,
    enqueued_at = NULL, cancel_requested = 0, attempts = 0,
    lease_owner = NULL, lease_expires_at = NULL, approval_deadline = NULL,
    followup_cursor = max(followup_cursor, ?2),
    updated_at = ?3
WHERE id = ?1 AND status IN ('completed', 'failed', 'cancelled')
  AND (?2 = 0 OR followup_cursor < ?2)
RETURNING COLS";

/// After a fenced write matched nothing, inside the same transaction: did an earlier
/// attempt of the same write commit (the epoch is still ours and we already gave the
/// lease up)? Makes a retry after an ambiguous failure harmless.
async fn gave_up_lease(
    conn: &mut SqliteConnection,
    lease: &Lease,
    want: fn(SessionStatus) -> bool,
) -> Result<bool> {
    let row: Option<(i64, Option<String>, String)> = sqlx::query_as(
        "SELECT lease_epoch, lease_owner, status FROM sessions WHERE root_id = ?1 AND id = ?2",
    )
    .bind(&lease.root_id)
    .bind(&lease.session_id)
    .fetch_optional(conn)
    .await?;
    Ok(match row {
        Some((epoch, None, status)) if epoch == lease.epoch => {
            SessionStatus::parse(&status).is_some_and(want)
        }
        _ => false,
    })
}

/// Insert `messages` as seq `from…` of the session (existing seqs are left alone, so a
/// retried or overlapping checkpoint is harmless).
async fn insert_messages(
    conn: &mut SqliteConnection,
    root_id: &str,
    session_id: &str,
    from: usize,
    messages: &[Message],
    now: i64,
) -> Result<()> {
    let mut rows = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let seq = from
            .checked_add(i)
            .and_then(|s| i32::try_from(s).ok())
            .ok_or_else(|| Error::invalid("messages", "history too long"))?;
        rows.push((seq, role_str(m.role), serde_json::to_string(m)?));
    }
    insert_rows(conn, root_id, session_id, &rows, now).await
}

/// Insert (seq, role, JSON body) rows of the session, leaving existing seqs alone.
async fn insert_rows<B: AsRef<str>>(
    conn: &mut SqliteConnection,
    root_id: &str,
    session_id: &str,
    rows: &[(i32, &str, B)],
    now: i64,
) -> Result<()> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut qb = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO messages (root_id, session_id, seq, role, body, created_at) ",
        );
        qb.push_values(chunk, |mut b, (seq, role, body)| {
            b.push_bind(root_id)
                .push_bind(session_id)
                .push_bind(*seq)
                .push_bind(*role)
                .push_bind(body.as_ref())
                .push_bind(now);
        });
        qb.push(" ON CONFLICT DO NOTHING");
        qb.build().execute(&mut *conn).await?;
    }
    Ok(())
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

    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)> {
        self.create_sessions(std::slice::from_ref(new))
            .await?
            .pop()
            .ok_or_else(|| Error::Conflict(format!("session {} was not created", new.id)))
    }

    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>> {
        if new.is_empty() {
            return Ok(Vec::new());
        }
        let insert = with_cols(INSERT_SESSION);
        let by_key = format!("SELECT {COLS} FROM sessions WHERE idempotency_key = ?1");
        let by_id = format!("SELECT {COLS} FROM sessions WHERE id = ?1");
        let now = now_us();
        // One transaction for the batch; statements are in-process calls, so one per
        // item costs little, and each sees the rows of the items before it.
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(new.len());
        for s in new {
            // The state a fresh session starts from decides its phase and first message.
            let fresh = SessionState::new(s.id.clone(), s.spec.clone());
            let first = fresh
                .messages
                .into_iter()
                .next()
                .unwrap_or_else(|| Message::user(s.spec.prompt.clone()));
            let inserted = returning_one(
                &mut tx,
                sqlx::query_as(&insert)
                    .bind(&s.id)
                    .bind(&s.root_id)
                    .bind(s.parent_id.as_deref())
                    .bind(i64::from(s.depth))
                    .bind(&s.queue)
                    .bind(Json(&s.spec))
                    .bind(phase_str(fresh.phase))
                    .bind(s.idempotency_key.as_deref())
                    .bind(now),
            )
            .await?;
            if let Some(rec) = inserted {
                insert_messages(
                    &mut tx,
                    &rec.root_id,
                    &rec.id,
                    0,
                    std::slice::from_ref(&first),
                    now,
                )
                .await?;
                out.push((rec.into_row()?, true));
                continue;
            }
            // Not inserted: an existing row with the same idempotency key (or id).
            let mut existing = None;
            if let Some(key) = &s.idempotency_key {
                existing = sqlx::query_as::<_, SqliteRecord>(&by_key)
                    .bind(key)
                    .fetch_optional(&mut *tx)
                    .await?;
            }
            if existing.is_none() {
                existing = sqlx::query_as::<_, SqliteRecord>(&by_id)
                    .bind(&s.id)
                    .fetch_optional(&mut *tx)
                    .await?;
            }
            match existing {
                Some(rec) => out.push((rec.into_row()?, false)),
                None => {
                    return Err(Error::Conflict(format!(
                        "session {} conflicts with an existing row that could not be read",
                        s.id
                    )));
                }
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        // The ids as one JSON array parameter: no limit on the number of ids.
        let ids = serde_json::to_string(ids)?;
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "UPDATE sessions SET enqueued_at = ?1 \
             WHERE id IN (SELECT value FROM json_each(?2)) AND enqueued_at IS NULL",
        )
        .bind(now_us())
        .bind(ids)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT id, queue FROM sessions \
             WHERE status IN ('queued', 'running') AND enqueued_at IS NULL AND created_at < ?1 \
             ORDER BY created_at LIMIT ?2",
        )
        .bind(now_us().saturating_sub(dur_us(age)))
        .bind(i64::from(limit))
        .fetch_all(&self.readers)
        .await?;
        Ok(rows)
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        self.get_record(id)
            .await?
            .map(SqliteRecord::into_row)
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        let limit = match filter.limit {
            0 => DEFAULT_LIST,
            l => l.min(MAX_LIST),
        };
        let mut qb =
            sqlx::QueryBuilder::<Sqlite>::new(format!("SELECT {COLS} FROM sessions WHERE 1"));
        if let Some(status) = filter.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(parent) = &filter.parent_id {
            qb.push(" AND parent_id = ").push_bind(parent.clone());
        }
        if let Some(cursor) = &filter.cursor {
            qb.push(" AND id < ").push_bind(cursor.clone());
        }
        qb.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(limit));
        let rows: Vec<SqliteRecord> = qb.build_query_as().fetch_all(&self.readers).await?;
        rows.into_iter().map(SqliteRecord::into_row).collect()
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        // The LEFT JOIN tells a missing session (no row) from an empty history (NULL body).
        let rows: Vec<(Option<Json<Message>>,)> = sqlx::query_as(
            "SELECT m.body FROM sessions s \
             LEFT JOIN messages m ON m.root_id = s.root_id AND m.session_id = s.id \
             WHERE s.id = ?1 ORDER BY m.seq",
        )
        .bind(id)
        .fetch_all(&self.readers)
        .await?;
        if rows.is_empty() {
            return Err(Error::NotFound(id.to_string()));
        }
        Ok(rows.into_iter().filter_map(|(b,)| b.map(|j| j.0)).collect())
    }

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
            sqlx::query_as(&with_cols(CLAIM))
                .bind(id)
                .bind(owner)
                .bind(now)
                .bind(now.saturating_add(dur_us(ttl))),
        )
        .await?;
        let Some(rec) = claimed else {
            // Why not? Read in the same transaction, so the answer is consistent.
            let sql = format!("SELECT {COLS} FROM sessions WHERE id = ?1");
            let rec: Option<SqliteRecord> = sqlx::query_as(&sql)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            tx.rollback().await?;
            let Some(rec) = rec else {
                return Ok(Claim::NotFound);
            };
            return Ok(match rec.status()? {
                s if s.is_terminal() => Claim::Terminal(Box::new(rec.into_row()?)),
                SessionStatus::Queued | SessionStatus::Running => Claim::Busy,
                s => Claim::NotRunnable(s),
            });
        };
        if rec.attempts > i64::from(max_attempts) {
            // The claim itself stands (as on Postgres): the caller fails the session.
            tx.commit().await?;
            return Ok(Claim::Exhausted(Box::new(rec.into_row()?)));
        }
        // The history, read under the same write lock as the claim: exactly what the
        // previous holder committed, which is all it will ever have written.
        let messages: Vec<(i64, Json<Message>)> = sqlx::query_as(
            "SELECT seq, body FROM messages WHERE root_id = ?1 AND session_id = ?2 ORDER BY seq",
        )
        .bind(&rec.root_id)
        .bind(&rec.id)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let state = rec.state(messages)?;
        let lease = Lease {
            session_id: rec.id.clone(),
            root_id: rec.root_id.clone(),
            owner: owner.to_string(),
            epoch: rec.lease_epoch,
        };
        Ok(Claim::Acquired {
            lease,
            state: Box::new(state),
            row: Box::new(rec.into_row()?),
        })
    }

    /// Returns no rows: a read of an embedded database is cheap, and the caller makes it.
    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        let now = now_us();
        // One transaction for the whole batch (SQLite's group commit); within it each
        // checkpoint's messages are written only if its fenced row update matched.
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(batch.len());
        for cp in batch {
            let lease = &cp.lease;
            let f = cp.finish.as_ref();
            let matched = sqlx::query(CHECKPOINT)
                .bind(&lease.root_id)
                .bind(&lease.session_id)
                .bind(lease.epoch)
                .bind(cp.iteration)
                .bind(cp.input_tokens)
                .bind(cp.output_tokens)
                .bind(cp.cache_read_tokens)
                .bind(cp.cache_write_tokens)
                .bind(cp.reasoning_tokens)
                .bind(cp.drain_rounds)
                .bind(cp.free_iteration)
                .bind(cp.phase)
                .bind(cp.started_at.map(|t| t.timestamp_micros()))
                .bind(f.map(|f| f.status))
                .bind(f.map(|f| f.reason))
                .bind(f.and_then(|f| f.result.as_deref()))
                .bind(f.and_then(|f| f.error.as_deref()))
                .bind(&lease.owner)
                .bind(now)
                .bind(cp.turn_base)
                .bind(cp.not_started.as_str())
                .bind(!cp.messages.is_empty())
                .bind(cp.bg_cursor)
                .bind(cp.msg_cursor)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if matched > 0 {
                let rows: Vec<(i32, &str, &str)> = cp
                    .seqs()
                    .zip(&cp.messages)
                    .map(|(seq, (role, body))| (seq, *role, body.as_str()))
                    .collect();
                insert_rows(&mut tx, &lease.root_id, &lease.session_id, &rows, now).await?;
                out.push(Ok(None));
            // A retried final checkpoint finds the row already finished under our epoch.
            } else if f.is_some() && gave_up_lease(&mut tx, lease, |s| s.is_terminal()).await? {
                out.push(Ok(None));
            } else {
                out.push(Err(Error::LeaseLost(lease.session_id.clone())));
            }
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
            let cancel: Option<bool> = sqlx::query_scalar(
                "UPDATE sessions SET lease_expires_at = ?5 \
                 WHERE root_id = ?1 AND id = ?2 AND lease_epoch = ?3 AND lease_owner = ?4 \
                 RETURNING cancel_requested",
            )
            .bind(&l.root_id)
            .bind(&l.session_id)
            .bind(l.epoch)
            .bind(&l.owner)
            .bind(expires)
            .fetch_all(&mut *tx)
            .await?
            .pop();
            // Write transactions are serialized: no race to allow for, only a lease given
            // up by its holder (same epoch, no owner) to tell from a lost one.
            let lost = cancel.is_none() && !gave_up_lease(&mut tx, l, |_| true).await?;
            out.push(LeaseStatus {
                session_id: l.session_id.clone(),
                held: cancel.is_some(),
                lost,
                cancel_requested: cancel.unwrap_or(false),
            });
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let mut tx = self.write_tx().await?;
        let done = sqlx::query(
            "UPDATE sessions SET status = 'queued', lease_owner = NULL, \
                 lease_expires_at = NULL, attempts = 0, updated_at = ?5 \
             WHERE root_id = ?1 AND id = ?2 AND lease_epoch = ?3 AND lease_owner = ?4 \
               AND status = 'running'",
        )
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

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        let sql = format!(
            "UPDATE sessions SET status = 'failed', finish_reason = 'error', error = ?2, \
                 finished_at = ?3, lease_owner = NULL, lease_expires_at = NULL, \
                 updated_at = ?3 \
             WHERE id = ?1 AND status NOT IN ('completed', 'failed', 'cancelled') \
             RETURNING {COLS}"
        );
        let mut tx = self.write_tx().await?;
        let failed = returning_one(
            &mut tx,
            sqlx::query_as(&sql).bind(id).bind(reason).bind(now_us()),
        )
        .await?;
        tx.commit().await?;
        match failed {
            Some(rec) => rec.into_row().map(Some),
            // Missing, or finished already: leave it as it is.
            None => self.get(id).await,
        }
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        let sql = with_cols(CANCEL);
        let mut tx = self.write_tx().await?;
        let changed = returning_one(&mut tx, sqlx::query_as(&sql).bind(id).bind(now_us())).await?;
        if let Some(rec) = changed {
            tx.commit().await?;
            let row = rec.into_row()?;
            return Ok(if row.status == SessionStatus::Running {
                CancelResult::Requested(Box::new(row))
            } else {
                CancelResult::CancelledNow(Box::new(row))
            });
        }
        // No match: only a missing or terminal session (every other status matches).
        // Read under the same lock, so no race can make the answer wrong.
        let sql = format!("SELECT {COLS} FROM sessions WHERE id = ?1");
        let rec: Option<SqliteRecord> = sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        tx.rollback().await?;
        match rec {
            None => Ok(CancelResult::NotFound),
            Some(rec) => {
                let row = rec.into_row()?;
                if row.status.is_terminal() {
                    Ok(CancelResult::AlreadyFinished(Box::new(row)))
                } else {
                    Err(Error::Conflict(format!(
                        "session {id} has status {} and could not be cancelled; retry",
                        row.status
                    )))
                }
            }
        }
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(COUNT_UNFINISHED)
            .fetch_all(&self.readers)
            .await?;
        unfinished_counts(rows)
    }

    async fn suspend(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let sql = with_cols(SUSPEND);
        let mut tx = self.write_tx().await?;
        let rec = returning_one(
            &mut tx,
            sqlx::query_as(&sql)
                .bind(&lease.root_id)
                .bind(&lease.session_id)
                .bind(lease.epoch)
                .bind(status.as_str())
                .bind(seen_wake)
                .bind(approval_deadline.map(|t| t.timestamp_micros()))
                .bind(&lease.owner)
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

    async fn deliver(
        &self,
        session_id: &str,
        kind: &str,
        dedupe: &str,
        payload: &serde_json::Value,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>> {
        let now = now_us();
        // The session's row is read and written under the write lock (Postgres: `FOR
        // UPDATE`): the item's position is the bumped `wake_seq`, so positions increase in
        // commit order, and a concurrent suspend sees the bump.
        let mut tx = self.write_tx().await?;
        let row: Option<(String, String, String, i64)> =
            sqlx::query_as("SELECT root_id, queue, status, wake_seq FROM sessions WHERE id = ?1")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((root_id, queue, old, wake_seq)) = row else {
            tx.rollback().await?;
            return Ok(None);
        };
        let old = parse_status(&old)?;
        let seq = wake_seq
            .checked_add(1)
            .ok_or_else(|| bad_data(format_args!("wake_seq = {wake_seq}")))?;
        let inserted = sqlx::query(
            "INSERT INTO inbox (root_id, session_id, seq, kind, dedupe, payload, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (root_id, session_id, dedupe) DO NOTHING",
        )
        .bind(&root_id)
        .bind(session_id)
        .bind(seq)
        .bind(kind)
        .bind(dedupe)
        .bind(Json(payload))
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if !inserted {
            // Delivered before: no bump, no wake.
            tx.rollback().await?;
            return Ok(Some(Delivered {
                inserted: false,
                seq: 0,
                woken: false,
                queue,
                status: old,
            }));
        }
        let wakes = wake.contains(&old);
        sqlx::query(
            "UPDATE sessions SET wake_seq = ?3, \
                 status = CASE WHEN ?4 THEN 'queued' ELSE status END, \
                 enqueued_at = CASE WHEN ?4 THEN NULL ELSE enqueued_at END, \
                 updated_at = ?5 \
             WHERE root_id = ?1 AND id = ?2",
        )
        .bind(&root_id)
        .bind(session_id)
        .bind(seq)
        .bind(wakes)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(Delivered {
            inserted: true,
            seq: to_u64(seq, "seq")?,
            woken: wakes && old != SessionStatus::Queued,
            queue,
            status: old,
        }))
    }

    async fn inbox(&self, session_id: &str, kinds: &[&str], after: u64) -> Result<Vec<InboxItem>> {
        // The kinds as one JSON array parameter (SQLite has no array binds).
        let kinds = serde_json::to_string(kinds)?;
        let rows: Vec<(i64, String, Json<serde_json::Value>, i64)> = sqlx::query_as(
            "SELECT seq, kind, payload, created_at FROM inbox \
             WHERE root_id = (SELECT root_id FROM sessions WHERE id = ?1) AND session_id = ?1 \
               AND kind IN (SELECT value FROM json_each(?2)) AND seq > ?3 ORDER BY seq",
        )
        .bind(session_id)
        .bind(kinds)
        .bind(to_i64(after, "after")?)
        .fetch_all(&self.readers)
        .await?;
        rows.into_iter()
            .map(|(seq, kind, payload, created_at)| {
                Ok(InboxItem {
                    seq: to_u64(seq, "seq")?,
                    kind,
                    payload: payload.0,
                    created_at: to_time(created_at, "created_at")?,
                })
            })
            .collect()
    }

    async fn decide_approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<ApprovalRecorded> {
        let now = now_us();
        // Under the write lock, like `deliver`: the decision and the wake-up are one step.
        let mut tx = self.write_tx().await?;
        let row: Option<(String, String, String)> =
            sqlx::query_as("SELECT root_id, queue, status FROM sessions WHERE id = ?1")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some((root_id, queue, old)) = row else {
            tx.rollback().await?;
            return Ok(ApprovalRecorded::NotFound);
        };
        let old = parse_status(&old)?;
        if old.is_terminal() {
            tx.rollback().await?;
            return Ok(ApprovalRecorded::Finished(old));
        }
        let inserted = sqlx::query(
            "INSERT INTO approvals (root_id, session_id, tool_call_id, approve, reason, \
                 decided_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        )
        .bind(&root_id)
        .bind(session_id)
        .bind(tool_call_id)
        .bind(approve)
        .bind(reason)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if !inserted {
            // First decision wins.
            tx.rollback().await?;
            return Ok(ApprovalRecorded::AlreadyDecided);
        }
        let woken = old == SessionStatus::AwaitingApproval;
        sqlx::query(
            "UPDATE sessions SET wake_seq = wake_seq + 1, \
                 status = CASE WHEN ?3 THEN 'queued' ELSE status END, \
                 enqueued_at = CASE WHEN ?3 THEN NULL ELSE enqueued_at END, \
                 updated_at = ?4 \
             WHERE root_id = ?1 AND id = ?2",
        )
        .bind(&root_id)
        .bind(session_id)
        .bind(woken)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(ApprovalRecorded::Recorded { woken, queue })
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>> {
        Ok(sqlx::query_as(
            "SELECT approve, reason FROM approvals \
             WHERE root_id = (SELECT root_id FROM sessions WHERE id = ?1) \
               AND session_id = ?1 AND tool_call_id = ?2",
        )
        .bind(session_id)
        .bind(tool_call_id)
        .fetch_optional(&self.readers)
        .await?)
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<(String, String)>> {
        let mut tx = self.write_tx().await?;
        // Read to the end inside the transaction (see the module docs on `RETURNING`).
        let woken: Vec<(String, String)> = sqlx::query_as(WAKE_EXPIRED)
            .bind(now_us())
            .bind(i64::from(limit))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(woken)
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        let now = now_us();
        let sql = with_cols(FOLLOW_UP);
        let mut tx = self.write_tx().await?;
        let rec = returning_one(
            &mut tx,
            sqlx::query_as(&sql)
                .bind(session_id)
                .bind(to_i64(consume.unwrap_or(0), "consume")?)
                .bind(now),
        )
        .await?;
        let Some(rec) = rec else {
            tx.rollback().await?;
            return Ok(None);
        };
        // The new message goes right after the history (message i has seq i).
        sqlx::query(
            "INSERT INTO messages (root_id, session_id, seq, role, body, created_at) \
             SELECT ?1, ?2, COALESCE(max(seq) + 1, 0), 'user', ?3, ?4 FROM messages \
             WHERE root_id = ?1 AND session_id = ?2",
        )
        .bind(&rec.root_id)
        .bind(&rec.id)
        .bind(serde_json::to_string(&Message::user(text))?)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        rec.into_row().map(Some)
    }
}
