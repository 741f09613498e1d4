//! The Postgres [`Store`]: owns the `sessions` and `messages` tables (`migrations/`), the
//! lease protocol on them (claim, fenced checkpoint, heartbeat, release) and the embedded
//! migrator.
//!
//! Every statement is runtime-checked (`sqlx::query` + `FromRow`), so the build needs no
//! database; `core/tests/pg_store.rs` runs each one against a real server.
//!
//! Leases: a claim bumps `lease_epoch`; every later write of the worker is conditional on
//! `(lease_owner, lease_epoch)`, so a worker that was paused past its lease and replaced
//! finds out at its next write ([`Error::LeaseLost`]) and writes nothing. A checkpoint is
//! one statement (one round trip): the row's scalars plus only the new messages.
//!
//! Cancellation of a running session sets `cancel_requested`; the owner learns it from its
//! heartbeat. A claim does not refuse a session with the flag set (its previous owner may
//! have died before acting on it): the claimer sees `row.cancel_requested` and finishes
//! the session as interrupted.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::types::Json;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{
    ApprovalRecorded, CancelResult, Claim, Delivered, InboxItem, Lease, ListFilter, NewSession,
    SessionRow, SessionStatus,
};
use crate::rowconv::*;
use crate::store::{Committed, LeaseStatus, Store};

/// The migrations this binary was built with.
/// Pooled connections idle at least this long are pinged before use.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Every column [`SessionRecord`] reads, for `SELECT`/`RETURNING` lists on `sessions`
/// (not aliased): the row's own, and its spec from `session_specs`.
const COLS: &str = "id, root_id, parent_id, depth, queue, status, finish_reason, \
    (SELECT p.spec FROM session_specs p WHERE p.root_id = sessions.root_id \
       AND p.id = sessions.id) AS spec, \
    iteration, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
    reasoning_tokens, drain_rounds, free_iteration, phase, started_at, result, error, \
    lease_owner, lease_epoch, lease_expires_at, attempts, cancel_requested, \
    idempotency_key, created_at, updated_at, finished_at, turn_base, not_started, \
    wake_seq, approval_deadline, bg_cursor, msg_cursor, followup_cursor, history_len";

/// `listing` without a limit gets this many rows; no request gets more than `MAX_LIST`.
const DEFAULT_LIST: u32 = 100;
const MAX_LIST: u32 = 10_000;

/// The Postgres store. Cheap to clone (the pools are shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The group commit's and the heartbeat's own connections. They are kept apart so that
    /// a burst of claims or reads queued for the main pool never holds up the checkpoints
    /// that every session in flight waits on, nor the heartbeat that keeps its lease.
    /// They also run their statements with generic plans (see [`GENERIC_PLANS`]).
    writer: PgPool,
}

/// Writer connections [`PgStore::connect`] allows: two commits in flight (the worker's
/// default) and the heartbeat.
pub const DEFAULT_WRITER_CONNECTIONS: u32 = 3;

/// Session settings of the writer connections (and of a worker's main pool). The batched
/// checkpoint and the heartbeat look every row up by its key; planned afresh for each call
/// (Postgres's choice while a connection has run a statement fewer than five times, and
/// whenever the array lengths make a custom plan look cheaper) the checkpoint cost about a
/// millisecond of Postgres CPU per commit, about a third of Postgres's CPU per iteration. A
/// generic plan is made once per connection and made again whenever `sessions` or
/// `messages` is analyzed, so it follows the tables as they grow.
const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

/// Connections the server can still accept from ordinary roles.
const HEADROOM: &str = "SELECT (current_setting('max_connections')::int \
    - current_setting('superuser_reserved_connections')::int \
    - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'))::bigint";

/// What a fresh backend's first claim and first reads would load: the session tables'
/// and their indexes' catalog entries (a simple query, planned and run on no row; the
/// nil uuid, so that no cast of the key can fail).
const WARM_UP: &str = "SELECT 1 FROM sessions s JOIN session_specs p ON p.root_id = s.root_id \
    AND p.id = s.id JOIN messages m ON m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
    WHERE s.id = '00000000-0000-0000-0000-000000000000' \
      AND s.root_id = '00000000-0000-0000-0000-000000000000'";

