//! What a suspended session waits for ([`WaitReason`], stored as `sessions.wait_reason`)
//! and when it wakes by itself (`sessions.wake_at`): the names the API, the metrics and
//! the sweeper share.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a session is `waiting` or `awaiting_approval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// Its background children (their results wake it).
    Children,
    /// A human's decision on a held tool call (or the decision's deadline).
    Approval,
    /// An LLM rate limit: the sweeper wakes it at `wake_at`.
    RateLimit,
    /// A spent budget that parks rather than fails: raising the budget wakes it.
    Budget,
}

impl WaitReason {
    /// Every reason, for metrics that report each (bounded labels).
    pub const ALL: [WaitReason; 4] = [
        WaitReason::Children,
        WaitReason::Approval,
        WaitReason::RateLimit,
        WaitReason::Budget,
    ];

    #[inline]
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Children => "children",
            WaitReason::Approval => "approval",
            WaitReason::RateLimit => "rate_limit",
            WaitReason::Budget => "budget",
        }
    }

    #[inline]
    pub fn parse(s: &str) -> Option<WaitReason> {
        WaitReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for r in WaitReason::ALL {
            assert_eq!(WaitReason::parse(r.as_str()), Some(r));
            assert_eq!(
                serde_json::to_value(r).unwrap_or_default(),
                serde_json::Value::String(r.as_str().into())
            );
        }
        assert_eq!(WaitReason::parse("nap"), None);
    }
}
