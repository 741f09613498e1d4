//! When a schedule fires: a cron expression read in an IANA time zone (`croner`,
//! `chrono-tz`), or a fixed interval. Daylight-saving transitions follow the zone's
//! rules as `croner` applies them: a fixed local time that does not exist that day
//! (spring forward) fires once, at the first instant after the gap; a fixed local time
//! that happens twice (fall back) fires once, at its first occurrence. Patterns with a
//! wildcard or a step in the time fields (`*/15 * * * *`) keep to real elapsed time: no
//! fire in the gap, and the repeated hour's occurrences each fire.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;

use agentq_api::{MAX_CRON, MAX_EVERY_SECS, MIN_EVERY_SECS};

/// A schedule's fire times.
#[derive(Debug, Clone)]
pub enum Timing {
    Cron { cron: Box<Cron>, zone: Tz },
    Every(chrono::Duration),
}

/// A refusal naming the field to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub field: &'static str,
    pub message: String,
}

fn refused(field: &'static str, message: impl Into<String>) -> Refused {
    Refused {
        field,
        message: message.into(),
    }
}

impl Timing {
    /// Exactly one of `cron` (in `timezone`, UTC when `None`) and `every_secs`.
    pub fn parse(
        cron: Option<&str>,
        timezone: Option<&str>,
        every_secs: Option<u64>,
    ) -> Result<Timing, Refused> {
        let zone = match timezone {
            None => Tz::UTC,
            Some(z) => Tz::from_str(z).map_err(|_| {
                refused(
                    "timezone",
                    format!("unknown time zone {z:?}: use an IANA name such as Europe/Paris"),
                )
            })?,
        };
        match (cron, every_secs) {
            (Some(_), Some(_)) => Err(refused(
                "every_secs",
                "give either cron or every_secs, not both",
            )),
            (None, None) => Err(refused("cron", "give either cron or every_secs")),
            (None, Some(secs)) => {
                if timezone.is_some() {
                    return Err(refused(
                        "timezone",
                        "a time zone applies to cron only, not to every_secs",
                    ));
                }
                if !(MIN_EVERY_SECS..=MAX_EVERY_SECS).contains(&secs) {
                    return Err(refused(
                        "every_secs",
                        format!("must be from {MIN_EVERY_SECS} to {MAX_EVERY_SECS}, not {secs}"),
                    ));
                }
                let secs = i64::try_from(secs).map_err(|_| refused("every_secs", "too large"))?;
                Ok(Timing::Every(chrono::Duration::seconds(secs)))
            }
            (Some(expr), None) => {
                if expr.len() > MAX_CRON || expr.contains('\0') {
                    return Err(refused(
                        "cron",
                        format!("must be at most {MAX_CRON} bytes, without NUL"),
                    ));
                }
                let cron = Cron::from_str(expr)
                    .map_err(|e| refused("cron", format!("invalid cron expression: {e}")))?;
                let t = Timing::Cron {
                    cron: Box::new(cron),
                    zone,
                };
                // A valid pattern that never matches (`0 0 31 2 *`) would never fire.
                if t.next_after(Utc::now()).is_none() {
                    return Err(refused("cron", "the expression never matches a time"));
                }
                Ok(t)
            }
        }
    }

    /// The first fire time strictly after `t`; `None` when there is none (a pattern
    /// past its last year).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Timing::Every(d) => t.checked_add_signed(*d),
            Timing::Cron { cron, zone } => cron
                .find_next_occurrence(&t.with_timezone(zone), false)
                .ok()
                .map(|n| n.with_timezone(&Utc)),
        }
    }

    /// The zone's name as stored (`UTC` for an interval).
    pub fn zone_name(&self) -> &'static str {
        match self {
            Timing::Cron { zone, .. } => zone.name(),
            Timing::Every(_) => "UTC",
        }
    }
}
