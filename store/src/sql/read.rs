//! The reads both stores make the same way, each on the pool it reads from: the same
//! statement text (see [`super::statements`]), decoded into the same rows, the same
//! answer built from them: sessions, histories, approvals, the unfinished counts, API
//! keys and queue names.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use agentq_agent::schema::Message;

use crate::auth::ApiKey;
use crate::error::{Error, Result};
use crate::model::SessionStatus;
use crate::rowconv::unfinished_counts;

use super::escape::{Text, escape_text};
use super::record::{HistoryRow, KeyRecord, SessionRecord, history_of};
use super::statements::{COUNT_UNFINISHED, Statements};

/// A session's row, if it exists.
pub(crate) async fn session<DB>(
    pool: &Pool<DB>,
    sql: &Statements,
    id: &str,
) -> Result<Option<SessionRecord>>
where
    DB: Database,
    for<'r> SessionRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    Ok(sqlx::query_as::<DB, SessionRecord>(&sql.select_session)
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

/// A session's history; `NotFound` when there is no such session.
pub(crate) async fn history<DB>(pool: &Pool<DB>, sql: &Statements, id: &str) -> Result<Vec<Message>>
where
    DB: Database,
    for<'r> HistoryRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<HistoryRow> = sqlx::query_as::<DB, HistoryRow>(&sql.history)
        .bind(id)
        .fetch_all(pool)
        .await?;
    history_of(rows).ok_or_else(|| Error::NotFound(id.to_string()))
}

/// The decision on a held call, if any: (approved, reason).
pub(crate) async fn approval<DB>(
    pool: &Pool<DB>,
    sql: &Statements,
    session_id: &str,
    tool_call_id: &str,
) -> Result<Option<(bool, Option<String>, Option<String>)>>
where
    DB: Database,
    for<'r> (bool, Option<Text>, Option<Text>): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    // The id as stored: a model may name its call with anything, NUL included.
    let tool_call_id = escape_text(tool_call_id);
    let found = sqlx::query_as::<DB, (bool, Option<Text>, Option<Text>)>(&sql.approval)
        .bind(session_id)
        .bind(tool_call_id.as_ref())
        .fetch_optional(pool)
        .await?;
    Ok(found.map(|(approve, reason, arguments)| {
        (
            approve,
            reason.map(Text::into_inner),
            arguments.map(Text::into_inner),
        )
    }))
}

/// How many sessions are in each unfinished status.
pub(crate) async fn unfinished<DB>(pool: &Pool<DB>) -> Result<Vec<(SessionStatus, u64)>>
where
    DB: Database,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<(String, i64)> = sqlx::query_as::<DB, (String, i64)>(COUNT_UNFINISHED)
        .fetch_all(pool)
        .await?;
    unfinished_counts(rows)
}

/// Every API key, revoked ones included.
pub(crate) async fn keys<DB>(pool: &Pool<DB>, sql: &Statements) -> Result<Vec<ApiKey>>
where
    DB: Database,
    for<'r> KeyRecord: FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let recs: Vec<KeyRecord> = sqlx::query_as::<DB, KeyRecord>(&sql.list_keys)
        .fetch_all(pool)
        .await?;
    recs.into_iter().map(KeyRecord::into_key).collect()
}

/// One API key, if it exists.
pub(crate) async fn key<DB>(pool: &Pool<DB>, sql: &Statements, id: &str) -> Result<Option<ApiKey>>
where
    DB: Database,
    for<'r> KeyRecord: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rec: Option<KeyRecord> = sqlx::query_as::<DB, KeyRecord>(&sql.key_by_id)
        .bind(id)
        .fetch_optional(pool)
        .await?;
    rec.map(KeyRecord::into_key).transpose()
}

/// The names of the stored queues.
pub(crate) async fn queues<DB>(pool: &Pool<DB>, sql: &Statements) -> Result<Vec<String>>
where
    DB: Database,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<(String,)> = sqlx::query_as::<DB, (String,)>(&sql.stored_queues)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|(name,)| name).collect())
}
