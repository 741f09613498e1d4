//! The SQLite store's writes that take several statements (where Postgres runs one): each
//! runs inside the caller's `BEGIN IMMEDIATE` transaction, so it holds the file's write
//! lock throughout and its steps see and make one consistent state, which is what
//! Postgres' row locks give the single statement.

use sqlx::{Sqlite, SqliteConnection};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{ApprovalRecorded, Delivered, Lease, NewSession, SessionRow, SessionStatus};
use crate::protocol::phase_name;
use crate::rowconv::{bad_data, parse_status};
use crate::sql::escape::{escape_opt, escape_text, stored_json};
use crate::sql::outcome::{approval_recorded, delivered, fresh_phase, unreadable_conflict};
use crate::sql::record::SessionRecord;
use crate::sql::statements::COLS;
use crate::sql::statements::SQLITE as SQL;
use crate::store::{Committed, LeaseStatus};

use super::tx::{gave_up_lease, record_in};

/// Messages per multi-row insert: 4 parameters each, far below SQLite's 32 766 limit.
const INSERT_CHUNK: usize = 1000;

/// A fresh session's row. Its history is the prompt alone, which the spec holds, so no
/// message is stored (`history_len` 1).
const INSERT_SESSION: &str = "
INSERT INTO sessions (id, root_id, parent_id, depth, queue, status, phase,
                      idempotency_key, history_len, created_at, updated_at,
                      idempotency_hash, tenant, priority, batch_id, batch_max_running, held,
                      capped, custom_id)
VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, 1, $8, $8, $9, $10, $11, $12, $13, $14, $15,
        $16)
ON CONFLICT DO NOTHING";

const INSERT_SPEC: &str = "INSERT INTO session_specs (root_id, id, spec) VALUES ($1, $2, $3)";

/// The checkpoint's row update, fenced by the lease. With an outcome ($14 not null) the
/// row becomes terminal and the lease is given up in the same statement. $19 = now; $22:
/// new messages are saved (progress: the count of claims that died without finishing
/// starts again); $23, $24: the inbox cursors, advanced with the history they delivered;
/// $25: the history's length; $26: the model the run calls (`NULL` keeps the stored one);
/// $27: the web searches run.
const CHECKPOINT: &str = "
UPDATE sessions SET
    iteration = $4,
    input_tokens = $5,
    output_tokens = $6,
    cache_read_tokens = $7,
    cache_write_tokens = $8,
    reasoning_tokens = $9,
    drain_rounds = $10,
    free_iteration = $11,
    phase = $12,
    started_at = $13,
    status = COALESCE($14, status),
    finish_reason = CASE WHEN $14 IS NULL THEN finish_reason ELSE $15 END,
    result = CASE WHEN $14 IS NULL THEN result ELSE $16 END,
    error = CASE WHEN $14 IS NULL THEN error ELSE $17 END,
    finished_at = CASE WHEN $14 IS NULL THEN finished_at ELSE $19 END,
    lease_owner = CASE WHEN $14 IS NULL THEN lease_owner ELSE NULL END,
    lease_expires_at = CASE WHEN $14 IS NULL THEN lease_expires_at ELSE NULL END,
    updated_at = $19,
    turn_base = $20,
    not_started = $21,
    attempts = CASE WHEN $22 THEN 0 ELSE attempts END,
    bg_cursor = $23,
    msg_cursor = $24,
    history_len = $25,
    model_used = COALESCE($26, model_used),
    web_search_requests = $27
WHERE root_id = $1 AND id = $2 AND lease_epoch = $3 AND lease_owner = $18";

/// Insert one session (with `custom_id`, and its spec) unless it conflicts with a stored
/// one (its id, its tenant's idempotency key, its batch's `custom_id`); whether it did.
pub(super) async fn insert(
    conn: &mut SqliteConnection,
    s: &NewSession,
    custom_id: Option<&str>,
    now: i64,
) -> Result<bool> {
    let inserted = sqlx::query(INSERT_SESSION)
        .bind(&s.id)
        .bind(&s.root_id)
        .bind(s.parent_id.as_deref())
        .bind(i64::from(s.depth))
        .bind(&s.queue)
        .bind(fresh_phase(s))
        .bind(s.idempotency_key.as_deref())
        .bind(now)
        .bind(s.idempotency_hash.as_deref())
        .bind(&s.tenant)
        .bind(i64::from(s.sched.priority))
        .bind(s.sched.batch_id.as_deref())
        .bind(s.sched.batch_max_running.map(i64::from))
        .bind(s.sched.held)
        .bind(s.sched.capped)
        .bind(custom_id)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        > 0;
    if inserted {
        sqlx::query(INSERT_SPEC)
            .bind(&s.root_id)
            .bind(&s.id)
            .bind(stored_json(&s.spec)?)
            .execute(&mut *conn)
            .await?;
    }
    Ok(inserted)
}

