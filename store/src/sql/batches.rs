//! What both stores run for batches (`BatchStore`): the statements, written once in
//! Postgres' text and rendered for each dialect as [`super::statements`] renders its own,
//! the rows they read and the reads both make alike. A batch's sessions are found by
//! their `batch_id` (the partial index `sessions_batch_idx`): its tally and its outcomes
//! read the sessions, never a counter kept beside them.

use std::sync::LazyLock;

use serde_json::{Map, Value};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use agentq_agent::schema::Usage;

use crate::batch::{BatchOutcome, BatchRow, BatchTally};
use crate::error::Result;
use crate::rowconv::{parse_exit, parse_status, to_u32, to_u64};

use super::escape::{Doc, Text};
use super::record::Stamp;
use super::statements::{Dialect, Shared};

/// The columns of `batches`, as [`BatchRecord`] reads them.
const BATCH_FIELDS: &str = "id, tenant, metadata, max_running, items, created_at, cancelled_at";

/// `$3`: the metadata's stored JSON text; a new batch counts no session yet (the
/// creation sets `items` once they are in).
const INSERT_BATCH: Shared = Shared {
    text: "INSERT INTO batches (id, tenant, metadata, max_running, items, created_at) \
           VALUES ($1, $2, $3::json, $4, 0, now())",
    sqlite_now: Some(5),
};

const SET_ITEMS: Shared = Shared {
    text: "UPDATE batches SET items = $2 WHERE id = $1",
    sqlite_now: None,
};

const SELECT_BATCH: Shared = Shared {
    text: "SELECT id, tenant, metadata, max_running, items, created_at, cancelled_at \
           FROM batches WHERE id = $1",
    sqlite_now: None,
};

/// The session that holds an idempotency key (why an item with it was not inserted).
const KEY_OWNER: Shared = Shared {
    text: "SELECT id FROM sessions WHERE tenant = $1 AND idempotency_key = $2",
    sqlite_now: None,
};

/// The sessions of the batches `$1`, grouped. The sums are cast back to `bigint`
/// (Postgres sums a `bigint` as `numeric`).
const TALLY: Shared = Shared {
    text: "SELECT batch_id, status, finish_reason, model_used, count(*) AS sessions, \
                  sum(input_tokens)::bigint AS input_tokens, \
                  sum(output_tokens)::bigint AS output_tokens, \
                  sum(cache_read_tokens)::bigint AS cache_read_tokens, \
                  sum(cache_write_tokens)::bigint AS cache_write_tokens, \
                  sum(reasoning_tokens)::bigint AS reasoning_tokens, \
                  sum(web_search_requests)::bigint AS web_search_requests, \
                  min(started_at) AS first_started, max(finished_at) AS last_finished \
           FROM sessions WHERE batch_id = ANY($1) \
           GROUP BY batch_id, status, finish_reason, model_used",
    sqlite_now: None,
};

/// A batch's sessions in id order after `$2` (`''` sorts before every id), at most `$3`.
const OUTCOMES: Shared = Shared {
    text: "SELECT id, custom_id, status, finish_reason, result, error, input_tokens, \
                  output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, \
                  web_search_requests, model_used \
           FROM sessions WHERE batch_id = $1 AND id > $2 ORDER BY id LIMIT $3",
    sqlite_now: None,
};

const MARK_CANCELLED: Shared = Shared {
    text: "UPDATE batches SET cancelled_at = COALESCE(cancelled_at, now()) WHERE id = $1",
    sqlite_now: Some(2),
};

/// Up to `$2` of the batch's sessions that are queued and never started, cancelled as
/// the one-session cancel cancels a queued one. Never started: no run, so no sub-agent
/// to cascade to and nothing for a worker to stop. The condition is repeated outside the
/// subquery so that a row claimed meanwhile is left to the caller's one-by-one cancel.
const CANCEL_QUEUED: Shared = Shared {
    text: "
UPDATE sessions SET
    status = 'cancelled',
    finish_reason = 'interrupted',
    finished_at = now(),
    lease_owner = NULL,
    lease_expires_at = NULL,
    cancel_requested = true,
    updated_at = now()
WHERE id IN (SELECT id FROM sessions
             WHERE batch_id = $1 AND status = 'queued' AND started_at IS NULL
             ORDER BY id LIMIT $2)
  AND status = 'queued' AND started_at IS NULL
RETURNING COLS",
    sqlite_now: Some(3),
};

