//! The statements both stores run, each written once in Postgres' text and rendered for
//! each dialect when first used. SQLite reads `$n` parameters by number as Postgres does,
//! so the texts differ only where the dialects do, and [`sqlite`] rewrites exactly that:
//!
//! - the clock: SQLite's store takes "now" from Rust and binds it (so a state read back
//!   compares equal on both backends, at microsecond precision), so `now()` becomes the
//!   parameter each statement names, and `now() ± make_interval(secs => $n)` becomes `$n`,
//!   which SQLite's store binds as the point in time itself;
//! - lists: Postgres binds an array (`= ANY($n)`), SQLite a JSON array
//!   (`IN (SELECT value FROM json_each($n))`), having no array type;
//! - casts (`::uuid`, `::json`, `::text[]`): Postgres needs them where it stores ids as
//!   `uuid` and bodies as `json`; SQLite stores both as text and has no `::` cast;
//! - `GREATEST(a, b)` is SQLite's two-argument `max(a, b)`.
//!
//! Statements that only one dialect can express (Postgres' array-driven batches, SQLite's
//! per-row steps inside one write transaction) stay with their store.

#[path = "claims.rs"]
mod claims;
#[path = "liveness.rs"]
mod liveness;

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, QueryBuilder, Type};

use super::escape::escape_text;
use crate::model::ListFilter;
use crate::wait::WaitReason;

/// Every column [`super::record::SessionRecord`] reads, for `SELECT`/`RETURNING` lists on
/// `sessions` (not aliased): the row's own, and its spec from `session_specs`.
pub(crate) const COLS: &str = "id, root_id, parent_id, depth, queue, status, finish_reason, \
    (SELECT p.spec FROM session_specs p WHERE p.root_id = sessions.root_id \
       AND p.id = sessions.id) AS spec, \
    iteration, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
    reasoning_tokens, web_search_requests, drain_rounds, free_iteration, phase, started_at, result, error, \
    lease_owner, lease_epoch, lease_expires_at, attempts, takeovers, model_used, cancel_requested, \
    idempotency_key, idempotency_hash, tenant, created_at, updated_at, finished_at, turn_base, not_started, \
    wake_seq, approval_deadline, bg_cursor, msg_cursor, followup_cursor, history_len, \
    wait_reason, wake_at, priority, batch_id, retries, held, capped, forked_from, fork_at";

/// `list` without a limit gets this many rows; no request gets more than `MAX_LIST`.
const DEFAULT_LIST: u32 = 100;
const MAX_LIST: u32 = 10_000;

/// The listing for `filter`, newest first (or oldest first). Built per filter rather
/// than as `($1 IS NULL OR …)`, so that each shape gets a plan that uses its index.
/// `dialect` says how a time is bound: Postgres compares `timestamptz`, SQLite the
/// microseconds it stores.
pub(crate) fn list<'a, DB: Database>(
    filter: &'a ListFilter,
    dialect: Dialect,
) -> QueryBuilder<'a, DB>
where
    DB::Arguments<'a>: Default,
    &'a str: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    let limit = list_limit(filter.limit);
    let mut qb = QueryBuilder::new(format!("SELECT {COLS} FROM sessions WHERE true"));
    push_conditions(&mut qb, filter, dialect);
    let (after, order) = if filter.oldest_first {
        (" AND id > ", " ORDER BY id ASC LIMIT ")
    } else {
        (" AND id < ", " ORDER BY id DESC LIMIT ")
    };
    if let Some(cursor) = &filter.cursor {
        qb.push(after).push_bind(cursor.as_str());
    }
    qb.push(order).push_bind(i64::from(limit));
    qb
}

