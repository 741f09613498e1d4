//! The shapes of rule every section's check is made of (a range, a timing, a list of
//! names or globs), and the error naming the setting with its variable and flag.

use crate::config::registry::describe;
use crate::config::values::Secs;
use crate::error::{Error, Result};

pub(super) fn invalid(key: &str, why: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {why}", describe(key)))
}

pub(super) fn timing(key: &str, v: Secs, min: f64, max: f64) -> Result<()> {
    if v.0.is_finite() && (min..=max).contains(&v.0) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("must be a number of seconds from {min} to {max}, not {v}"),
    ))
}

pub(super) fn range<T: PartialOrd + std::fmt::Display>(
    key: &str,
    v: T,
    min: T,
    max: T,
) -> Result<()> {
    if v < min || v > max {
        return Err(invalid(
            key,
            format!("must be from {min} to {max}, not {v}"),
        ));
    }
    Ok(())
}

pub(super) fn names(key: &str, list: &[String]) -> Result<()> {
    if key.ends_with("queues") && list.is_empty() {
        return Err(invalid(key, "must name at least one queue"));
    }
    if list.iter().any(|n| n.trim().is_empty()) {
        return Err(invalid(key, "names must not be empty"));
    }
    Ok(())
}

pub(super) fn globs(key: &str, list: &[String]) -> Result<()> {
    if list.is_empty() {
        return Err(invalid(key, "must list at least one tool (or be left out)"));
    }
    names(key, list)
}