/// Insert one session (and its spec) unless it exists; the row, and whether it is new.
pub(super) async fn create(
    conn: &mut SqliteConnection,
    s: &NewSession,
    now: i64,
) -> Result<(SessionRow, bool)> {
    if insert(conn, s, None, now).await? {
        let rec = record_in(conn, &s.id).await?;
        return Ok((rec.ok_or_else(|| unreadable_conflict(s))?.into_row()?, true));
    }
    // Not inserted: an existing row with the same idempotency key (or id).
    let mut existing = None;
    if let Some(key) = &s.idempotency_key {
        let by_key =
            format!("SELECT {COLS} FROM sessions WHERE tenant = $1 AND idempotency_key = $2");
        existing = sqlx::query_as::<_, SessionRecord>(&by_key)
            .bind(&s.tenant)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
    }
    if existing.is_none() {
        existing = record_in(conn, &s.id).await?;
    }
    match existing {
        Some(rec) => Ok((rec.into_row()?, false)),
        None => Err(unreadable_conflict(s)),
    }
}

/// One checkpoint of a batch: the fenced row update, then (only if it matched) the new
/// messages.
pub(super) async fn checkpoint(
    conn: &mut SqliteConnection,
    cp: &Checkpoint,
    now: i64,
) -> Result<Result<Committed>> {
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
        .bind(phase_name(cp.phase))
        .bind(cp.started_at.map(|t| t.timestamp_micros()))
        .bind(f.map(|f| f.status.as_str()))
        .bind(f.map(|f| f.reason.as_str()))
        .bind(f.and_then(|f| f.result.as_deref()))
        .bind(f.and_then(|f| f.error.as_deref()))
        .bind(&lease.owner)
        .bind(now)
        .bind(cp.turn_base)
        .bind(cp.not_started.as_str())
        .bind(!cp.messages.is_empty())
        .bind(cp.bg_cursor)
        .bind(cp.msg_cursor)
        .bind(cp.history_len)
        .bind(cp.model_used.as_deref())
        .bind(cp.web_search_requests)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if matched > 0 {
        // Message 0 is the prompt, which the spec holds: never stored (a row written
        // before that rule has it stored already).
        let rows: Vec<(i32, &str)> = cp
            .seqs()
            .zip(&cp.messages)
            .filter(|(seq, _)| *seq > 0)
            .map(|(seq, body)| (seq, body.as_str()))
            .collect();
        insert_messages(conn, &lease.root_id, &lease.session_id, &rows).await?;
        super::workspace::commit_files(conn, cp).await?;
        return Ok(Ok(None));
    }
    // A retried final checkpoint finds the row already finished under our epoch.
    if f.is_some() && gave_up_lease(conn, lease, |s| s.is_terminal()).await? {
        return Ok(Ok(None));
    }
    Ok(Err(Error::LeaseLost(lease.session_id.clone())))
}

/// Insert (seq, JSON body) rows of the session, leaving existing seqs alone, so that a
/// retried or overlapping checkpoint stores nothing twice.
async fn insert_messages(
    conn: &mut SqliteConnection,
    root_id: &str,
    session_id: &str,
    rows: &[(i32, &str)],
) -> Result<()> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut qb = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO messages (root_id, session_id, seq, body) ",
        );
        qb.push_values(chunk, |mut b, (seq, body)| {
            b.push_bind(root_id)
                .push_bind(session_id)
                .push_bind(*seq)
                .push_bind(*body);
        });
        qb.push(" ON CONFLICT DO NOTHING");
        qb.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// What one lease of a heartbeat shows (the heartbeat writes the worker's row, not the
/// session's).
pub(super) async fn lease_status(conn: &mut SqliteConnection, l: &Lease) -> Result<LeaseStatus> {
    let row: Option<(i64, Option<String>, bool)> = sqlx::query_as(&SQL.lease_state)
        .bind(&l.root_id)
        .bind(&l.session_id)
        .fetch_optional(&mut *conn)
        .await?;
    let (held, lost, cancel) = match row {
        Some((epoch, owner, cancel)) if epoch == l.epoch => {
            let ours = owner.as_deref() == Some(l.owner.as_str());
            // Same epoch and no owner: given up by its holder, not lost.
            (ours, !ours && owner.is_some(), ours && cancel)
        }
        _ => (false, true, false),
    };
    Ok(LeaseStatus {
        session_id: l.session_id.clone(),
        held,
        lost,
        cancel_requested: cancel,
    })
}

