//! The fleet rate limiter's state as the admin view shows it (`GET /v1/admin/limits`):
//! plain data, read from Redis by `agentq_core::admission::read_state` (of the
//! `agentq-limiter` crate).

use serde::{Deserialize, Serialize};

/// What the limiter holds for one rule key, for the admin view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuleState {
    /// `provider:model glob:tenant|limit key` (the key digests the API key).
    pub key: String,
    /// The allowances per window, as the workers last applied them (0 = none).
    pub requests_per_window: u64,
    pub tokens_per_window: u64,
    pub concurrency: u64,
    pub window_ms: u64,
    /// The counts in the current window.
    pub requests: u64,
    pub tokens: i64,
    /// Calls reserved and not settled (nor expired).
    pub in_flight: u64,
}

/// A learned hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HoldState {
    /// `limit key|model`.
    pub key: String,
    pub until: chrono::DateTime<chrono::Utc>,
}

/// The limiter's state across the fleet.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LimiterState {
    pub rules: Vec<RuleState>,
    pub holds: Vec<HoldState>,
}