impl PgStore {
    /// Open a pool of `max_connections` for everything but checkpoints and heartbeats,
    /// and up to [`DEFAULT_WRITER_CONNECTIONS`] for those, opened only when first used (a
    /// scheduler or a CLI command never checkpoints).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let pool = Self::options(max_connections).connect(url).await?;
        let writer = Self::generic_plan_options(DEFAULT_WRITER_CONNECTIONS).connect_lazy(url)?;
        Ok(Self { pool, writer })
    }

    /// Open the pools, with `writers` connections for checkpoints and heartbeats (a
    /// worker's commits in flight, plus one for its heartbeat), opened up front: they are
    /// busy whenever sessions run, and the first commits after a start should not wait
    /// for a connection. Connections are checked before use, so after a database restart
    /// the pools replace dead connections by themselves; an acquire waits at most 5 s, so
    /// an outage surfaces as a (retryable) [`Error::Db`] instead of a hang.
    pub async fn connect_with_writers(
        url: &str,
        max_connections: u32,
        writers: u32,
    ) -> Result<Self> {
        Self::open(url, Self::options(max_connections), writers).await
    }

    /// A worker's store: [`PgStore::connect_with_writers`], with generic plans on the main
    /// pool too. Everything a worker runs there (claims, session and message reads, inbox
    /// and child writes) finds its rows by key, so a plan never depends on the values; and
    /// Postgres plans a statement afresh on each connection until it has run there five
    /// times, which across a worker's up to 64 connections is most claims of a burst
    /// (about 8 % of Postgres's CPU per iteration in `agentq bench`). Not for a store that
    /// also serves the API, whose listings filter on skewed columns (`status`).
    pub async fn connect_for_worker(url: &str, max_connections: u32, writers: u32) -> Result<Self> {
        Self::open(url, Self::generic_plan_options(max_connections), writers).await
    }

    async fn open(url: &str, main: PgPoolOptions, writers: u32) -> Result<Self> {
        let pool = main.connect(url).await?;
        let writers = writers.max(1);
        let writer = Self::generic_plan_options(writers)
            .min_connections(writers)
            .connect(url)
            .await?;
        Ok(Self { pool, writer })
    }

    fn generic_plan_options(max_connections: u32) -> PgPoolOptions {
        Self::options(max_connections).after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, GENERIC_PLANS).await?;
                Ok(())
            })
        })
    }

    fn options(max_connections: u32) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(5))
            // A liveness ping only for a connection that sat idle (maybe across a
            // Postgres restart): one in steady use proves itself with every statement,
            // and a ping on every acquire was ~8 % of a busy worker's CPU. A connection
            // that broke while in use fails its next statement, which callers retry.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }

    /// Open every connection the main pool may hold, and have each backend load the
    /// catalog entries of the session tables, so that a worker's first burst of sessions
    /// (right after a deploy, or when an autoscaler adds it under load) does not pay for
    /// Postgres backends starting under it. The connections close again after the pool's
    /// idle timeout (10 minutes) if nothing uses them. Takes at most half of the
    /// connections the server has left, so that on a server sized too small for every
    /// pool at once, the other workers and the schedulers can still connect.
    pub async fn open_all(&self) -> Result<()> {
        let (free,): (i64,) = sqlx::query_as(HEADROOM).fetch_one(&self.pool).await?;
        let n = self
            .pool
            .options()
            .get_max_connections()
            .min(u32::try_from(free / 2).unwrap_or(0))
            .max(self.pool.size());
        let conns = futures::future::try_join_all((0..n).map(|_| self.pool.acquire())).await?;
        futures::future::try_join_all(conns.into_iter().map(|mut c| async move {
            sqlx::Executor::execute(&mut *c, WARM_UP).await?;
            Ok::<_, sqlx::Error>(())
        }))
        .await?;
        Ok(())
    }

    /// A store on one pool for everything.
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            writer: pool.clone(),
            pool,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The connections of checkpoints and heartbeats.
    pub fn writer_pool(&self) -> &PgPool {
        &self.writer
    }

    /// Apply the embedded migrations (idempotent; sqlx takes an advisory lock, so
    /// concurrent callers are safe).
    pub async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn get_record(&self, id: &str) -> Result<Option<SessionRecord>> {
        let sql = format!("SELECT {COLS} FROM sessions WHERE id = $1");
        Ok(sqlx::query_as::<_, SessionRecord>(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// After a fenced write matched nothing: did an earlier attempt of the same write
    /// commit (the epoch is still ours and we already gave the lease up)? Makes a retry
    /// after an ambiguous failure harmless for the writes that clear the owner.
    async fn gave_up_lease(&self, lease: &Lease, want: fn(SessionStatus) -> bool) -> Result<bool> {
        let row: Option<(i64, Option<String>, String)> = sqlx::query_as(
            "SELECT lease_epoch, lease_owner, status FROM sessions WHERE root_id = $1 AND id = $2",
        )
        .bind(&lease.root_id)
        .bind(&lease.session_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            Some((epoch, None, status)) if epoch == lease.epoch => {
                SessionStatus::parse(&status).is_some_and(want)
            }
            _ => false,
        })
    }
}

/// A `sessions` row as stored, with the loop scalars `SessionRow` does not carry. Read
/// by column, or from the row's JSON (`to_json`) where a statement returns it whole.
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
struct SessionRecord {
    id: String,
    root_id: String,
    parent_id: Option<String>,
    depth: i32,
    queue: String,
    status: String,
    finish_reason: Option<String>,
    spec: Json<SessionSpec>,
    iteration: i32,
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    reasoning_tokens: i64,
    drain_rounds: i32,
    free_iteration: bool,
    phase: String,
    started_at: Option<DateTime<Utc>>,
    result: Option<String>,
    error: Option<String>,
    lease_owner: Option<String>,
    lease_epoch: i64,
    lease_expires_at: Option<DateTime<Utc>>,
    attempts: i32,
    cancel_requested: bool,
    idempotency_key: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    turn_base: i32,
    not_started: Json<Vec<String>>,
    wake_seq: i64,
    approval_deadline: Option<DateTime<Utc>>,
    bg_cursor: i64,
    msg_cursor: i64,
    followup_cursor: i64,
    /// The history's length as the last write left it; `None` on rows from before
    /// migration 0005.
    history_len: Option<i32>,
}

/// Whole seconds and fractions, for `make_interval(secs => …)`.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl SessionRecord {
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
            id: self.id,
            root_id: self.root_id,
            parent_id: self.parent_id,
            queue: self.queue,
            spec: self.spec.0,
            result: self.result,
            error: self.error,
            lease_owner: self.lease_owner,
            lease_epoch: self.lease_epoch,
            lease_expires_at: self.lease_expires_at,
            cancel_requested: self.cancel_requested,
            idempotency_key: self.idempotency_key,
            created_at: self.created_at,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
            wake_seq: self.wake_seq,
            approval_deadline: self.approval_deadline,
            followup_cursor: to_u64(self.followup_cursor, "followup_cursor")?,
        })
    }

    /// The loop state to resume from: this row's scalars plus the stored history.
    fn state(&self, messages: Vec<(i32, Json<Message>)>) -> Result<SessionState> {
        Ok(SessionState {
            session_id: self.id.clone(),
            spec: self.spec.0.clone(),
            messages: history(&self.spec.0.prompt, messages),
            iteration: to_u32(self.iteration, "iteration")?,
            usage: self.usage()?,
            drain_rounds: to_u32(self.drain_rounds, "drain_rounds")?,
            free_iteration: self.free_iteration,
            phase: parse_phase(&self.phase)?,
            started_at: self.started_at,
            outcome: None,
            not_started: self.not_started.0.clone(),
            turn_base: to_u32(self.turn_base, "turn_base")?,
            bg_cursor: to_u64(self.bg_cursor, "bg_cursor")?,
            msg_cursor: to_u64(self.msg_cursor, "msg_cursor")?,
        })
    }
}