/// The conditions of `filter` (all but its cursor), each ` AND …`.
pub(super) fn push_conditions<'a, DB: Database>(
    qb: &mut QueryBuilder<'a, DB>,
    filter: &'a ListFilter,
    dialect: Dialect,
) where
    &'a str: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    if let Some(tenant) = &filter.tenant {
        qb.push(" AND tenant = ").push_bind(tenant.as_str());
    }
    if let Some(status) = filter.status {
        qb.push(" AND status = ").push_bind(status.as_str());
    }
    if let Some(parent) = &filter.parent_id {
        qb.push(" AND parent_id = ").push_bind(parent.as_str());
    }
    if let Some(batch) = &filter.batch_id {
        qb.push(" AND batch_id = ").push_bind(batch.as_str());
    }
    if let Some(reason) = filter.finish_reason {
        qb.push(" AND finish_reason = ").push_bind(reason.as_str());
    }
    if let Some(reason) = filter.wait_reason {
        // As the API shows a reason: from the status first (a row's reason is stale once
        // it runs again), and a waiting row stored without one waits for its children.
        match reason {
            WaitReason::Approval => qb.push(" AND status = 'awaiting_approval'"),
            WaitReason::Children => qb.push(
                " AND status = 'waiting' AND (wait_reason IS NULL OR wait_reason = 'children')",
            ),
            other => qb
                .push(" AND status = 'waiting' AND wait_reason = ")
                .push_bind(other.as_str()),
        };
    }
    if let Some(queue) = &filter.queue {
        qb.push(" AND queue = ").push_bind(queue.as_str());
    }
    for (op, at) in [(">=", filter.created_after), ("<", filter.created_before)] {
        if let Some(at) = at {
            qb.push(format!(" AND created_at {op} "));
            match dialect {
                Dialect::Postgres => qb.push_bind(at),
                Dialect::Sqlite => qb.push_bind(at.timestamp_micros()),
            };
        }
    }
    if let Some(text) = &filter.text {
        // The prompt as stored (escaped: see `escape`), matched literally: the caller's
        // `%`, `_` and `\` are escaped for LIKE.
        let text = like_literal(&escape_text(text));
        // SQLite's LIKE ignores the case of ASCII letters; Postgres needs ILIKE.
        let (prompt, like) = match dialect {
            Dialect::Postgres => ("p.spec->>'prompt'", "ILIKE"),
            Dialect::Sqlite => ("json_extract(p.spec, '$.prompt')", "LIKE"),
        };
        qb.push(" AND (id LIKE ")
            .push_bind(format!("{text}%"))
            .push(format!(
                " ESCAPE '\\' OR EXISTS (SELECT 1 FROM session_specs p \
                 WHERE p.root_id = sessions.root_id AND p.id = sessions.id \
                 AND {prompt} {like} "
            ))
            .push_bind(format!("%{text}%"))
            .push(" ESCAPE '\\'))");
    }
}

/// `s` as a LIKE pattern that matches exactly `s` (with `\` as the escape character).
pub(crate) fn like_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The applied migrations, as both stores read them.
pub(crate) const APPLIED_MIGRATIONS: &str =
    "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";

/// Sessions per unfinished status, as both stores count them.
pub(crate) const COUNT_UNFINISHED: &str = "SELECT status, count(*) FROM sessions \
     WHERE status IN ('queued', 'running', 'waiting', 'awaiting_approval') \
     GROUP BY status";

