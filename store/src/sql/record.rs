//! The rows both stores read, decoded by one `FromRow` for either database, and their
//! mapping to the model. Column types differ between the dialects only in timestamps
//! (`timestamptz` on Postgres, INTEGER unix microseconds on SQLite), which [`Stamp`]
//! reads from either; every integer column has the same width on both, and SQLite's
//! decoder range-checks it. Text and JSON that a caller or a model wrote are decoded by
//! the stores' escaping rule ([`Text`], [`Doc`]; see [`super::escape`]).

use chrono::{DateTime, Utc};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgTypeInfo, PgValueRef, Postgres};
use sqlx::sqlite::{Sqlite, SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Type};

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;

use crate::auth::{ApiKey, Scope};
use crate::error::Result;
use crate::model::{InboxItem, Lease, SessionRow, SessionStatus};
use crate::rowconv::{bad_data, parse_exit, parse_phase, parse_status, to_u32, to_u64};
use crate::wait::WaitReason;

use super::escape::{Doc, Text};

/// A stored point in time, as either database keeps it. Also read from the JSON of a row
/// (Postgres' `to_json`), where it is an RFC 3339 string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub(crate) struct Stamp(pub DateTime<Utc>);

impl Type<Postgres> for Stamp {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <DateTime<Utc> as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Stamp {
    fn decode(value: PgValueRef<'r>) -> std::result::Result<Self, BoxDynError> {
        Ok(Stamp(<DateTime<Utc> as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for Stamp {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }

    fn compatible(ty: &SqliteTypeInfo) -> bool {
        <i64 as Type<Sqlite>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Sqlite> for Stamp {
    fn decode(value: SqliteValueRef<'r>) -> std::result::Result<Self, BoxDynError> {
        let us = <i64 as Decode<Sqlite>>::decode(value)?;
        DateTime::from_timestamp_micros(us)
            .map(Stamp)
            .ok_or_else(|| format!("{us} is not a time in unix microseconds").into())
    }
}

fn time(s: Option<Stamp>) -> Option<DateTime<Utc>> {
    s.map(|s| s.0)
}

/// An `api_keys` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KeyRecord {
    pub id: String,
    pub tenant: String,
    pub scopes: String,
    pub label: Option<String>,
    pub secret_hash: String,
    pub created_at: Stamp,
    pub expires_at: Option<Stamp>,
    pub revoked_at: Option<Stamp>,
}

impl KeyRecord {
    pub fn into_key(self) -> Result<ApiKey> {
        Ok(ApiKey {
            scopes: Scope::parse_list(&self.scopes)
                .map_err(|_| bad_data(format!("api key {}: scopes {:?}", self.id, self.scopes)))?,
            id: self.id,
            tenant: self.tenant,
            label: self.label,
            secret_hash: self.secret_hash,
            created_at: self.created_at.0,
            expires_at: time(self.expires_at),
            revoked_at: time(self.revoked_at),
        })
    }
}

/// A stored message: its seq and its body.
pub(crate) type StoredMessage = (i32, Doc<Message>);

/// A `sessions` row as stored (with its spec from `session_specs`), including the loop
/// scalars `SessionRow` does not carry. Read by column ([`super::statements::COLS`]), or
/// from the row's JSON where a Postgres statement returns it whole.
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct SessionRecord {
    pub id: String,
    pub root_id: String,
    pub parent_id: Option<String>,
    pub depth: i32,
    pub queue: String,
    pub status: String,
    pub finish_reason: Option<String>,
    pub spec: Doc<SessionSpec>,
    pub iteration: i32,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub reasoning_tokens: i64,
    /// Absent from rows a statement returns as JSON before migration 0018.
    #[serde(default)]
    pub web_search_requests: i64,
    pub drain_rounds: i32,
    pub free_iteration: bool,
    pub phase: String,
    pub started_at: Option<Stamp>,
    pub result: Option<Text>,
    pub error: Option<Text>,
    pub lease_owner: Option<String>,
    pub lease_epoch: i64,
    pub lease_expires_at: Option<Stamp>,
    pub attempts: i32,
    /// Absent from rows a statement returns as JSON before migration 0015.
    #[serde(default)]
    pub takeovers: i32,
    /// Absent from rows a statement returns as JSON before migration 0017.
    #[serde(default)]
    pub model_used: Option<String>,
    pub cancel_requested: bool,
    pub idempotency_key: Option<String>,
    pub idempotency_hash: Option<String>,
    pub tenant: String,
    pub created_at: Stamp,
    pub updated_at: Stamp,
    pub finished_at: Option<Stamp>,
    pub turn_base: i32,
    pub not_started: Doc<Vec<String>>,
    pub wake_seq: i64,
    pub approval_deadline: Option<Stamp>,
    pub bg_cursor: i64,
    pub msg_cursor: i64,
    pub followup_cursor: i64,
    /// The history's length as the last write left it; `None` on rows written before the
    /// column existed, whose length is only known from their stored messages.
    pub history_len: Option<i32>,
    #[serde(default)]
    pub wait_reason: Option<String>,
    #[serde(default)]
    pub wake_at: Option<Stamp>,
    pub priority: i32,
    pub batch_id: Option<String>,
    pub retries: i32,
    pub held: bool,
    pub capped: bool,
    /// A fork's origin and how many of its messages the fork's history starts with (both
    /// `None` on every other session; absent from rows before migration 0023).
    #[sqlx(default)]
    #[serde(default)]
    pub forked_from: Option<String>,
    #[sqlx(default)]
    #[serde(default)]
    pub fork_at: Option<i32>,
    /// Returned by a claim only (see [`SessionRow::has_workspace`]).
    #[sqlx(default)]
    #[serde(default)]
    pub has_workspace: bool,
}

impl SessionRecord {
    fn usage(&self) -> Result<Usage> {
        Ok(Usage {
            input_tokens: to_u64(self.input_tokens, "input_tokens")?,
            output_tokens: to_u64(self.output_tokens, "output_tokens")?,
            cache_read_tokens: to_u64(self.cache_read_tokens, "cache_read_tokens")?,
            cache_write_tokens: to_u64(self.cache_write_tokens, "cache_write_tokens")?,
            reasoning_tokens: to_u64(self.reasoning_tokens, "reasoning_tokens")?,
            web_search_requests: to_u64(self.web_search_requests, "web_search_requests")?,
        })
    }

    pub fn status(&self) -> Result<SessionStatus> {
        parse_status(&self.status)
    }

    pub fn into_row(self) -> Result<SessionRow> {
        Ok(SessionRow {
            status: self.status()?,
            finish_reason: self.finish_reason.as_deref().map(parse_exit).transpose()?,
            depth: to_u32(self.depth, "depth")?,
            iteration: to_u32(self.iteration, "iteration")?,
            usage: self.usage()?,
            attempts: to_u32(self.attempts, "attempts")?,
            takeovers: to_u32(self.takeovers, "takeovers")?,
            model_used: self.model_used,
            followup_cursor: to_u64(self.followup_cursor, "followup_cursor")?,
            id: self.id,
            root_id: self.root_id,
            parent_id: self.parent_id,
            queue: self.queue,
            spec: self.spec.0,
            result: self.result.map(Text::into_inner),
            error: self.error.map(Text::into_inner),
            lease_owner: self.lease_owner,
            lease_epoch: self.lease_epoch,
            lease_expires_at: time(self.lease_expires_at),
            cancel_requested: self.cancel_requested,
            idempotency_key: self.idempotency_key,
            idempotency_hash: self.idempotency_hash,
            tenant: self.tenant,
            created_at: self.created_at.0,
            updated_at: self.updated_at.0,
            finished_at: time(self.finished_at),
            wake_seq: self.wake_seq,
            approval_deadline: time(self.approval_deadline),
            held_calls: self.not_started.0,
            // A name this build does not know (a newer one wrote it) shows as no reason
            // rather than failing every read of the row.
            wait_reason: self.wait_reason.as_deref().and_then(WaitReason::parse),
            wake_at: time(self.wake_at),
            priority: u8::try_from(self.priority)
                .map_err(|_| bad_data(format!("priority {} out of range", self.priority)))?,
            batch_id: self.batch_id,
            retries: to_u32(self.retries, "retries")?,
            held: self.held,
            capped: self.capped,
            has_workspace: self.has_workspace,
            fork_at: self.fork_at.map(|n| to_u32(n, "fork_at")).transpose()?,
            forked_from: self.forked_from,
        })
    }

    /// Whether a claim must read `messages`: every write that stores messages sets
    /// `history_len` with them, so a history of the prompt alone has nothing stored; a row
    /// from before the column may have anything.
    pub fn has_stored_history(&self) -> bool {
        self.history_len.is_none_or(|n| n > 1)
    }

    /// The lease a claim of this row gave `owner`.
    pub fn lease(&self, owner: &str) -> Lease {
        Lease {
            session_id: self.id.clone(),
            root_id: self.root_id.clone(),
            owner: owner.to_string(),
            epoch: self.lease_epoch,
        }
    }

    /// The loop state to resume from: this row's scalars plus the stored history.
    pub fn state(&self, messages: Vec<StoredMessage>) -> Result<SessionState> {
        Ok(SessionState {
            session_id: self.id.clone(),
            spec: self.spec.0.clone(),
            messages: history(&self.spec.0.prompt, messages),
            iteration: to_u32(self.iteration, "iteration")?,
            usage: self.usage()?,
            drain_rounds: to_u32(self.drain_rounds, "drain_rounds")?,
            free_iteration: self.free_iteration,
            phase: parse_phase(&self.phase)?,
            started_at: time(self.started_at),
            outcome: None,
            not_started: self.not_started.0.clone(),
            turn_base: to_u32(self.turn_base, "turn_base")?,
            bg_cursor: to_u64(self.bg_cursor, "bg_cursor")?,
            msg_cursor: to_u64(self.msg_cursor, "msg_cursor")?,
        })
    }
}

/// Message 0 of every history is the user's prompt (`SessionState::new`), which the spec
/// holds, so it is not stored; rows written before that rule keep a stored copy as seq 0,
/// and both read back the same. Message i has seq i.
pub(crate) fn history(prompt: &str, stored: Vec<StoredMessage>) -> Vec<Message> {
    let mut history = Vec::with_capacity(stored.len() + 1);
    if stored.first().is_none_or(|(seq, _)| *seq != 0) {
        history.push(Message::user(prompt));
    }
    history.extend(stored.into_iter().map(|(_, m)| m.0));
    history
}

/// The rows of a session's history listing: each stored message (one row with a NULL seq
/// and body when only the prompt is there), the first with the spec that holds the
/// prompt. No row: no such session.
pub(crate) type HistoryRow = (Option<Doc<Prompt>>, Option<i32>, Option<Doc<Message>>);

/// The prompt of a stored spec (the rest of it is not read).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Prompt {
    #[serde(default)]
    prompt: String,
}

/// The history from its listing; `None` when the session does not exist.
pub(crate) fn history_of(rows: Vec<HistoryRow>) -> Option<Vec<Message>> {
    let prompt = rows
        .first()?
        .0
        .as_ref()
        .map(|spec| spec.0.prompt.clone())
        .unwrap_or_default();
    let stored = rows
        .into_iter()
        .filter_map(|(_, seq, body)| seq.zip(body))
        .collect();
    Some(history(&prompt, stored))
}

/// A row of the pending-approvals read: a message (seq and body) of the latest response
/// on, or (no seq) the id of a held call that has a decision.
pub(crate) type PendingRow = (Option<i32>, Option<Doc<Message>>, Option<Text>);

/// An `inbox` row.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct InboxRecord {
    pub seq: i64,
    pub kind: String,
    pub payload: Doc<serde_json::Value>,
    pub created_at: Stamp,
}

impl InboxRecord {
    pub fn into_item(self) -> Result<InboxItem> {
        Ok(InboxItem {
            seq: to_u64(self.seq, "seq")?,
            kind: self.kind,
            payload: self.payload.0,
            created_at: self.created_at.0,
        })
    }
}
