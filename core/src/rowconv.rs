//! Conversions between stored column values and the model, shared by the Postgres and
//! SQLite stores: what a bad stored value becomes (a non-retryable decode error), and the
//! text forms of statuses, finish reasons, phases and roles.

use std::fmt::Display;

use agentq_agent::spec::ExitReason;
use agentq_agent::state::Phase;

use sqlx::migrate::Migrator;

use crate::error::{Error, Result};
use crate::model::SessionStatus;
use crate::protocol::parse_phase_name;

/// A value in the database this binary cannot read (not retryable).
pub(crate) fn bad_data(what: impl Display) -> Error {
    Error::Db(sqlx::Error::Decode(
        format!("sessions: unreadable stored value: {what}").into(),
    ))
}

pub(crate) fn to_u32<T: TryInto<u32> + Copy + Display>(v: T, col: &str) -> Result<u32> {
    v.try_into()
        .map_err(|_| bad_data(format_args!("{col} = {v}")))
}

pub(crate) fn to_u64(v: i64, col: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| bad_data(format_args!("{col} = {v}")))
}

pub(crate) fn to_i32(v: u32, field: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::invalid(field, format!("{v} is out of range")))
}

pub(crate) fn to_i64(v: u64, field: &str) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::invalid(field, format!("{v} is out of range")))
}

pub(crate) fn parse_status(s: &str) -> Result<SessionStatus> {
    SessionStatus::parse(s).ok_or_else(|| bad_data(format_args!("status = {s:?}")))
}

pub(crate) fn parse_exit(s: &str) -> Result<ExitReason> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| bad_data(format_args!("finish_reason = {s:?}")))
}

pub(crate) fn parse_phase(s: &str) -> Result<Phase> {
    parse_phase_name(s).ok_or_else(|| bad_data(format_args!("phase = {s:?}")))
}

/// Compare the migrations a database applied (`None`: it has no migrations table) with the
/// ones this binary embeds.
pub(crate) fn check_applied(migrator: &Migrator, applied: Option<Vec<i64>>) -> Result<()> {
    let embedded: Vec<i64> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect();
    let required = embedded.iter().copied().max().unwrap_or(0);
    let Some(applied) = applied else {
        return Err(Error::SchemaBehind {
            current: None,
            required,
        });
    };
    if embedded.iter().all(|v| applied.contains(v)) {
        Ok(())
    } else {
        Err(Error::SchemaBehind {
            current: applied.iter().copied().max(),
            required,
        })
    }
}

pub(crate) fn unfinished_counts(rows: Vec<(String, i64)>) -> Result<Vec<(SessionStatus, u64)>> {
    rows.into_iter()
        .map(|(s, n)| Ok((parse_status(&s)?, to_u64(n, "count")?)))
        .collect()
}

/// A unique violation (23505 on Postgres, 2067/1555 on SQLite) as a conflict naming `what`.
pub(crate) fn unique_as_conflict(e: sqlx::Error, what: &str) -> Error {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => {
            Error::Conflict(format!("{what} exists already"))
        }
        _ => e.into(),
    }
}
