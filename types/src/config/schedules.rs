//! `[schedules]`: how each scheduler's fire loop looks for due schedules and how long its
//! claim of one holds, each field with its default.

use serde::{Deserialize, Serialize};

use super::section::section;

section! {
    /// `[schedules]`: the fire loop every scheduler runs (`/v1/schedules`).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct SchedulesSection {
        /// Seconds between two looks for due schedules: a fire comes at most this late
        /// (cron's finest unit is a second).
        pub poll_secs: u64 = 1,
        /// Seconds a scheduler's claim of a due schedule holds: a scheduler killed while
        /// firing leaves it claimed this long, then another fires it (the same session,
        /// by the fire's idempotency key). Longer than `poll_secs`, and than a fire takes.
        pub lease_secs: u64 = 60,
    }
}