/// The batch statements, rendered for one dialect.
pub(crate) struct BatchStatements {
    pub insert_batch: String,
    pub set_items: String,
    pub select_batch: String,
    pub key_owner: String,
    pub tally: String,
    pub outcomes: String,
    pub mark_cancelled: String,
    pub cancel_queued: String,
}

impl BatchStatements {
    fn new(d: Dialect) -> Self {
        BatchStatements {
            insert_batch: INSERT_BATCH.render(d),
            set_items: SET_ITEMS.render(d),
            select_batch: SELECT_BATCH.render(d),
            key_owner: KEY_OWNER.render(d),
            tally: TALLY.render(d),
            outcomes: OUTCOMES.render(d),
            mark_cancelled: MARK_CANCELLED.render(d),
            cancel_queued: CANCEL_QUEUED.render(d),
        }
    }
}

pub(crate) static POSTGRES: LazyLock<BatchStatements> =
    LazyLock::new(|| BatchStatements::new(Dialect::Postgres));
pub(crate) static SQLITE: LazyLock<BatchStatements> =
    LazyLock::new(|| BatchStatements::new(Dialect::Sqlite));

/// A `batches` row.
#[derive(Debug, FromRow)]
pub(crate) struct BatchRecord {
    id: String,
    tenant: String,
    metadata: Doc<Map<String, Value>>,
    max_running: Option<i32>,
    items: i64,
    created_at: Stamp,
    cancelled_at: Option<Stamp>,
}

impl BatchRecord {
    fn into_row(self) -> Result<BatchRow> {
        Ok(BatchRow {
            max_running: self
                .max_running
                .map(|n| to_u32(n, "max_running"))
                .transpose()?,
            items: to_u64(self.items, "items")?,
            id: self.id,
            tenant: self.tenant,
            metadata: self.metadata.0,
            created_at: self.created_at.0,
            cancelled_at: self.cancelled_at.map(|s| s.0),
        })
    }
}

/// The usage columns of a session (or their sums), by their names.
#[derive(Debug, FromRow)]
struct Tokens {
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    reasoning_tokens: i64,
    web_search_requests: i64,
}

impl Tokens {
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
}

/// A group of [`TALLY`].
#[derive(Debug, FromRow)]
pub(crate) struct TallyRecord {
    batch_id: String,
    status: String,
    finish_reason: Option<String>,
    model_used: Option<String>,
    sessions: i64,
    #[sqlx(flatten)]
    tokens: Tokens,
    first_started: Option<Stamp>,
    last_finished: Option<Stamp>,
}

impl TallyRecord {
    fn into_tally(self) -> Result<BatchTally> {
        Ok(BatchTally {
            status: parse_status(&self.status)?,
            finish_reason: self.finish_reason.as_deref().map(parse_exit).transpose()?,
            sessions: to_u64(self.sessions, "count")?,
            usage: self.tokens.usage()?,
            batch_id: self.batch_id,
            model: self.model_used,
            first_started: self.first_started.map(|s| s.0),
            last_finished: self.last_finished.map(|s| s.0),
        })
    }
}

/// A row of [`OUTCOMES`].
#[derive(Debug, FromRow)]
pub(crate) struct OutcomeRecord {
    id: String,
    custom_id: Option<String>,
    status: String,
    finish_reason: Option<String>,
    result: Option<Text>,
    error: Option<Text>,
    #[sqlx(flatten)]
    tokens: Tokens,
    model_used: Option<String>,
}

