//! Batches as objects (`/v1/batches`): a tenant's batch as stored ([`BatchRow`]), what
//! creates one ([`NewBatch`], [`BatchItem`]) and what the store answers about its
//! sessions: the tally by status, finish reason and model ([`BatchTally`]) and each
//! item's outcome in id order ([`BatchOutcome`]). [`BatchTotals`] adds a tally up and
//! estimates the time left.
//!
//! A batch's sessions carry its id (`batch_id`); what they did is counted from them when
//! a batch is read, never written to the batch's row as they run, so a checkpoint does
//! the same work in a batch as alone.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use agentq_agent::schema::Usage;
use agentq_agent::spec::ExitReason;

use crate::model::{NewSession, SessionStatus};

/// A batch to create: its id (the `batch_id` its sessions carry), its tenant, the
/// caller's metadata, and its cap on sessions running at once.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    pub id: String,
    pub tenant: String,
    pub metadata: Map<String, Value>,
    pub max_running: Option<u32>,
}

/// One item of a batch: the session it creates and the client's name for it, unique
/// within the batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchItem {
    pub session: NewSession,
    pub custom_id: Option<String>,
}

/// A batch as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRow {
    pub id: String,
    pub tenant: String,
    pub metadata: Map<String, Value>,
    pub max_running: Option<u32>,
    /// The sessions it was created with.
    pub items: u64,
    pub created_at: DateTime<Utc>,
    /// When it was first cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// What creating a batch did. A refusal wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchCreate {
    /// Created with this many sessions.
    Created { items: u64 },
    /// Item `index` (from 0, in the order the items came) cannot be created.
    Refused { index: u64, reason: ItemRefused },
}

/// Why an item of a batch cannot be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemRefused {
    /// Its `custom_id` is an earlier item's.
    CustomIdRepeated,
    /// Its idempotency key belongs to a session already (of the tenant, in this batch or
    /// not): a batch holds only sessions it created.
    IdempotencyKeyUsed { session_id: String },
}

/// The sessions of one batch with one (status, finish reason, model): how many, what they
/// used, when the first of them started and the last finished.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchTally {
    pub batch_id: String,
    pub status: SessionStatus,
    pub finish_reason: Option<ExitReason>,
    /// The model their worker chose (`None` before a worker ran them).
    pub model: Option<String>,
    pub sessions: u64,
    pub usage: Usage,
    pub first_started: Option<DateTime<Utc>>,
    pub last_finished: Option<DateTime<Utc>>,
}

/// One session of a batch, as its results read it.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchOutcome {
    pub id: String,
    pub custom_id: Option<String>,
    pub status: SessionStatus,
    pub finish_reason: Option<ExitReason>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub usage: Usage,
    pub model: Option<String>,
}

/// A batch's tallies added up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchTotals {
    pub sessions: u64,
    /// Sessions per status (only statuses some session has).
    pub by_status: BTreeMap<&'static str, u64>,
    /// Finished sessions per finish reason.
    pub by_reason: BTreeMap<&'static str, u64>,
    pub unfinished: u64,
    pub usage: Usage,
    pub first_started: Option<DateTime<Utc>>,
    pub last_finished: Option<DateTime<Utc>>,
}

