//! Hooks the host uses to measure the loop (metrics), without the agent crate knowing any
//! metrics library. Every method has a do-nothing default.

use std::time::Duration;

use crate::schema::Usage;

/// One LLM request attempt, as measured by the driver.
#[derive(Debug, Clone)]
pub struct LlmCallInfo<'a> {
    pub provider: &'a str,
    pub model: &'a str,
    /// `ok`, `rate_limited`, `server_error`, `client_error`, `transport_error`,
    /// `context_length`, `empty_error`, `cancelled`, `error`.
    pub outcome: &'static str,
    pub duration: Duration,
    /// Until the first text, thinking or tool-call fragment.
    pub time_to_first_token: Option<Duration>,
    /// What the provider reported (successful calls only).
    pub usage: Option<Usage>,
}

pub trait Observer: Send + Sync {
    fn llm_call(&self, _info: &LlmCallInfo<'_>) {}
    /// One try of a guardian's review call (its own kind: never an iteration, and not in
    /// [`Observer::llm_call`]). `outcome` as there, or `timeout`.
    fn guardian_call(&self, _info: &LlmCallInfo<'_>) {}
    /// A failed attempt that will be retried; `reason` is the outcome label.
    fn llm_retry(&self, _provider: &str, _reason: &str) {}
    /// `outcome`: `ok`, `error`, `timeout`, `denied`, `cancelled`.
    fn tool_call(&self, _tool: &str, _outcome: &str, _duration: Duration) {}
    /// An LLM response that counted as an iteration was committed.
    fn iteration(&self, _provider: &str, _model: &str) {}
    /// The loop's own cost of one iteration: from its LLM response to the next request
    /// (or to the final checkpoint), less the time spent waiting on tools and background
    /// children — checkpoints, event emission, request building, bookkeeping.
    fn iteration_overhead(&self, _overhead: Duration) {}
    /// A configured hook or the guardian was asked: `point` is a hook point
    /// (`pre_tool_use`…) or `guardian`; `outcome` is `allow`, `deny` (a decision), `ok`
    /// (an observer answered), `timeout`, `error` (unreachable, failed, non-2xx) or
    /// `invalid` (an answer that is not a verdict); the guardian's also `truncated` (a
    /// call it could not see whole, denied unasked), `budget` (a budget is spent: not
    /// asked, denied) and `cancelled`.
    fn hook_call(&self, _point: &str, _outcome: &str) {}
    /// The provider refused a call for its rate limit (HTTP 429, or Anthropic's 529).
    fn llm_rate_limited(&self, _provider: &str, _model: &str) {}
    /// A try of an LLM call was admitted after waiting this long (zero: at once).
    fn admission_wait(&self, _provider: &str, _model: &str, _waited: Duration) {}
    /// A call would have started later than its admission's booking allowed: the
    /// booking was given back and the call asks again.
    fn admission_late(&self, _provider: &str, _model: &str) {}
}

/// Measures nothing.
pub struct NoObserver;

impl Observer for NoObserver {}

/// The outcome label of a failed call.
pub fn outcome_of(err: &crate::Error) -> &'static str {
    use crate::Error;
    match err {
        Error::Http {
            status: 429 | 529, ..
        } => "rate_limited",
        Error::Http { status, .. } if *status >= 500 => "server_error",
        Error::Http { .. } => "client_error",
        Error::Transport(_) => "transport_error",
        Error::ContextLength(_) => "context_length",
        Error::Cancelled => "cancelled",
        Error::Stream { .. } => "stream_error",
        Error::Decode(_) => "decode_error",
        _ => "error",
    }
}
