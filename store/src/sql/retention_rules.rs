//! The retention rules an admin stores through the API (`retention_rules`), read and
//! written alike by both stores, generic over the database.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::error::Result;
use crate::retention::{Keep, RuleKind, StoredRetentionRule};
use crate::rowconv::bad_data;

use super::record::Stamp;
use super::webhooks::{Affected, At};

const LIST: &str =
    "SELECT kind, name, days, keep, updated_at FROM retention_rules ORDER BY kind DESC, name";

/// One rule per (kind, name): a second set replaces the first.
const SET: &str = "INSERT INTO retention_rules (kind, name, days, keep, updated_at) \
    VALUES ($1, $2, $3, $4, $5) \
    ON CONFLICT (kind, name) DO UPDATE SET days = excluded.days, keep = excluded.keep, \
    updated_at = excluded.updated_at";

const DELETE: &str = "DELETE FROM retention_rules WHERE kind = $1 AND name = $2";

/// A `retention_rules` row.
#[derive(Debug, FromRow)]
pub(crate) struct RuleRecord {
    kind: String,
    name: String,
    days: i64,
    keep: String,
    updated_at: Stamp,
}

impl RuleRecord {
    fn into_rule(self) -> Result<StoredRetentionRule> {
        let kind = RuleKind::parse(&self.kind)
            .ok_or_else(|| bad_data(format!("unknown retention rule kind {:?}", self.kind)))?;
        let keep = Keep::parse(&self.keep)
            .ok_or_else(|| bad_data(format!("unknown retention keep {:?}", self.keep)))?;
        let days = u32::try_from(self.days)
            .ok()
            .filter(|d| *d >= 1)
            .ok_or_else(|| bad_data(format!("retention days {} out of range", self.days)))?;
        Ok(StoredRetentionRule {
            kind,
            name: self.name,
            days,
            keep,
            updated_at: self.updated_at.0,
        })
    }
}

/// Every stored rule: the tenants' by name, then the queues'.
pub(crate) async fn list<DB>(conn: &mut DB::Connection) -> Result<Vec<StoredRetentionRule>>
where
    DB: Database,
    for<'r> RuleRecord: FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let recs = sqlx::query_as::<DB, RuleRecord>(LIST)
        .fetch_all(&mut *conn)
        .await?;
    recs.into_iter().map(RuleRecord::into_rule).collect()
}

/// Store `rule`, replacing the one of its tenant or queue.
pub(crate) async fn set<DB>(conn: &mut DB::Connection, rule: &StoredRetentionRule) -> Result<()>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> At: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    sqlx::query::<DB>(SET)
        .bind(rule.kind.as_str())
        .bind(rule.name.as_str())
        .bind(i64::from(rule.days))
        .bind(rule.keep.as_str())
        .bind(At(rule.updated_at))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Delete the rule of `kind` `name`; whether there was one.
pub(crate) async fn delete<DB>(
    conn: &mut DB::Connection,
    kind: RuleKind,
    name: &str,
) -> Result<bool>
where
    DB: Database,
    DB::QueryResult: Affected,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let done = sqlx::query::<DB>(DELETE)
        .bind(kind.as_str())
        .bind(name)
        .execute(&mut *conn)
        .await?;
    Ok(done.affected() > 0)
}