/// An inbox item to deliver.
pub(super) struct Item<'a> {
    pub session_id: &'a str,
    pub kind: &'a str,
    pub dedupe: &'a str,
    pub payload: &'a serde_json::Value,
}

/// Append the item at the session's bumped `wake_seq` and wake it if its status is in
/// `wake`. The caller commits only what inserted something.
pub(super) async fn deliver(
    conn: &mut SqliteConnection,
    item: &Item<'_>,
    wake: &[SessionStatus],
    now: i64,
) -> Result<Option<Delivered>> {
    let row: Option<(String, String, String, i64, bool, bool)> = sqlx::query_as(
        "SELECT root_id, queue, status, wake_seq, held, capped FROM sessions WHERE id = $1",
    )
    .bind(item.session_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((root_id, queue, old, wake_seq, was_held, capped)) = row else {
        return Ok(None);
    };
    let old = parse_status(&old)?;
    let seq = wake_seq
        .checked_add(1)
        .ok_or_else(|| bad_data(format_args!("wake_seq = {wake_seq}")))?;
    let inserted = sqlx::query(
        "INSERT INTO inbox (root_id, session_id, seq, kind, dedupe, payload, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (root_id, session_id, dedupe) DO NOTHING",
    )
    .bind(&root_id)
    .bind(item.session_id)
    .bind(seq)
    .bind(item.kind)
    .bind(item.dedupe)
    .bind(stored_json(item.payload)?)
    .bind(now)
    .execute(&mut *conn)
    .await?
    .rows_affected()
        > 0;
    if !inserted {
        // Delivered before: no bump, no wake.
        return delivered(queue, old, None, false, was_held).map(Some);
    }
    let wakes = wake.contains(&old);
    sqlx::query(
        "UPDATE sessions SET wake_seq = $3, \
             status = CASE WHEN $4 THEN 'queued' ELSE status END, \
             enqueued_at = CASE WHEN $4 THEN NULL ELSE enqueued_at END, \
             held = CASE WHEN $4 THEN capped ELSE held END, \
             updated_at = $5 \
         WHERE root_id = $1 AND id = $2",
    )
    .bind(&root_id)
    .bind(item.session_id)
    .bind(seq)
    .bind(wakes)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    let held = if wakes { capped } else { was_held };
    delivered(
        queue,
        old,
        Some(seq),
        wakes || old == SessionStatus::Queued,
        held,
    )
    .map(Some)
}

/// A decision on a held tool call.
pub(super) struct Decision<'a> {
    pub session_id: &'a str,
    pub tool_call_id: &'a str,
    pub approve: bool,
    pub reason: Option<&'a str>,
    /// Edited arguments of an approval, as a JSON text.
    pub arguments: Option<&'a str>,
}

/// Record the decision (first one wins) and wake a session awaiting approval. The caller
/// commits only what was recorded.
pub(super) async fn decide(
    conn: &mut SqliteConnection,
    d: &Decision<'_>,
    now: i64,
) -> Result<ApprovalRecorded> {
    let row: Option<(String, String, String, bool)> =
        sqlx::query_as("SELECT root_id, queue, status, capped FROM sessions WHERE id = $1")
            .bind(d.session_id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((root_id, queue, old, capped)) = row else {
        return Ok(ApprovalRecorded::NotFound);
    };
    let old = parse_status(&old)?;
    if old.is_terminal() {
        return Ok(approval_recorded(queue, old, false, false, false));
    }
    let inserted = sqlx::query(
        "INSERT INTO approvals (root_id, session_id, tool_call_id, approve, reason, \
             decided_at, arguments) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
    )
    .bind(&root_id)
    .bind(d.session_id)
    .bind(escape_text(d.tool_call_id).as_ref())
    .bind(d.approve)
    .bind(escape_opt(d.reason).as_deref())
    .bind(now)
    .bind(escape_opt(d.arguments).as_deref())
    .execute(&mut *conn)
    .await?
    .rows_affected()
        > 0;
    let woken = inserted && old == SessionStatus::AwaitingApproval;
    if inserted {
        sqlx::query(
            "UPDATE sessions SET wake_seq = wake_seq + 1, \
                 status = CASE WHEN $3 THEN 'queued' ELSE status END, \
                 enqueued_at = CASE WHEN $3 THEN NULL ELSE enqueued_at END, \
                 held = CASE WHEN $3 THEN capped ELSE held END, \
                 updated_at = $4 \
             WHERE root_id = $1 AND id = $2",
        )
        .bind(&root_id)
        .bind(d.session_id)
        .bind(woken)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(approval_recorded(queue, old, inserted, woken, capped))
}