/// A statement of both stores: Postgres' text (`COLS` stands for [`COLS`]) and which
/// parameter SQLite's store binds "now" to, if the statement reads the clock.
pub(crate) struct Shared {
    pub(crate) text: &'static str,
    pub(crate) sqlite_now: Option<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

impl Shared {
    pub(crate) fn render(&self, dialect: Dialect) -> String {
        let text = self
            .text
            .replace("CLAIM_SET", claims::CLAIM_SET)
            .replace("CLAIM_RUNNABLE", claims::CLAIM_RUNNABLE)
            .replace("CLAIMED", claims::CLAIMED)
            .replace("KEY_FIELDS", KEY_FIELDS)
            .replace("COLS", COLS)
            .replace("LEASE_DEAD", LEASE_DEAD);
        match dialect {
            Dialect::Postgres => text,
            Dialect::Sqlite => sqlite(&text, self.sqlite_now),
        }
    }
}

/// A running session's lease is dead (a condition on a `sessions` row, with `now()`): the
/// session's own expiry is behind (set at the claim; a worker's heartbeat no longer
/// renews it) and its owner has no live row in `workers`. A live worker renews one row
/// per heartbeat for all its sessions; a claim not yet covered by a heartbeat, and a
/// worker from before the `workers` table, are covered by the session's own expiry.
pub(crate) const LEASE_DEAD: &str = "sessions.lease_expires_at < now() \
    AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = sessions.lease_owner \
                    AND w.expires_at >= now())";

const SELECT_SESSION: Shared = Shared {
    text: "SELECT COLS FROM sessions WHERE id = $1",
    sqlite_now: None,
};

/// The stored history a claim resumes from.
const CLAIM_HISTORY: Shared = Shared {
    text: "SELECT seq, body FROM messages \
           WHERE root_id = $1::uuid AND session_id = $2::uuid ORDER BY seq",
    sqlite_now: None,
};

/// A session's history for reading (see `super::chain`).
const HISTORY: Shared = Shared {
    text: super::chain::HISTORY,
    sqlite_now: None,
};

/// Cancel in one race-free statement: queued or suspended → cancelled now; running → the
/// flag for its owner. Terminal rows do not match. (SET expressions all see the old row.)
const CANCEL: Shared = Shared {
    text: "
UPDATE sessions SET
    status = CASE WHEN status = 'running' THEN status ELSE 'cancelled' END,
    finish_reason = CASE WHEN status = 'running' THEN finish_reason ELSE 'interrupted' END,
    finished_at = CASE WHEN status = 'running' THEN finished_at ELSE now() END,
    lease_owner = CASE WHEN status = 'running' THEN lease_owner ELSE NULL END,
    lease_expires_at = CASE WHEN status = 'running' THEN lease_expires_at ELSE NULL END,
    cancel_requested = true,
    updated_at = now()
WHERE id = $1 AND status IN ('queued', 'running', 'waiting', 'awaiting_approval')
RETURNING COLS",
    sqlite_now: Some(2),
};

/// Fenced suspension. A wake that arrived after the claim (`wake_seq > $5`) sends the
/// session back to the queue; a cancel request cancels it. Every waker bumps `wake_seq`
/// under the session's row lock (Postgres) or in its own write transaction, which SQLite
/// serializes with this one, so no wake-up can fall between the check and the sleep.
const SUSPEND: Shared = Shared {
    text: "
UPDATE sessions SET
    status = CASE WHEN cancel_requested THEN 'cancelled'
                  WHEN wake_seq > $5 THEN 'queued' ELSE $4 END,
    finish_reason = CASE WHEN cancel_requested THEN 'interrupted' ELSE finish_reason END,
    finished_at = CASE WHEN cancel_requested THEN now() ELSE finished_at END,
    enqueued_at = CASE WHEN wake_seq > $5 AND NOT cancel_requested THEN NULL ELSE enqueued_at END,
    approval_deadline = $6,
    wait_reason = CASE WHEN cancel_requested OR wake_seq > $5 THEN NULL ELSE $8::text END,
    wake_at = CASE WHEN cancel_requested OR wake_seq > $5 THEN NULL ELSE $9::timestamptz END,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = 0,
    updated_at = now()
WHERE root_id = $1 AND id = $2 AND lease_epoch = $3 AND lease_owner = $7 AND status = 'running'
RETURNING COLS",
    sqlite_now: Some(10),
};

/// Give a running session back (graceful shutdown), fenced by the lease. Its entry is
/// forgotten: the caller adds a new one, or, if it cannot, the sweeper does. The claim
/// that took it no longer counts as an attempt (a give-back is not a crash), but the
/// claims before it that died still do: a session given back after its claims ran out
/// (its dead letter not written) is exhausted again at its next claim.
const RELEASE: Shared = Shared {
    text: "UPDATE sessions SET status = 'queued', lease_owner = NULL, \
               lease_expires_at = NULL, \
               attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, \
               enqueued_at = NULL, updated_at = now() \
           WHERE root_id = $1 AND id = $2 AND lease_epoch = $3 AND lease_owner = $4 \
             AND status = 'running'",
    sqlite_now: Some(5),
};

/// The lease of a session, read after a fenced write matched nothing.
const LEASE_OF: Shared = Shared {
    text: "SELECT lease_epoch, lease_owner, status FROM sessions WHERE root_id = $1 AND id = $2",
    sqlite_now: None,
};

/// Fail a session from outside a run (dead letter); a finished one is left as it is.
const FAIL: Shared = Shared {
    text: "UPDATE sessions SET status = 'failed', finish_reason = 'error', error = $2, \
               finished_at = now(), lease_owner = NULL, lease_expires_at = NULL, \
               updated_at = now() \
           WHERE id = $1 AND status NOT IN ('completed', 'failed', 'cancelled') \
           RETURNING COLS",
    sqlite_now: Some(3),
};

/// A new turn on a finished session: queued again with a fresh per-turn allowance. With
/// `$2` (the follow-up's inbox position) not 0, only once per position: `followup_cursor`,
/// not `msg_cursor` (steering messages share the inbox's positions and are injected by
/// the run, so their cursor may be past a follow-up that has not run).
const FOLLOW_UP: Shared = Shared {
    text: "
UPDATE sessions SET
    status = 'queued', finish_reason = NULL, result = NULL, error = NULL,
    finished_at = NULL, turn_base = iteration, drain_rounds = 0,
    free_iteration = false, enqueued_at = NULL, held = capped, cancel_requested = false,
    attempts = 0,
    lease_owner = NULL, lease_expires_at = NULL, approval_deadline = NULL,
    followup_cursor = GREATEST(followup_cursor, $2),
    history_len = history_len + 1,
    updated_at = now()
WHERE id = $1 AND status IN ('completed', 'failed', 'cancelled')
  AND ($2 = 0 OR followup_cursor < $2)
RETURNING COLS",
    sqlite_now: Some(3),
};

/// The follow-up's message, right after the history (message i has seq i): `$4` is the
/// history's stored length. A row from before `history_len` has its history stored from
/// message 0, so its last seq says where; message 0 itself is always the prompt.
/// (Inside `COALESCE`, the scan for the last seq runs only for such a row: Postgres'
/// message index does not hold seqs, so it would read the session's every row.)
const FOLLOW_UP_MESSAGE: Shared = Shared {
    text: "INSERT INTO messages (root_id, session_id, seq, body) \
           VALUES ($1::uuid, $2::uuid, COALESCE($4, (SELECT max(seq) + 1 FROM messages \
                   WHERE root_id = $1::uuid AND session_id = $2::uuid), 1), $3::json)",
    sqlite_now: None,
};

/// Sessions awaiting an approval past their deadline go back to the queue.
const WAKE_EXPIRED: Shared = Shared {
    text: "UPDATE sessions SET status = 'queued', enqueued_at = NULL, held = capped, \
               wake_seq = wake_seq + 1, updated_at = now() \
           WHERE id IN (SELECT id FROM sessions WHERE status = 'awaiting_approval' \
                        AND approval_deadline < now() ORDER BY approval_deadline LIMIT $1) \
             AND status = 'awaiting_approval' \
           RETURNING id, queue, held",
    sqlite_now: Some(2),
};

/// Sessions waiting for a rate limit whose wake time has come go back to the queue, those
/// due longest first. (`wake_seq` stays: nothing arrived for them.)
const WAKE_DUE: Shared = Shared {
    text: "UPDATE sessions SET status = 'queued', enqueued_at = NULL, held = capped, \
               wait_reason = NULL, wake_at = NULL, updated_at = now() \
           WHERE id IN (SELECT id FROM sessions WHERE status = 'waiting' \
                        AND wake_at IS NOT NULL AND wake_at <= now() ORDER BY wake_at LIMIT $1) \
             AND status = 'waiting' AND wake_at <= now() \
           RETURNING id, queue, held",
    sqlite_now: Some(2),
};

/// A tenant's sessions parked for a spent budget go back to the queue (the budget was
/// raised), longest parked first. `wake_seq` is bumped like any waker's.
const WAKE_BUDGET: Shared = Shared {
    text: "UPDATE sessions SET status = 'queued', enqueued_at = NULL, held = capped, \
               wait_reason = NULL, wake_at = NULL, wake_seq = wake_seq + 1, updated_at = now() \
           WHERE id IN (SELECT id FROM sessions WHERE tenant = $1 AND status = 'waiting' \
                        AND wait_reason = 'budget' ORDER BY updated_at LIMIT $2) \
             AND status = 'waiting' AND wait_reason = 'budget' \
           RETURNING id, queue, held",
    sqlite_now: Some(3),
};

/// Waiting and awaiting-approval sessions per wait reason, for the gauge. A row suspended
/// before reasons were stored waited for its children or for a human, as its status says.
const WAITING_BY_REASON: Shared = Shared {
    text: "SELECT CASE WHEN wait_reason IS NOT NULL THEN wait_reason \
                       WHEN status = 'awaiting_approval' THEN 'approval' \
                       ELSE 'children' END AS reason, count(*) FROM sessions \
           WHERE status IN ('waiting', 'awaiting_approval') GROUP BY 1",
    sqlite_now: None,
};

/// From the held index alone (its predicate is this one's).
const HELD_BY_QUEUE: Shared = Shared {
    text: "SELECT queue, count(*) FROM sessions WHERE held AND status = 'queued' GROUP BY queue",
    sqlite_now: None,
};

const MARK_ENQUEUED: Shared = Shared {
    text: "UPDATE sessions SET enqueued_at = now() \
           WHERE id = ANY($1) AND enqueued_at IS NULL",
    sqlite_now: Some(2),
};

const RESET_ENQUEUED: Shared = Shared {
    text: "UPDATE sessions SET enqueued_at = NULL \
           WHERE queue = $1 AND status IN ('queued', 'running') AND enqueued_at IS NOT NULL",
    sqlite_now: None,
};

/// Running sessions whose lease ran out more than `$1` seconds ago (SQLite: the cut-off
/// time) and whose owner's row in `workers` expired as long ago or is missing (a worker
/// from before that table; `liveness::REQUEUE_ORPHANS` finds the others sooner, this is the
/// sweeper's net for every queue) and whose entry was added before that lease: forget the entry, so `UNENQUEUED` finds them. An entry
/// added since the lease expired (`enqueued_at` after it) is left alone until a newer
/// lease expires, so each expiry is re-queued once.
const FORGET_EXPIRED: Shared = Shared {
    text: "UPDATE sessions SET enqueued_at = NULL \
           WHERE id IN (SELECT id FROM sessions WHERE status = 'running' \
                        AND lease_expires_at < now() - make_interval(secs => $1) \
                        AND NOT EXISTS (SELECT 1 FROM workers w \
                                        WHERE w.id = sessions.lease_owner \
                                          AND w.expires_at >= now() - make_interval(secs => $1)) \
                        AND enqueued_at IS NOT NULL AND enqueued_at < lease_expires_at \
                        ORDER BY lease_expires_at LIMIT $2) \
             AND status = 'running' AND enqueued_at IS NOT NULL",
    sqlite_now: None,
};

/// `$1`: the age in seconds (SQLite: the cut-off time).
const UNENQUEUED: Shared = Shared {
    text: "SELECT id, queue FROM sessions \
           WHERE status IN ('queued', 'running') AND enqueued_at IS NULL AND NOT held \
             AND created_at < now() - make_interval(secs => $1) \
           ORDER BY created_at LIMIT $2",
    sqlite_now: None,
};

/// Redrive: a session that failed with an error (a run's, or a dead letter's) is queued
/// again from its last checkpoint with a fresh claim allowance and no outcome. The epoch
/// moves on, so a write of any earlier holder is fenced off; a session that is not (or no
/// longer) failed is left as it is, so a repeated retry does nothing more. `$2`: held for
/// the dispatcher.
const RETRY: Shared = Shared {
    text: "
UPDATE sessions SET
    status = 'queued', finish_reason = NULL, result = NULL, error = NULL,
    finished_at = NULL, attempts = 0, cancel_requested = false,
    lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1,
    enqueued_at = NULL, held = ($2 OR capped), approval_deadline = NULL,
    retries = retries + 1, updated_at = now()
WHERE id = $1 AND status = 'failed' AND finish_reason = 'error'
RETURNING COLS",
    sqlite_now: Some(3),
};

/// What each (queue, tenant, batch) has running or in the buffer (queued, not held).
const DISPATCH_LOAD: Shared = Shared {
    text: "SELECT queue, tenant, batch_id, \
                  count(*) FILTER (WHERE status = 'running'), \
                  count(*) FILTER (WHERE status = 'queued') \
           FROM sessions WHERE status IN ('queued', 'running') AND NOT held \
           GROUP BY queue, tenant, batch_id",
    sqlite_now: None,
};

/// The held sessions of a queue, at most `$2` per (tenant, batch) group, each with its
/// rank in its group (best first: priority, then age), and at most `$3` in all.
const HELD: Shared = Shared {
    text: "SELECT id, tenant, batch_id, priority, batch_max_running, r FROM ( \
             SELECT id, tenant, batch_id, priority, batch_max_running, \
                    row_number() OVER (PARTITION BY tenant, batch_id \
                                       ORDER BY priority DESC, id) AS r \
             FROM sessions WHERE queue = $1 AND held AND status = 'queued') ranked \
           WHERE r <= $2 ORDER BY r, priority DESC, id LIMIT $3",
    sqlite_now: None,
};

/// Whether any session of a queue is held.
const ANY_HELD: Shared = Shared {
    text: "SELECT EXISTS (SELECT 1 FROM sessions WHERE queue = $1 AND held AND status = 'queued')",
    sqlite_now: None,
};

/// The same for every queue: the first entry of `sessions_held_idx`, if any.
const ANY_HELD_ANYWHERE: Shared = Shared {
    text: "SELECT EXISTS (SELECT 1 FROM sessions WHERE held AND status = 'queued')",
    sqlite_now: None,
};

/// Held sessions the dispatcher moves to the buffer: only those still held, so of two
/// dispatchers racing for one row, one gets it.
const RELEASE_HELD: Shared = Shared {
    text: "UPDATE sessions SET held = false \
           WHERE id = ANY($1) AND held AND status = 'queued' RETURNING id",
    sqlite_now: None,
};

const INBOX: Shared = Shared {
    text: "SELECT seq, kind, payload, created_at FROM inbox \
           WHERE root_id = (SELECT root_id FROM sessions WHERE id = $1) AND session_id = $1 \
             AND kind = ANY($2::text[]) AND seq > $3 ORDER BY seq",
    sqlite_now: None,
};

const APPROVAL: Shared = Shared {
    text: "SELECT approve, reason, arguments FROM approvals \
           WHERE root_id = (SELECT root_id FROM sessions WHERE id = $1) \
             AND session_id = $1 AND tool_call_id = $2",
    sqlite_now: None,
};

/// The columns of `api_keys`, as [`super::record::KeyRecord`] reads them.
const KEY_FIELDS: &str =
    "id, tenant, scopes, label, secret_hash, created_at, expires_at, revoked_at";

const INSERT_KEY: Shared = Shared {
    text: "INSERT INTO api_keys (id, tenant, scopes, label, secret_hash, created_at, expires_at) \
           VALUES ($1, $2, $3, $4, $5, now(), $6) RETURNING KEY_FIELDS",
    sqlite_now: Some(7),
};

const LIST_KEYS: Shared = Shared {
    text: "SELECT KEY_FIELDS FROM api_keys ORDER BY created_at, id",
    sqlite_now: None,
};

const REVOKE_KEY: Shared = Shared {
    text: "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1 \
           RETURNING KEY_FIELDS",
    sqlite_now: Some(2),
};

const KEY_BY_ID: Shared = Shared {
    text: "SELECT KEY_FIELDS FROM api_keys WHERE id = $1",
    sqlite_now: None,
};

/// What [`crate::InboxStore::pending_approvals`] reads, in one round trip: the session's
/// latest response and every message after it (seq, body), then the recorded decisions
/// on the held calls `$2` (a NULL seq, the call's id). The last response is found by its
/// role inside the body, so the scan reads the session's messages (no index holds their
/// seq or role); it runs only for a session holding calls.
const PENDING_APPROVALS: Shared = Shared {
    text: "SELECT m.seq, m.body, NULL::text FROM sessions s \
           JOIN messages m ON m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
           WHERE s.id = $1 AND m.seq >= (SELECT max(l.seq) FROM messages l \
                WHERE l.root_id = s.root_id::uuid AND l.session_id = s.id::uuid \
                  AND l.body->>'role' = 'assistant') \
           UNION ALL \
           SELECT NULL, NULL, a.tool_call_id FROM sessions s \
           JOIN approvals a ON a.root_id = s.root_id AND a.session_id = s.id \
           WHERE s.id = $1 AND a.tool_call_id = ANY($2)",
    sqlite_now: None,
};

const QUEUE_EXISTS: Shared = Shared {
    text: "SELECT count(*) FROM queues WHERE name = $1",
    sqlite_now: None,
};

/// Adds the queue only while fewer than `$2` are stored.
const INSERT_QUEUE: Shared = Shared {
    text: "INSERT INTO queues (name, created_at) SELECT $1, now() \
           WHERE (SELECT count(*) FROM queues) < $2",
    sqlite_now: Some(3),
};

const STORED_QUEUES: Shared = Shared {
    text: "SELECT name FROM queues ORDER BY created_at, name",
    sqlite_now: None,
};

/// The shared statements, rendered for one dialect.
pub(crate) struct Statements {
    pub select_session: String,
    pub claim: String,
    /// Postgres only (SQLite claims one session per statement).
    pub claim_batch: String,
    pub claim_history: String,
    pub history: String,
    pub cancel: String,
    pub suspend: String,
    pub release: String,
    pub lease_of: String,
    pub fail: String,
    pub follow_up: String,
    pub follow_up_message: String,
    pub wake_expired: String,
    pub wake_due: String,
    pub wake_budget: String,
    pub waiting_by_reason: String,
    pub held_by_queue: String,
    pub mark_enqueued: String,
    pub reset_enqueued: String,
    pub unenqueued: String,
    pub retry: String,
    pub dispatch_load: String,
    pub held: String,
    pub any_held: String,
    pub any_held_anywhere: String,
    pub release_held: String,
    pub forget_expired: String,
    pub beat: String,
    pub retire: String,
    pub lease_state: String,
    pub leases_of: String,
    pub ensure_worker: String,
    pub mark_announced: String,
    pub unannounced: String,
    pub requeue_orphans: String,
    pub forget_workers: String,
    pub queue_exists: String,
    pub insert_queue: String,
    pub stored_queues: String,
    pub inbox: String,
    pub approval: String,
    pub insert_key: String,
    pub list_keys: String,
    pub revoke_key: String,
    pub key_by_id: String,
    pub pending_approvals: String,
}

impl Statements {
    fn new(d: Dialect) -> Self {
        Statements {
            select_session: SELECT_SESSION.render(d),
            claim: match d {
                Dialect::Postgres => {
                    format!("{}{}", liveness::PG_ENSURE_WORKER, claims::CLAIM.render(d))
                }
                Dialect::Sqlite => claims::CLAIM.render(d),
            },
            claim_batch: format!(
                "{}, {}",
                liveness::PG_ENSURE_WORKER.trim_end(),
                claims::CLAIM_BATCH.render(d)
            ),
            claim_history: CLAIM_HISTORY.render(d),
            history: HISTORY.render(d),
            cancel: CANCEL.render(d),
            suspend: SUSPEND.render(d),
            release: RELEASE.render(d),
            lease_of: LEASE_OF.render(d),
            fail: FAIL.render(d),
            follow_up: FOLLOW_UP.render(d),
            follow_up_message: FOLLOW_UP_MESSAGE.render(d),
            wake_expired: WAKE_EXPIRED.render(d),
            wake_due: WAKE_DUE.render(d),
            wake_budget: WAKE_BUDGET.render(d),
            waiting_by_reason: WAITING_BY_REASON.render(d),
            held_by_queue: HELD_BY_QUEUE.render(d),
            mark_enqueued: MARK_ENQUEUED.render(d),
            reset_enqueued: RESET_ENQUEUED.render(d),
            unenqueued: UNENQUEUED.render(d),
            retry: RETRY.render(d),
            dispatch_load: DISPATCH_LOAD.render(d),
            held: HELD.render(d),
            any_held: ANY_HELD.render(d),
            any_held_anywhere: ANY_HELD_ANYWHERE.render(d),
            release_held: RELEASE_HELD.render(d),
            forget_expired: FORGET_EXPIRED.render(d),
            beat: liveness::BEAT.render(d),
            retire: liveness::RETIRE.render(d),
            lease_state: liveness::LEASE_STATE.render(d),
            leases_of: liveness::LEASES_OF.render(d),
            ensure_worker: liveness::ENSURE_WORKER.render(d),
            mark_announced: liveness::MARK_ANNOUNCED.render(d),
            unannounced: liveness::UNANNOUNCED.render(d),
            requeue_orphans: liveness::REQUEUE_ORPHANS.render(d),
            forget_workers: liveness::FORGET_WORKERS.render(d),
            queue_exists: QUEUE_EXISTS.render(d),
            insert_queue: INSERT_QUEUE.render(d),
            stored_queues: STORED_QUEUES.render(d),
            inbox: INBOX.render(d),
            approval: APPROVAL.render(d),
            insert_key: INSERT_KEY.render(d),
            list_keys: LIST_KEYS.render(d),
            revoke_key: REVOKE_KEY.render(d),
            key_by_id: KEY_BY_ID.render(d),
            pending_approvals: PENDING_APPROVALS.render(d),
        }
    }
}

pub(crate) static POSTGRES: LazyLock<Statements> =
    LazyLock::new(|| Statements::new(Dialect::Postgres));
pub(crate) static SQLITE: LazyLock<Statements> = LazyLock::new(|| Statements::new(Dialect::Sqlite));

/// The `$n` parameter at the start of `s`, as `(n's digits, rest)`.
fn param(s: &str) -> Option<(&str, &str)> {
    let s = s.strip_prefix('$')?;
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    (end > 0).then(|| s.split_at(end))
}

/// Replace each `<open>$n<close>` in `sql` by `f(n)`, where `close` may follow an
/// optional cast `::text[]`.
fn replace_param_call(sql: &str, open: &str, f: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find(open) {
        let after = &rest[at + open.len()..];
        let Some((n, tail)) = param(after) else {
            out.push_str(&rest[..at + open.len()]);
            rest = after;
            continue;
        };
        let tail = tail.strip_prefix("::text[]").unwrap_or(tail);
        let Some(tail) = tail.strip_prefix(')') else {
            out.push_str(&rest[..at + open.len()]);
            rest = after;
            continue;
        };
        out.push_str(&rest[..at]);
        out.push_str(&f(n));
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Drop every `::type` (and `::type[]`) cast.
fn strip_casts(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find("::") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        rest = after[end..].strip_prefix("[]").unwrap_or(&after[end..]);
    }
    out.push_str(rest);
    out
}

/// Postgres' text in SQLite's dialect (see the module docs); `now` is the parameter that
/// carries the current time.
fn sqlite(sql: &str, now: Option<u8>) -> String {
    let sql = replace_param_call(sql, "now() + make_interval(secs => ", |n| format!("${n}"));
    let sql = replace_param_call(&sql, "now() - make_interval(secs => ", |n| format!("${n}"));
    let sql = replace_param_call(&sql, "= ANY(", |n| {
        format!("IN (SELECT value FROM json_each(${n}))")
    });
    let sql = match now {
        Some(n) => sql.replace("now()", &format!("${n}")),
        None => sql,
    };
    strip_casts(&sql).replace("GREATEST(", "max(")
}

/// The page a listing returns for `limit`: 0 is the default page, and no page is longer
/// than the most a listing returns.
pub(crate) fn list_limit(limit: u32) -> u32 {
    match limit {
        0 => DEFAULT_LIST,
        l => l.min(MAX_LIST),
    }
}

#[cfg(test)]
#[path = "statements_tests.rs"]
mod tests;
