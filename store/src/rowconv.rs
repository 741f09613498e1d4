//! Conversions between stored column values and the model, shared by the Postgres and
//! SQLite stores: what a bad stored value becomes (a non-retryable decode error), and the
//! text forms of statuses, finish reasons, phases and roles.

use std::fmt::Display;

use agentq_agent::spec::ExitReason;
use agentq_agent::state::Phase;

use sqlx::migrate::Migrator;

use crate::error::{Error, Result};
use crate::model::{SessionStatus, Woken};
use crate::protocol::parse_phase_name;
use crate::wait::WaitReason;

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

/// A woken session as the wake statements return it (`RETURNING id, queue, held`).
pub(crate) type WokenRow = (String, String, bool);

pub(crate) fn woken(rows: Vec<WokenRow>) -> Vec<Woken> {
    rows.into_iter()
        .map(|(id, queue, held)| Woken { id, queue, held })
        .collect()
}

/// Counts per reason name as [`crate::store::SweepStore::waiting_by_reason`] reads them: a name
/// this build does not know (a newer one wrote it) is left out.
pub(crate) fn tally(rows: Vec<(String, i64)>) -> Vec<(WaitReason, u64)> {
    rows.into_iter()
        .filter_map(|(name, n)| Some((WaitReason::parse(&name)?, u64::try_from(n).unwrap_or(0))))
        .collect()
}