/// Message 0 of every history is the user's prompt (`SessionState::new`), which the spec
/// holds; it is stored only by rows written before migration 0005. Message i has seq i.
fn history(prompt: &str, mut stored: Vec<(i32, Json<Message>)>) -> Vec<Message> {
    let mut history = Vec::with_capacity(stored.len() + 1);
    if stored.first().is_none_or(|(seq, _)| *seq != 0) {
        history.push(Message::user(prompt));
    }
    history.extend(stored.drain(..).map(|(_, m)| m.0));
    history
}

/// A finished row as the final checkpoint returns it: the row's JSON object (`to_json`)
/// and its spec's JSON text, joined into one object here rather than by Postgres (whose
/// `jsonb` merge would parse and re-encode both).
fn finished_record(mut row: String, spec: &str) -> Option<SessionRecord> {
    if !row.ends_with('}') {
        return None;
    }
    row.pop();
    row.push_str(",\"spec\":");
    row.push_str(spec);
    row.push('}');
    serde_json::from_str(&row).ok()
}

/// `CREATE` for a batch: one multi-row insert from arrays, the specs beside the rows. A
/// fresh history is the prompt alone, which the spec holds, so no message is stored
/// (`history_len` 1). The spec is answered from the input: a statement does not see what
/// its own other parts insert.
const INSERT_SESSIONS: &str = "
WITH input AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int[], $5::text[],
                         $6::text[], $7::text[], $8::text[])
        WITH ORDINALITY AS i(id, root_id, parent_id, depth, queue, spec, phase,
                             idempotency_key, ord)
), ins AS (
    INSERT INTO sessions (id, root_id, parent_id, depth, queue, status, phase,
                          idempotency_key, history_len)
    SELECT id, root_id, parent_id, depth, queue, 'queued', phase, idempotency_key, 1
    FROM input ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING *
), specs AS (
    INSERT INTO session_specs (root_id, id, spec)
    SELECT ins.root_id, ins.id, input.spec::json FROM ins JOIN input ON input.id = ins.id
)
SELECT ins.*, input.spec::json AS spec FROM ins JOIN input ON input.id = ins.id";

/// The claim: one conditional update. Runnable (`queued`, or `running` under an expired
/// lease or our own), never terminal or suspended.
const CLAIM: &str = "
UPDATE sessions SET
    lease_owner = $2,
    lease_epoch = lease_epoch + 1,
    lease_expires_at = now() + make_interval(secs => $3),
    status = 'running',
    attempts = attempts + 1,
    updated_at = now()
WHERE id = $1
  AND status IN ('queued', 'running')
  AND (lease_owner IS NULL OR lease_expires_at < now() OR lease_owner = $2)
RETURNING COLS";

/// The checkpoint: one statement, one round trip. The update is fenced by the lease; the
/// new messages are inserted only from the update's output, so a fenced-off worker writes
/// nothing at all, and only past the stored history, so a retry after an ambiguous
/// failure is harmless. With an outcome the row becomes terminal and the lease is given
/// up in the same statement.
/// Group commit: the checkpoints of many sessions in one statement, each fenced by its own
/// lease. `$1..$24` are one array per column (one element per checkpoint), `$25..$27` one
/// per new message; the answer is the ids whose lease held, with the row of each that
/// finished.
const CHECKPOINT_BATCH: &str = "
WITH c AS (
    SELECT * FROM UNNEST(
        $1::text[], $2::text[], $3::bigint[], $4::text[], $5::int[], $6::bigint[],
        $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::int[], $12::bool[],
        $13::text[], $14::timestamptz[], $15::text[], $16::text[], $17::text[], $18::text[],
        $19::int[], $20::text[], $21::bigint[], $22::bigint[], $23::bool[], $24::int[]
    ) AS c(root_id, id, epoch, owner, iteration, input_tokens, output_tokens,
           cache_read_tokens, cache_write_tokens, reasoning_tokens, drain_rounds,
           free_iteration, phase, started_at, status, finish_reason, result, error,
           turn_base, not_started, bg_cursor, msg_cursor, has_new, history_len)
), locked AS (
    -- Row locks in key order, as the heartbeat takes them, so that two multi-row writes
    -- of one worker's sessions never wait on each other in a cycle.
    SELECT s.root_id, s.id, s.history_len AS stored_len FROM sessions s
    JOIN c ON s.root_id = c.root_id AND s.id = c.id
    WHERE s.lease_epoch = c.epoch AND s.lease_owner = c.owner
    ORDER BY s.root_id, s.id
    FOR UPDATE OF s
), upd AS (
    UPDATE sessions s SET
        iteration = c.iteration,
        input_tokens = c.input_tokens,
        output_tokens = c.output_tokens,
        cache_read_tokens = c.cache_read_tokens,
        cache_write_tokens = c.cache_write_tokens,
        reasoning_tokens = c.reasoning_tokens,
        drain_rounds = c.drain_rounds,
        free_iteration = c.free_iteration,
        phase = c.phase,
        started_at = c.started_at,
        status = COALESCE(c.status, s.status),
        finish_reason = CASE WHEN c.status IS NULL THEN s.finish_reason ELSE c.finish_reason END,
        result = CASE WHEN c.status IS NULL THEN s.result ELSE c.result END,
        error = CASE WHEN c.status IS NULL THEN s.error ELSE c.error END,
        finished_at = CASE WHEN c.status IS NULL THEN s.finished_at ELSE now() END,
        lease_owner = CASE WHEN c.status IS NULL THEN s.lease_owner ELSE NULL END,
        lease_expires_at = CASE WHEN c.status IS NULL THEN s.lease_expires_at ELSE NULL END,
        turn_base = c.turn_base,
        not_started = c.not_started::jsonb,
        bg_cursor = c.bg_cursor,
        msg_cursor = c.msg_cursor,
        history_len = c.history_len,
        -- Progress: a run that saves new steps is not a crash loop, so the count of
        -- claims that died without finishing starts again.
        attempts = CASE WHEN c.has_new THEN 0 ELSE s.attempts END,
        updated_at = now()
    FROM c, locked
    WHERE s.root_id = locked.root_id AND s.id = locked.id
      AND c.root_id = s.root_id AND c.id = s.id
      AND s.lease_epoch = c.epoch AND s.lease_owner = c.owner
    -- A finished session's row comes back whole: its worker needs it (to tell the parent,
    -- start a follow-up, publish the result), and a read after the commit would be one
    -- more statement per session.
    RETURNING s.root_id, s.id, locked.stored_len,
        CASE WHEN c.status IS NOT NULL THEN to_json(s.*)::text END AS fin,
        CASE WHEN c.status IS NOT NULL THEN (SELECT p.spec::text FROM session_specs p
            WHERE p.root_id = s.root_id AND p.id = s.id) END AS fin_spec
), ins AS (
    -- Only messages not stored yet, so that a retry after an ambiguous failure, or an
    -- overlapping window, stores nothing twice: the row lock orders this against every
    -- other write of the session's messages, and `history_len` says how far they go (a
    -- row from before it was kept checks its stored seqs instead).
    INSERT INTO messages (root_id, session_id, seq, body)
    SELECT upd.root_id::uuid, upd.id::uuid, m.seq, m.body::json
    FROM UNNEST($25::text[], $26::int[], $27::text[]) AS m(id, seq, body)
    JOIN upd ON upd.id = m.id
    WHERE m.seq >= COALESCE(upd.stored_len, 0)
      AND (upd.stored_len IS NOT NULL OR NOT EXISTS (
          SELECT 1 FROM messages x
          WHERE x.root_id = upd.root_id::uuid AND x.session_id = upd.id::uuid
            AND x.seq = m.seq))
)
SELECT id, fin, fin_spec FROM upd";

