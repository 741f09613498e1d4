//! The console's summaries, as both stores read them: sessions counted per status for a
//! listing's filter, usage per tenant, model and day, and the workers holding leases.
//! The statements differ only in how a time is bound and how a day is named.

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, QueryBuilder, Type};

use crate::error::Result;
use crate::model::{ListFilter, SessionStatus};
use crate::report::{CostFilter, CostRow, StatusCount};
use crate::wait::WaitReason;

use crate::rowconv::bad_data;

use super::budget::{count, usage_from};
use super::statements::{Dialect, push_conditions};

/// Sessions of `filter` (its cursor and limit aside: a count is of the whole filter) per
/// status and stored wait reason: `(status, wait_reason, count)`.
pub(crate) fn count_statement<'a, DB: Database>(
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
    let mut qb = QueryBuilder::new(
        "SELECT status, CASE WHEN status = 'waiting' THEN wait_reason END AS reason, count(*) \
         FROM sessions WHERE true",
    );
    push_conditions(&mut qb, filter, dialect);
    qb.push(" GROUP BY 1, 2");
    qb
}

/// (tenant, model, day, sessions, input, output, cache read, cache write, reasoning,
/// web searches)
pub(crate) type CostRecord = (
    String,
    Option<String>,
    String,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
);

/// Usage per tenant, model and UTC day of the sessions [`CostFilter`] selects, the most
/// recent day first. Sub-agents are sessions of their own and add their own usage; a
/// retried session's usage is what all its attempts used.
pub(crate) fn costs<'a, DB: Database>(
    filter: &'a CostFilter,
    dialect: Dialect,
) -> QueryBuilder<'a, DB>
where
    DB::Arguments<'a>: Default,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    let (model, day, sum) = match dialect {
        Dialect::Postgres => (
            "COALESCE(s.model_used, p.spec->>'model')",
            "to_char(u.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
            "::bigint",
        ),
        Dialect::Sqlite => (
            "COALESCE(s.model_used, json_extract(p.spec, '$.model'))",
            "strftime('%Y-%m-%d', u.created_at / 1000000, 'unixepoch')",
            "",
        ),
    };
    // The live sessions' usage and that of the sessions retention deleted (each one row
    // of `retired_usage`), each branch held to the filter where its index is.
    let mut qb = QueryBuilder::new(format!(
        "SELECT u.tenant, u.model, {day}, count(*), sum(u.input_tokens){sum}, \
         sum(u.output_tokens){sum}, sum(u.cache_read_tokens){sum}, \
         sum(u.cache_write_tokens){sum}, sum(u.reasoning_tokens){sum}, \
         sum(u.web_search_requests){sum} FROM (\
         SELECT s.tenant, {model} AS model, s.created_at, s.input_tokens, s.output_tokens, \
             s.cache_read_tokens, s.cache_write_tokens, s.reasoning_tokens, \
             s.web_search_requests \
         FROM sessions s JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id \
         WHERE "
    ));
    push_cost_filter(&mut qb, filter, dialect);
    qb.push(
        " UNION ALL SELECT s.tenant, s.model, s.created_at, s.input_tokens, s.output_tokens, \
             s.cache_read_tokens, s.cache_write_tokens, s.reasoning_tokens, \
             s.web_search_requests FROM retired_usage s WHERE ",
    );
    push_cost_filter(&mut qb, filter, dialect);
    qb.push(") u");
    qb.push(" GROUP BY 1, 2, 3 ORDER BY 3 DESC, 1, 2 LIMIT ")
        .push_bind(i64::from(filter.limit));
    qb
}

/// `s`'s creation within the filter's range, and its tenant if it names one.
fn push_cost_filter<'a, DB: Database>(
    qb: &mut QueryBuilder<'a, DB>,
    filter: &'a CostFilter,
    dialect: Dialect,
) where
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    qb.push("s.created_at >= ");
    match dialect {
        Dialect::Postgres => {
            qb.push_bind(filter.since)
                .push(" AND s.created_at < ")
                .push_bind(filter.until);
        }
        Dialect::Sqlite => {
            qb.push_bind(filter.since.timestamp_micros())
                .push(" AND s.created_at < ")
                .push_bind(filter.until.timestamp_micros());
        }
    }
    if let Some(tenant) = &filter.tenant {
        qb.push(" AND s.tenant = ").push_bind(tenant.as_str());
    }
}

pub(crate) fn cost_rows(rows: Vec<CostRecord>) -> Vec<CostRow> {
    rows.into_iter()
        .map(|(tenant, model, day, n, i, o, cr, cw, r, ws)| CostRow {
            tenant,
            model,
            day,
            sessions: count(n),
            usage: usage_from([i, o, cr, cw, r, ws]),
        })
        .collect()
}

/// The counts of [`count_statement`]'s rows, each waiting one with the reason the
/// API shows (a waiting row stored without one waits for its children).
pub(crate) fn status_counts(rows: Vec<(String, Option<String>, i64)>) -> Result<Vec<StatusCount>> {
    let mut out: Vec<StatusCount> = Vec::new();
    for (status, reason, n) in rows {
        let status = SessionStatus::parse(&status)
            .ok_or_else(|| bad_data(format_args!("status = {status:?}")))?;
        let wait_reason = match status {
            SessionStatus::AwaitingApproval => Some(WaitReason::Approval),
            SessionStatus::Waiting => Some(
                reason
                    .as_deref()
                    .and_then(WaitReason::parse)
                    .unwrap_or(WaitReason::Children),
            ),
            _ => None,
        };
        // `children` stored and stored as NULL are one reason: one entry.
        match out
            .iter_mut()
            .find(|c| c.status == status && c.wait_reason == wait_reason)
        {
            Some(c) => c.sessions = c.sessions.saturating_add(count(n)),
            None => out.push(StatusCount {
                status,
                wait_reason,
                sessions: count(n),
            }),
        }
    }
    out.sort_by_key(|c| (c.status.as_str(), c.wait_reason.map(WaitReason::as_str)));
    Ok(out)
}

/// The running sessions' leases per owner: Postgres' text (SQLite's store reads the
/// same columns, its times as microseconds). A lease runs to the later of the session's
/// claim expiry and its owner's liveness row.
pub(crate) const WORKERS: &str = "SELECT s.lease_owner, count(*), min(LEASE_END), \
     max(LEASE_END) FROM sessions s LEFT JOIN workers w ON w.id = s.lease_owner \
     WHERE s.status = 'running' AND s.lease_owner IS NOT NULL \
     GROUP BY s.lease_owner ORDER BY s.lease_owner LIMIT $1";

/// The end of a running session's lease in [`WORKERS`] (a NULL `w.expires_at`, no row,
/// compares as unknown and leaves the session's own).
const LEASE_END: &str = "CASE WHEN w.expires_at > s.lease_expires_at THEN w.expires_at \
     ELSE s.lease_expires_at END";

/// [`WORKERS`] as run.
pub(crate) static WORKERS_SQL: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| WORKERS.replace("LEASE_END", LEASE_END));
