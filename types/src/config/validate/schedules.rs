//! The rules of `[schedules]`.

use super::rules::{invalid, range};
use crate::config::schedules::SchedulesSection;
use crate::error::Result;

/// A day: past it a poll or a lease is a typo (a fire would wait a day for its loop, or a
/// killed scheduler's schedule a day for another).
const DAY_SECS: u64 = 86_400;

pub(super) fn schedules(s: &SchedulesSection) -> Result<()> {
    range("schedules.poll_secs", s.poll_secs, 1, DAY_SECS)?;
    range("schedules.lease_secs", s.lease_secs, 1, DAY_SECS)?;
    // A claim must outlive the pause before the next look: else a live scheduler's claim
    // lapses between its own passes and two may fire one schedule by turns.
    if s.lease_secs <= s.poll_secs {
        return Err(invalid(
            "schedules.lease_secs",
            format!(
                "must be longer than schedules.poll_secs ({}), not {}",
                s.poll_secs, s.lease_secs
            ),
        ));
    }
    Ok(())
}