impl BatchTotals {
    /// The totals of `tallies` (of one batch).
    pub fn of<'a>(tallies: impl IntoIterator<Item = &'a BatchTally>) -> BatchTotals {
        let mut t = BatchTotals::default();
        for g in tallies {
            t.sessions = t.sessions.saturating_add(g.sessions);
            let n = t.by_status.entry(g.status.as_str()).or_default();
            *n = n.saturating_add(g.sessions);
            if g.status.is_terminal() {
                if let Some(r) = g.finish_reason {
                    let n = t.by_reason.entry(r.as_str()).or_default();
                    *n = n.saturating_add(g.sessions);
                }
            } else {
                t.unfinished = t.unfinished.saturating_add(g.sessions);
            }
            t.usage.add(&g.usage);
            t.first_started = earliest(t.first_started, g.first_started);
            t.last_finished = latest(t.last_finished, g.last_finished);
        }
        t
    }

    pub fn finished(&self) -> u64 {
        self.sessions.saturating_sub(self.unfinished)
    }

    /// When the last session finished, once none is left unfinished.
    pub fn finished_at(&self) -> Option<DateTime<Utc>> {
        (self.sessions > 0 && self.unfinished == 0)
            .then_some(self.last_finished)
            .flatten()
    }

    /// Seconds until the rest finish at the rate the finished ones did, counted from the
    /// first start: `unfinished × elapsed / finished`. `None` before anything finished
    /// (no rate yet) and once nothing is left.
    pub fn eta_secs(&self, now: DateTime<Utc>) -> Option<u64> {
        let finished = self.finished();
        if finished == 0 || self.unfinished == 0 {
            return None;
        }
        let elapsed = (now - self.first_started?).num_milliseconds().max(0);
        let elapsed = u128::try_from(elapsed).ok()?;
        let ms = elapsed
            .checked_mul(u128::from(self.unfinished))?
            .checked_div(u128::from(finished))?;
        u64::try_from(ms.div_ceil(1000)).ok()
    }
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn latest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::TimeZone;

    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).unwrap()
    }

    fn tally(status: SessionStatus, reason: Option<ExitReason>, n: u64) -> BatchTally {
        BatchTally {
            batch_id: "b".into(),
            status,
            finish_reason: reason,
            model: None,
            sessions: n,
            usage: Usage {
                input_tokens: 10 * n,
                output_tokens: n,
                ..Usage::default()
            },
            first_started: Some(at(10 * n as i64)),
            last_finished: status.is_terminal().then(|| at(100 + n as i64)),
        }
    }

    #[test]
    fn totals_count_by_status_and_reason_and_estimate_the_rest() {
        let t = BatchTotals::of(&[
            tally(SessionStatus::Completed, Some(ExitReason::Stop), 6),
            tally(SessionStatus::Failed, Some(ExitReason::Error), 2),
            tally(SessionStatus::Running, None, 3),
            tally(SessionStatus::Queued, None, 5),
        ]);
        assert_eq!(t.sessions, 16);
        assert_eq!(t.unfinished, 8);
        assert_eq!(t.finished(), 8);
        assert_eq!(t.by_status["completed"], 6);
        assert_eq!(t.by_status["queued"], 5);
        assert_eq!(t.by_reason["stop"], 6);
        assert_eq!(t.by_reason["error"], 2);
        assert_eq!(t.usage.input_tokens, 160);
        // The first start is the earliest of the groups'.
        assert_eq!(t.first_started, Some(at(20)));
        assert_eq!(t.finished_at(), None, "8 are not finished");
        // 8 finished in 80 s: the 8 left take as long.
        assert_eq!(t.eta_secs(at(100)), Some(80));
        // No time gone yet: nothing left to wait at that rate.
        assert_eq!(t.eta_secs(at(20)), Some(0));
        // Before the first start (clocks apart): never a negative time.
        assert_eq!(t.eta_secs(at(0)), Some(0));
    }

    #[test]
    fn no_estimate_before_a_rate_or_after_the_end() {
        let none_done = BatchTotals::of(&[tally(SessionStatus::Running, None, 3)]);
        assert_eq!(none_done.eta_secs(at(1000)), None);
        let all_done = BatchTotals::of(&[
            tally(SessionStatus::Completed, Some(ExitReason::Stop), 2),
            tally(SessionStatus::Cancelled, Some(ExitReason::Interrupted), 1),
        ]);
        assert_eq!(all_done.eta_secs(at(1000)), None);
        assert_eq!(all_done.finished_at(), Some(at(102)));
        assert_eq!(BatchTotals::default().finished_at(), None, "an empty batch");
    }
}
