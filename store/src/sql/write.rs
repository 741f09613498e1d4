//! The writes both stores run alike inside the caller's transaction, generic over the
//! database: the follow-up's message, stored right after the history it re-opens.

use serde_json::value::RawValue;
use sqlx::types::Json;
use sqlx::{Database, Encode, Executor, IntoArguments, Type};

use agentq_agent::schema::Message;

use crate::error::Result;

use super::escape::stored_json;
use super::statements::Statements;

/// Store `text` as the user's message after the history of the session `id` (of tree
/// `root_id`), whose follow-up update just bumped its `history_len` to `bumped` (so the
/// new message's seq is one less; see the statement for rows from before the count).
pub(crate) async fn follow_up_message<DB>(
    conn: &mut DB::Connection,
    sql: &Statements,
    root_id: &str,
    id: &str,
    bumped: Option<i32>,
    text: &str,
) -> Result<()>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Json<Box<RawValue>>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i32>: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    sqlx::query::<DB>(&sql.follow_up_message)
        .bind(root_id)
        .bind(id)
        .bind(stored_json(&Message::user(text))?)
        .bind(bumped.map(|n| n - 1))
        .execute(&mut *conn)
        .await?;
    Ok(())
}
