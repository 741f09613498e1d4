//! `[[limits]]`: the rate limits the fleet keeps per provider endpoint and key (see
//! `agentq_core::admission`, of the `agentq-limiter` crate, for how they are enforced).

use serde::{Deserialize, Serialize};

/// One `[[limits]]` rule. A call falls under every rule whose provider, model glob and
/// tenant match; each rule keeps its own counters per provider endpoint and key (and per
/// tenant when it names one), shared by every model its glob matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// `openai`, `anthropic` or `scripted`.
    pub provider: String,
    /// A glob over the model a session names (`gpt-4o*`); `*` for all.
    #[serde(default = "any_model")]
    pub model: String,
    /// Only this tenant's sessions, with counters of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u64>,
    /// Tokens per minute, input and output together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u64>,
    /// Calls in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    /// The sliding window the counts are kept over, 1 to 60 seconds; `rpm` and `tpm` are
    /// scaled to it (a shorter window spreads a minute's allowance evenly, for providers
    /// that enforce theirs over shorter windows).
    #[serde(default = "d_window")]
    pub window_secs: u64,
    /// How long a call's concurrency reservation lives if its worker never settles it
    /// (it died): the slot is free again after this.
    #[serde(default = "d_ttl")]
    pub reservation_ttl_secs: u64,
}

fn any_model() -> String {
    "*".to_string()
}
fn d_window() -> u64 {
    60
}
fn d_ttl() -> u64 {
    300
}
