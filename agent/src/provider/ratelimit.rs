//! The rate-limit state a provider announces with its answers: OpenAI's `x-ratelimit-*`
//! headers, Anthropic's `anthropic-ratelimit-*` ones. Neutral, like the rest of this
//! folder's boundary: the admission side reads it without knowing whose headers it was.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one answer said about the key's limits. Every field is optional: servers send
/// any subset, and compatible servers often none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimitInfo {
    /// Requests allowed per window.
    pub limit_requests: Option<u64>,
    /// Requests left in the current window.
    pub remaining_requests: Option<u64>,
    /// Until the request window is full again.
    pub reset_requests: Option<Duration>,
    /// Tokens allowed per window (input and output together, or the provider's own sum).
    pub limit_tokens: Option<u64>,
    /// Tokens left in the current window.
    pub remaining_tokens: Option<u64>,
    /// Until the token window is full again.
    pub reset_tokens: Option<Duration>,
}
