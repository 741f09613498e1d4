//! `GET /v1/admin/limits`: the fleet's rate limiter as it stands.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use agentq_types::config::LimitSettings;
pub use agentq_types::limiter::{HoldState, RuleState};

/// The limiter's state: the rules configured, the counters of every rule key in use
/// (per provider endpoint and key digest), and the holds learned from providers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LimitsView {
    /// Whether a fleet-wide limiter exists (it needs Redis).
    pub enabled: bool,
    pub configured: Vec<LimitSettings>,
    pub rules: Vec<RuleState>,
    pub holds: Vec<HoldState>,
}
