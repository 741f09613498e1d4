//! The dispatcher's and the metrics' reads, which both stores make alike on the pool they
//! read from: sessions waiting per reason, held sessions per queue and in rank order, and
//! the load per (queue, tenant, batch). Generic over the database; the statement texts
//! are [`super::statements`]'.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::error::Result;
use crate::rowconv::tally;
use crate::scheduling::{ActiveCount, Candidate};
use crate::wait::WaitReason;

use super::outcome::{HeldRow, LoadRow};
use super::statements::Statements;

/// Sessions waiting, per reason.
pub(crate) async fn waiting_by_reason<DB>(
    pool: &Pool<DB>,
    sql: &Statements,
) -> Result<Vec<(WaitReason, u64)>>
where
    DB: Database,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<(String, i64)> = sqlx::query_as::<DB, (String, i64)>(&sql.waiting_by_reason)
        .fetch_all(pool)
        .await?;
    Ok(tally(rows))
}

/// Held sessions, per queue.
pub(crate) async fn held_by_queue<DB>(
    pool: &Pool<DB>,
    sql: &Statements,
) -> Result<Vec<(String, u64)>>
where
    DB: Database,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<(String, i64)> = sqlx::query_as::<DB, (String, i64)>(&sql.held_by_queue)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(q, n)| (q, u64::try_from(n).unwrap_or(0)))
        .collect())
}

/// Sessions running and buffered, per (queue, tenant, batch).
pub(crate) async fn load<DB>(pool: &Pool<DB>, sql: &Statements) -> Result<Vec<ActiveCount>>
where
    DB: Database,
    for<'r> LoadRow: FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<LoadRow> = sqlx::query_as::<DB, LoadRow>(&sql.dispatch_load)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(LoadRow::into_count).collect()
}

/// A queue's held sessions, at most `per_group` of each group and `limit` in all, each
/// with its rank in its group.
pub(crate) async fn held<DB>(
    pool: &Pool<DB>,
    sql: &Statements,
    queue: &str,
    per_group: u32,
    limit: u32,
) -> Result<Vec<Candidate>>
where
    DB: Database,
    for<'r> HeldRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<HeldRow> = sqlx::query_as::<DB, HeldRow>(&sql.held)
        .bind(queue)
        .bind(i64::from(per_group))
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(HeldRow::into_candidate).collect()
}

/// Whether the queue holds any session (`None`: any queue).
pub(crate) async fn any_held<DB>(
    pool: &Pool<DB>,
    sql: &Statements,
    queue: Option<&str>,
) -> Result<bool>
where
    DB: Database,
    for<'r> (bool,): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let (any,): (bool,) = match queue {
        Some(queue) => {
            sqlx::query_as::<DB, (bool,)>(&sql.any_held)
                .bind(queue)
                .fetch_one(pool)
                .await?
        }
        None => {
            sqlx::query_as::<DB, (bool,)>(&sql.any_held_anywhere)
                .fetch_one(pool)
                .await?
        }
    };
    Ok(any)
}