impl OutcomeRecord {
    fn into_outcome(self) -> Result<BatchOutcome> {
        Ok(BatchOutcome {
            status: parse_status(&self.status)?,
            finish_reason: self.finish_reason.as_deref().map(parse_exit).transpose()?,
            usage: self.tokens.usage()?,
            id: self.id,
            custom_id: self.custom_id,
            result: self.result.map(Text::into_inner),
            error: self.error.map(Text::into_inner),
            model: self.model_used,
        })
    }
}

/// The batch `id`, if it exists.
pub(crate) async fn batch<DB>(
    pool: &Pool<DB>,
    sql: &BatchStatements,
    id: &str,
) -> Result<Option<BatchRow>>
where
    DB: Database,
    for<'r> BatchRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    sqlx::query_as::<DB, BatchRecord>(&sql.select_batch)
        .bind(id)
        .fetch_optional(pool)
        .await?
        .map(BatchRecord::into_row)
        .transpose()
}

/// The listing of batches newest first, of `tenant` (or all), after `cursor`, at most
/// `limit` ([`BatchRecord`]s: see [`rows`]). Built per shape, so that each uses its index
/// (`batches_tenant_idx`, or the key).
pub(crate) fn list<'a, DB: Database>(
    tenant: Option<&'a str>,
    cursor: Option<&'a str>,
    limit: u32,
) -> QueryBuilder<'a, DB>
where
    DB::Arguments<'a>: Default,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
{
    let mut qb = QueryBuilder::new(format!("SELECT {BATCH_FIELDS} FROM batches WHERE true"));
    if let Some(t) = tenant {
        qb.push(" AND tenant = ").push_bind(t);
    }
    if let Some(c) = cursor {
        qb.push(" AND id < ").push_bind(c);
    }
    qb.push(" ORDER BY id DESC LIMIT ")
        .push_bind(i64::from(limit));
    qb
}

/// The batches of a listing's records.
pub(crate) fn rows(records: Vec<BatchRecord>) -> Result<Vec<BatchRow>> {
    records.into_iter().map(BatchRecord::into_row).collect()
}

/// The tally of the batches whose ids `ids` binds (an array on Postgres, a JSON array on
/// SQLite).
pub(crate) async fn tally<DB, P>(
    pool: &Pool<DB>,
    sql: &BatchStatements,
    ids: P,
) -> Result<Vec<BatchTally>>
where
    DB: Database,
    for<'r> TallyRecord: FromRow<'r, DB::Row>,
    for<'q> P: Encode<'q, DB> + Type<DB> + Send + 'q,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<TallyRecord> = sqlx::query_as::<DB, TallyRecord>(&sql.tally)
        .bind(ids)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(TallyRecord::into_tally).collect()
}

/// [`crate::BatchStore::batch_outcomes`].
pub(crate) async fn outcomes<DB>(
    pool: &Pool<DB>,
    sql: &BatchStatements,
    id: &str,
    after: Option<&str>,
    limit: u32,
) -> Result<Vec<BatchOutcome>>
where
    DB: Database,
    for<'r> OutcomeRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<OutcomeRecord> = sqlx::query_as::<DB, OutcomeRecord>(&sql.outcomes)
        .bind(id)
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(OutcomeRecord::into_outcome).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_batch_statement_renders_for_both() {
        for (d, s) in [(Dialect::Postgres, &*POSTGRES), (Dialect::Sqlite, &*SQLITE)] {
            for sql in [
                &s.insert_batch,
                &s.set_items,
                &s.select_batch,
                &s.key_owner,
                &s.tally,
                &s.outcomes,
                &s.mark_cancelled,
                &s.cancel_queued,
            ] {
                assert!(!sql.contains("COLS"), "{sql}");
                if d == Dialect::Sqlite {
                    assert!(!sql.contains("::"), "a cast left for SQLite: {sql}");
                    assert!(!sql.contains("now()"), "SQLite binds now: {sql}");
                    assert!(!sql.contains("ANY("), "{sql}");
                }
            }
        }
        assert!(
            SQLITE
                .tally
                .contains("IN (SELECT value FROM json_each($1))")
        );
        assert!(SQLITE.cancel_queued.contains("finished_at = $3"));
    }
}