/// All of a worker's leases in one statement; the answer keeps the input order.
const HEARTBEAT: &str = "
WITH l AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY
        AS l(root_id, id, epoch, owner, ord)
), locked AS (
    -- Key order, as a group commit takes them (no lock cycles between the two).
    SELECT s.root_id, s.id FROM sessions s
    JOIN l ON s.root_id = l.root_id AND s.id = l.id
    WHERE s.lease_epoch = l.epoch AND s.lease_owner = l.owner
    ORDER BY s.root_id, s.id
    FOR UPDATE OF s
), upd AS (
    UPDATE sessions s SET lease_expires_at = now() + make_interval(secs => $5)
    FROM l, locked
    WHERE s.root_id = locked.root_id AND s.id = locked.id
      AND s.root_id = l.root_id AND s.id = l.id AND s.lease_epoch = l.epoch
      AND s.lease_owner = l.owner
    RETURNING s.id, s.lease_epoch, s.cancel_requested
)
SELECT l.id, (upd.id IS NOT NULL) AS held,
    -- Lost only if the row (as of this statement's snapshot) shows another holder: a
    -- lease given up by its holder keeps its epoch and has no owner, and one given up
    -- just after the snapshot still shows ours.
    (upd.id IS NULL AND NOT EXISTS (
        SELECT 1 FROM sessions s
        WHERE s.root_id = l.root_id AND s.id = l.id AND s.lease_epoch = l.epoch
          AND (s.lease_owner IS NULL OR s.lease_owner = l.owner))) AS lost,
    COALESCE(upd.cancel_requested, false) AS cancel
FROM l LEFT JOIN upd ON upd.id = l.id AND upd.lease_epoch = l.epoch
ORDER BY l.ord";

/// Cancel in one race-free statement: queued or suspended → cancelled now; running → the
/// flag for its owner. Terminal rows do not match.
const CANCEL: &str = "
UPDATE sessions SET
    status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
    finish_reason = CASE WHEN status = 'running' THEN finish_reason ELSE 'interrupted' END,
    finished_at = CASE WHEN status = 'running' THEN finished_at ELSE now() END,
    lease_owner = CASE WHEN status = 'running' THEN lease_owner ELSE NULL END,
    lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at ELSE NULL END,
    cancel_requested = true,
    updated_at = now()
WHERE id = $1 AND status IN ('queued', 'running', 'waiting', 'awaiting_approval')
RETURNING COLS";

/// Fenced suspension. A wake that arrived after the claim (`wake_seq > $5`) sends the
/// session back to the queue; a cancel request cancels it. Row-locked with every waker
/// (they bump `wake_seq` under the same lock), so no wake-up can fall between the check
/// and the sleep.
const SUSPEND: &str = "
UPDATE sessions SET
    status = CASE WHEN cancel_requested THEN 'cancelled'
                  WHEN wake_seq > $5 THEN 'queued' ELSE $4 END,
    finish_reason = CASE WHEN cancel_requested THEN 'interrupted' ELSE finish_reason END,
    finished_at = CASE WHEN cancel_requested THEN now() ELSE finished_at END,
    enqueued_at = CASE WHEN wake_seq > $5 AND NOT cancel_requested THEN NULL ELSE enqueued_at END,
    approval_deadline = $6,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = 0,
    updated_at = now()
WHERE root_id = $1 AND id = $2 AND lease_epoch = $3 AND lease_owner = $7 AND status = 'running'
RETURNING COLS";

/// Append to an inbox under the session's row lock: the item's position is the bumped
/// `wake_seq`, so positions increase in commit order.
const DELIVER: &str = "
WITH p AS (
    SELECT root_id, id, queue, status, wake_seq FROM sessions WHERE id = $1 FOR UPDATE
), ins AS (
    INSERT INTO inbox (root_id, session_id, seq, kind, dedupe, payload)
    SELECT p.root_id, p.id, p.wake_seq + 1, $2, $3, $4 FROM p
    ON CONFLICT (root_id, session_id, dedupe) DO NOTHING
    RETURNING seq
), upd AS (
    UPDATE sessions s SET
        wake_seq = ins.seq,
        status = CASE WHEN s.status = ANY($5::text[]) THEN 'queued' ELSE s.status END,
        enqueued_at = CASE WHEN s.status = ANY($5::text[]) THEN NULL ELSE s.enqueued_at END,
        updated_at = now()
    FROM ins WHERE s.id = $1
    RETURNING s.status
)
SELECT p.queue, p.status, (SELECT seq FROM ins), (SELECT status FROM upd) FROM p";

const DECIDE: &str = "
WITH p AS (
    SELECT root_id, id, queue, status FROM sessions WHERE id = $1 FOR UPDATE
), ins AS (
    INSERT INTO approvals (root_id, session_id, tool_call_id, approve, reason)
    SELECT p.root_id, p.id, $2, $3, $4 FROM p
    WHERE p.status NOT IN ('completed', 'failed', 'cancelled')
    ON CONFLICT DO NOTHING
    RETURNING 1
), upd AS (
    UPDATE sessions s SET
        wake_seq = s.wake_seq + 1,
        status = CASE WHEN s.status = 'awaiting_approval' THEN 'queued' ELSE s.status END,
        enqueued_at = CASE WHEN s.status = 'awaiting_approval' THEN NULL ELSE s.enqueued_at END,
        updated_at = now()
    FROM ins WHERE s.id = $1
    RETURNING s.status
)
SELECT p.queue, p.status, EXISTS (SELECT 1 FROM ins), (SELECT status FROM upd) FROM p";

const FOLLOW_UP: &str = "
UPDATE sessions SET
    status = 'queued', finish_reason = NULL, result = NULL, error = NULL,
    finished_at = NULL, turn_base = iteration, drain_rounds = 0, free_iteration = false,
    enqueued_at = NULL, cancel_requested = false, attempts = 0,
    lease_owner = NULL, lease_expires_at = NULL, approval_deadline = NULL,
    followup_cursor = GREATEST(followup_cursor, $2),
    history_len = history_len + 1,
    updated_at = now()
WHERE id = $1 AND status IN ('completed', 'failed', 'cancelled')
  AND ($2 = 0 OR followup_cursor < $2)
RETURNING COLS";

fn with_cols(sql: &str) -> String {
    sql.replace("COLS", COLS)
}

#[async_trait]
impl Store for PgStore {
    async fn check_schema(&self) -> Result<()> {
        let applied: Option<Vec<i64>> = match sqlx::query_scalar(APPLIED_MIGRATIONS)
            .fetch_all(&self.pool)
            .await
        {
            Ok(v) => Some(v),
            // 42P01 undefined_table: never migrated.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => None,
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
        let n = new.len();
        let mut ids = Vec::with_capacity(n);
        let mut roots = Vec::with_capacity(n);
        let mut parents = Vec::with_capacity(n);
        let mut depths = Vec::with_capacity(n);
        let mut queues = Vec::with_capacity(n);
        let mut specs = Vec::with_capacity(n);
        let mut phases = Vec::with_capacity(n);
        let mut keys = Vec::with_capacity(n);
        for s in new {
            ids.push(s.id.as_str());
            roots.push(s.root_id.as_str());
            parents.push(s.parent_id.as_deref());
            depths.push(to_i32(s.depth, "depth")?);
            queues.push(s.queue.as_str());
            specs.push(serde_json::to_string(&s.spec)?);
            // The state a fresh session starts from decides its phase.
            phases.push(phase_str(
                SessionState::new(s.id.clone(), s.spec.clone()).phase,
            ));
            keys.push(s.idempotency_key.as_deref());
        }
        let inserted: Vec<SessionRecord> = sqlx::query_as(&with_cols(INSERT_SESSIONS))
            .bind(&ids)
            .bind(&roots)
            .bind(&parents)
            .bind(&depths)
            .bind(&queues)
            .bind(&specs)
            .bind(&phases)
            .bind(&keys)
            .fetch_all(&self.pool)
            .await?;
        let mut by_id: std::collections::HashMap<String, SessionRow> = inserted
            .into_iter()
            .map(|r| r.into_row().map(|row| (row.id.clone(), row)))
            .collect::<Result<_>>()?;

        // Items that were not inserted: an existing row with the same idempotency key
        // (or id). One more query for all of them; read after the insert, so it sees rows
        // of a concurrent insert that the conflict waited for.
        let missing: Vec<&NewSession> = new.iter().filter(|s| !by_id.contains_key(&s.id)).collect();
        let mut by_key = std::collections::HashMap::new();
        let mut existing_by_id = std::collections::HashMap::new();
        if !missing.is_empty() {
            let m_ids: Vec<&str> = missing.iter().map(|s| s.id.as_str()).collect();
            let m_keys: Vec<&str> = missing
                .iter()
                .filter_map(|s| s.idempotency_key.as_deref())
                .collect();
            let sql = format!(
                "SELECT {COLS} FROM sessions WHERE id = ANY($1) \
                 OR idempotency_key = ANY($2)"
            );
            let rows: Vec<SessionRecord> = sqlx::query_as(&sql)
                .bind(&m_ids)
                .bind(&m_keys)
                .fetch_all(&self.pool)
                .await?;
            for r in rows {
                let row = r.into_row()?;
                if let Some(k) = &row.idempotency_key {
                    by_key.insert(k.clone(), row.clone());
                }
                existing_by_id.insert(row.id.clone(), row);
            }
        }

        let mut out = Vec::with_capacity(n);
        for s in new {
            // Take the inserted row once: a later duplicate of the same item is a repeat.
            if let Some(row) = by_id.remove(&s.id) {
                if let Some(k) = &row.idempotency_key {
                    by_key.insert(k.clone(), row.clone());
                }
                existing_by_id.insert(row.id.clone(), row.clone());
                out.push((row, true));
                continue;
            }
            let found = s
                .idempotency_key
                .as_ref()
                .and_then(|k| by_key.get(k))
                .or_else(|| existing_by_id.get(&s.id));
            match found {
                Some(row) => out.push((row.clone(), false)),
                None => {
                    return Err(Error::Conflict(format!(
                        "session {} conflicts with an existing row that could not be read",
                        s.id
                    )));
                }
            }
        }
        Ok(out)
    }

    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE sessions SET enqueued_at = now() \
             WHERE id = ANY($1) AND enqueued_at IS NULL",
        )
        .bind(ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT id, queue FROM sessions \
             WHERE status IN ('queued', 'running') AND enqueued_at IS NULL \
               AND created_at < now() - make_interval(secs => $1) \
             ORDER BY created_at LIMIT $2",
        )
        .bind(secs(age))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    async fn reset_enqueued(&self, queue: &str) -> Result<u64> {
        let n = sqlx::query(
            "UPDATE sessions SET enqueued_at = NULL \
             WHERE queue = $1 AND status IN ('queued', 'running') AND enqueued_at IS NOT NULL",
        )
        .bind(queue)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n)
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        self.get_record(id)
            .await?
            .map(SessionRecord::into_row)
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        let limit = match filter.limit {
            0 => DEFAULT_LIST,
            l => l.min(MAX_LIST),
        };
        // Built per filter rather than `($1 IS NULL OR …)`, so each shape gets a plan
        // that uses its index.
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!(
            "SELECT {COLS} FROM sessions WHERE true"
        ));
        if let Some(status) = filter.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(parent) = &filter.parent_id {
            qb.push(" AND parent_id = ").push_bind(parent.as_str());
        }
        if let Some(cursor) = &filter.cursor {
            qb.push(" AND id < ").push_bind(cursor.as_str());
        }
        qb.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(limit));
        let rows: Vec<SessionRecord> = qb.build_query_as().fetch_all(&self.pool).await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        // Through `sessions` so the lookup uses the (root_id, session_id) index; the
        // LEFT JOIN tells a missing session (no row) from a history of the prompt alone
        // (NULL seq), and brings the prompt for message 0.
        let rows: Vec<(String, Option<i32>, Option<Json<Message>>)> = sqlx::query_as(
            "SELECT coalesce(p.spec->>'prompt', ''), m.seq, m.body FROM sessions s \
             JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id \
             LEFT JOIN messages m ON m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
             WHERE s.id = $1 ORDER BY m.seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        let Some((prompt, _, _)) = rows.first() else {
            return Err(Error::NotFound(id.to_string()));
        };
        let prompt = prompt.clone();
        let stored = rows
            .into_iter()
            .filter_map(|(_, seq, body)| seq.zip(body))
            .collect();
        Ok(history(&prompt, stored))
    }

    async fn claim(
        &self,
        id: &str,
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Claim> {
        let claimed: Option<SessionRecord> = sqlx::query_as(&with_cols(CLAIM))
            .bind(id)
            .bind(owner)
            .bind(secs(ttl))
            .fetch_optional(&self.pool)
            .await?;
        let Some(rec) = claimed else {
            // Why not? (A race with another claim only changes which answer is right.)
            let Some(rec) = self.get_record(id).await? else {
                return Ok(Claim::NotFound);
            };
            let status = rec.status()?;
            return Ok(match status {
                s if s.is_terminal() => Claim::Terminal(Box::new(rec.into_row()?)),
                SessionStatus::Queued | SessionStatus::Running => Claim::Busy,
                s => Claim::NotRunnable(s),
            });
        };
        if i64::from(rec.attempts) > i64::from(max_attempts) {
            return Ok(Claim::Exhausted(Box::new(rec.into_row()?)));
        }
        // A second statement, after the claim committed: from here on the previous holder
        // is fenced off, so this read sees everything it will ever have written. The
        // claimed row is the latest version (the claim waited for any write in flight),
        // and every write that stores messages sets `history_len` with them: a history of
        // the prompt alone has nothing stored to read.
        let messages: Vec<(i32, Json<Message>)> = if rec.history_len.is_some_and(|n| n <= 1) {
            Vec::new()
        } else {
            sqlx::query_as(
                "SELECT seq, body FROM messages \
                 WHERE root_id = $1::uuid AND session_id = $2::uuid ORDER BY seq",
            )
            .bind(&rec.root_id)
            .bind(&rec.id)
            .fetch_all(&self.pool)
            .await?
        };
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

    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let n = batch.len();
        let mut roots = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(n);
        let mut epochs = Vec::with_capacity(n);
        let mut owners = Vec::with_capacity(n);
        let mut iterations = Vec::with_capacity(n);
        let mut input = Vec::with_capacity(n);
        let mut output = Vec::with_capacity(n);
        let mut cache_read = Vec::with_capacity(n);
        let mut cache_write = Vec::with_capacity(n);
        let mut reasoning = Vec::with_capacity(n);
        let mut drain_rounds = Vec::with_capacity(n);
        let mut free_iteration = Vec::with_capacity(n);
        let mut phases = Vec::with_capacity(n);
        let mut started_at = Vec::with_capacity(n);
        let mut statuses = Vec::with_capacity(n);
        let mut reasons = Vec::with_capacity(n);
        let mut results = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut turn_base = Vec::with_capacity(n);
        let mut not_started = Vec::with_capacity(n);
        let mut bg_cursor = Vec::with_capacity(n);
        let mut msg_cursor = Vec::with_capacity(n);
        let mut has_new = Vec::with_capacity(n);
        let mut history_len = Vec::with_capacity(n);
        let (mut m_ids, mut m_seqs, mut m_bodies) = (Vec::new(), Vec::new(), Vec::new());
        for cp in batch {
            let l = &cp.lease;
            roots.push(l.root_id.as_str());
            ids.push(l.session_id.as_str());
            epochs.push(l.epoch);
            owners.push(l.owner.as_str());
            iterations.push(cp.iteration);
            input.push(cp.input_tokens);
            output.push(cp.output_tokens);
            cache_read.push(cp.cache_read_tokens);
            cache_write.push(cp.cache_write_tokens);
            reasoning.push(cp.reasoning_tokens);
            drain_rounds.push(cp.drain_rounds);
            free_iteration.push(cp.free_iteration);
            phases.push(cp.phase);
            started_at.push(cp.started_at);
            let f = cp.finish.as_ref();
            statuses.push(f.map(|f| f.status));
            reasons.push(f.map(|f| f.reason));
            results.push(f.and_then(|f| f.result.as_deref()));
            errors.push(f.and_then(|f| f.error.as_deref()));
            turn_base.push(cp.turn_base);
            not_started.push(cp.not_started.as_str());
            bg_cursor.push(cp.bg_cursor);
            msg_cursor.push(cp.msg_cursor);
            has_new.push(!cp.messages.is_empty());
            history_len.push(cp.history_len);
            for (seq, (_, body)) in cp.seqs().zip(&cp.messages) {
                m_ids.push(l.session_id.as_str());
                m_seqs.push(seq);
                m_bodies.push(body.as_str());
            }
        }
        let held: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(CHECKPOINT_BATCH)
            .bind(&roots)
            .bind(&ids)
            .bind(&epochs)
            .bind(&owners)
            .bind(&iterations)
            .bind(&input)
            .bind(&output)
            .bind(&cache_read)
            .bind(&cache_write)
            .bind(&reasoning)
            .bind(&drain_rounds)
            .bind(&free_iteration)
            .bind(&phases)
            .bind(&started_at)
            .bind(&statuses)
            .bind(&reasons)
            .bind(&results)
            .bind(&errors)
            .bind(&turn_base)
            .bind(&not_started)
            .bind(&bg_cursor)
            .bind(&msg_cursor)
            .bind(&has_new)
            .bind(&history_len)
            .bind(&m_ids)
            .bind(&m_seqs)
            .bind(&m_bodies)
            .fetch_all(&self.writer)
            .await?;
        let mut held: std::collections::HashMap<String, (Option<String>, Option<String>)> = held
            .into_iter()
            .map(|(id, fin, spec)| (id, (fin, spec)))
            .collect();
        let mut out = Vec::with_capacity(n);
        for cp in batch {
            let lease = &cp.lease;
            if let Some((fin, spec)) = held.remove(&lease.session_id) {
                // Committed either way; a row that does not decode is read again by the
                // caller, which then reports what is wrong with it.
                let row = fin
                    .zip(spec)
                    .and_then(|(row, spec)| finished_record(row, &spec))
                    .and_then(|r| r.into_row().ok());
                out.push(Ok(row.map(Box::new)));
            // A retried final checkpoint finds the row already finished under our epoch.
            } else if cp.finish.is_some() && self.gave_up_lease(lease, |s| s.is_terminal()).await? {
                out.push(Ok(None));
            } else {
                out.push(Err(Error::LeaseLost(lease.session_id.clone())));
            }
        }
        Ok(out)
    }

    async fn heartbeat(&self, leases: &[Lease], ttl: Duration) -> Result<Vec<LeaseStatus>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let roots: Vec<&str> = leases.iter().map(|l| l.root_id.as_str()).collect();
        let ids: Vec<&str> = leases.iter().map(|l| l.session_id.as_str()).collect();
        let epochs: Vec<i64> = leases.iter().map(|l| l.epoch).collect();
        let owners: Vec<&str> = leases.iter().map(|l| l.owner.as_str()).collect();
        let rows: Vec<(String, bool, bool, bool)> = sqlx::query_as(HEARTBEAT)
            .bind(&roots)
            .bind(&ids)
            .bind(&epochs)
            .bind(&owners)
            .bind(secs(ttl))
            .fetch_all(&self.writer)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(session_id, held, lost, cancel_requested)| LeaseStatus {
                session_id,
                held,
                lost,
                cancel_requested,
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let done = sqlx::query(
            "UPDATE sessions SET status = 'queued', lease_owner = NULL, \
                 lease_expires_at = NULL, attempts = 0, updated_at = now() \
             WHERE root_id = $1 AND id = $2 AND lease_epoch = $3 AND lease_owner = $4 \
               AND status = 'running'",
        )
        .bind(&lease.root_id)
        .bind(&lease.session_id)
        .bind(lease.epoch)
        .bind(&lease.owner)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if done > 0
            || self
                .gave_up_lease(lease, |s| s == SessionStatus::Queued)
                .await?
        {
            return Ok(());
        }
        Err(Error::LeaseLost(lease.session_id.clone()))
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        let sql = format!(
            "UPDATE sessions SET status = 'failed', finish_reason = 'error', error = $2, \
                 finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, \
                 updated_at = now() \
             WHERE id = $1 AND status NOT IN ('completed', 'failed', 'cancelled') \
             RETURNING {COLS}"
        );
        let failed: Option<SessionRecord> = sqlx::query_as(&sql)
            .bind(id)
            .bind(reason)
            .fetch_optional(&self.pool)
            .await?;
        match failed {
            Some(rec) => rec.into_row().map(Some),
            // Missing, or finished already: leave it as it is.
            None => self.get(id).await,
        }
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        let sql = with_cols(CANCEL);
        let changed: Option<SessionRecord> = sqlx::query_as(&sql)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        if let Some(rec) = changed {
            let row = rec.into_row()?;
            return Ok(if row.status == SessionStatus::Running {
                CancelResult::Requested(Box::new(row))
            } else {
                CancelResult::CancelledNow(Box::new(row))
            });
        }
        // No match: only a missing or terminal session (every other status matches).
        match self.get(id).await? {
            None => Ok(CancelResult::NotFound),
            Some(row) if row.status.is_terminal() => {
                Ok(CancelResult::AlreadyFinished(Box::new(row)))
            }
            Some(row) => Err(Error::Conflict(format!(
                "session {id} changed status to {} during the cancel; retry",
                row.status
            ))),
        }
    }

    async fn ping(&self) -> Result<()> {
        // Both pools (the writers' once it has connections): after an outage, each gives
        // up its dead connections as it is used.
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        if self.writer.size() > 0 {
            sqlx::query("SELECT 1").execute(&self.writer).await?;
        }
        Ok(())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(COUNT_UNFINISHED)
            .fetch_all(&self.pool)
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
        let rec: Option<SessionRecord> = sqlx::query_as(&sql)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(status.as_str())
            .bind(seen_wake)
            .bind(approval_deadline)
            .bind(&lease.owner)
            .fetch_optional(&self.pool)
            .await?;
        match rec {
            Some(r) => r.into_row(),
            None => Err(Error::LeaseLost(lease.session_id.clone())),
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
        let wake: Vec<&str> = wake.iter().map(SessionStatus::as_str).collect();
        let row: Option<(String, String, Option<i64>, Option<String>)> = sqlx::query_as(DELIVER)
            .bind(session_id)
            .bind(kind)
            .bind(dedupe)
            .bind(Json(payload))
            .bind(&wake)
            .fetch_optional(&self.pool)
            .await?;
        let Some((queue, old, seq, new)) = row else {
            return Ok(None);
        };
        let old = parse_status(&old)?;
        Ok(Some(Delivered {
            inserted: seq.is_some(),
            seq: seq.map_or(Ok(0), |s| to_u64(s, "seq"))?,
            woken: old != SessionStatus::Queued && new.as_deref() == Some("queued"),
            queue,
            status: old,
        }))
    }

    async fn inbox(&self, session_id: &str, kinds: &[&str], after: u64) -> Result<Vec<InboxItem>> {
        let rows: Vec<(i64, String, Json<serde_json::Value>, DateTime<Utc>)> = sqlx::query_as(
            "SELECT seq, kind, payload, created_at FROM inbox \
             WHERE root_id = (SELECT root_id FROM sessions WHERE id = $1) AND session_id = $1 \
               AND kind = ANY($2::text[]) AND seq > $3 ORDER BY seq",
        )
        .bind(session_id)
        .bind(kinds)
        .bind(to_i64(after, "after")?)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(seq, kind, payload, created_at)| {
                Ok(InboxItem {
                    seq: to_u64(seq, "seq")?,
                    kind,
                    payload: payload.0,
                    created_at,
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
        let row: Option<(String, String, bool, Option<String>)> = sqlx::query_as(DECIDE)
            .bind(session_id)
            .bind(tool_call_id)
            .bind(approve)
            .bind(reason)
            .fetch_optional(&self.pool)
            .await?;
        let Some((queue, old, inserted, new)) = row else {
            return Ok(ApprovalRecorded::NotFound);
        };
        let old = parse_status(&old)?;
        if old.is_terminal() {
            return Ok(ApprovalRecorded::Finished(old));
        }
        if !inserted {
            return Ok(ApprovalRecorded::AlreadyDecided);
        }
        Ok(ApprovalRecorded::Recorded {
            woken: old == SessionStatus::AwaitingApproval && new.as_deref() == Some("queued"),
            queue,
        })
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>> {
        Ok(sqlx::query_as(
            "SELECT approve, reason FROM approvals \
             WHERE root_id = (SELECT root_id FROM sessions WHERE id = $1) \
               AND session_id = $1 AND tool_call_id = $2",
        )
        .bind(session_id)
        .bind(tool_call_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "UPDATE sessions SET status = 'queued', enqueued_at = NULL, \
                 wake_seq = wake_seq + 1, updated_at = now() \
             WHERE id IN (SELECT id FROM sessions WHERE status = 'awaiting_approval' \
                          AND approval_deadline < now() ORDER BY approval_deadline LIMIT $1) \
               AND status = 'awaiting_approval' \
             RETURNING id, queue",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        let mut tx = self.pool.begin().await?;
        let sql = with_cols(FOLLOW_UP);
        let rec: Option<SessionRecord> = sqlx::query_as(&sql)
            .bind(session_id)
            .bind(to_i64(consume.unwrap_or(0), "consume")?)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(rec) = rec else {
            tx.rollback().await?;
            return Ok(None);
        };
        // The new message goes right after the history (message i has seq i). A row from
        // before `history_len` has its history stored from message 0, so its last seq says
        // where; message 0 itself is always the prompt.
        // (Inside `COALESCE`, the scan for the last seq runs only for such a row: the
        // message index does not hold seqs, so it would read the session's every row.)
        sqlx::query(
            "INSERT INTO messages (root_id, session_id, seq, body) \
             VALUES ($1::uuid, $2::uuid, COALESCE($4, (SELECT max(seq) + 1 FROM messages \
                     WHERE root_id = $1::uuid AND session_id = $2::uuid), 1), $3::json)",
        )
        .bind(&rec.root_id)
        .bind(&rec.id)
        .bind(Json(Message::user(text)))
        .bind(rec.history_len.map(|n| n - 1))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        rec.into_row().map(Some)
    }
}
