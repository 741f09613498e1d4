//! What a fenced suspension writes, as both stores bind it: the status asked for, the
//! wake-ups the run had seen at its claim, and what the session then waits for. The two
//! ways in (`LeaseStore::suspend` and `suspend_for`) differ only in how they say it.

use chrono::{DateTime, Utc};

use crate::model::SessionStatus;
use crate::wait::WaitReason;

/// One suspension's values, for the shared `suspend` statement.
pub(crate) struct Suspension {
    pub status: SessionStatus,
    pub seen_wake: i64,
    pub approval_deadline: Option<DateTime<Utc>>,
    pub reason: WaitReason,
    pub wake_at: Option<DateTime<Utc>>,
}

impl Suspension {
    /// [`crate::store::LeaseStore::suspend`]: awaiting an approval (until
    /// `approval_deadline`), or else waiting for children.
    pub(crate) fn of(
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Self {
        let reason = match status {
            SessionStatus::AwaitingApproval => WaitReason::Approval,
            _ => WaitReason::Children,
        };
        Self {
            status,
            seen_wake,
            approval_deadline,
            reason,
            wake_at: None,
        }
    }

    /// [`crate::store::LeaseStore::suspend_for`]: waiting for `reason`, until `wake_at` if
    /// given.
    pub(crate) fn waiting(
        seen_wake: i64,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Self {
        Self {
            status: SessionStatus::Waiting,
            seen_wake,
            approval_deadline: None,
            reason,
            wake_at,
        }
    }
}
