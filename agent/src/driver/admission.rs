//! Admission of LLM calls: whether a call may start now, and what it cost once it ended.
//!
//! The loop asks its [`Admission`] before every try of an LLM call and reports to it after.
//! The host decides what stands behind it: a fleet-wide rate limiter (requests, tokens and
//! calls in flight per provider endpoint, model and key), the budgets of the session's tree
//! and tenant, or nothing at all ([`NoAdmission`]). Waiting for admission is not a failed
//! try: it never spends the session's retry allowance.

use std::time::Duration;

use async_trait::async_trait;

use crate::provider::RateLimitInfo;
use crate::schema::Usage;

/// What the loop knows about a call before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct CallAsk<'a> {
    /// The model the request names.
    pub model: &'a str,
    /// Prompt tokens, estimated from the request's size.
    pub input_tokens: u64,
    /// The request's `max_tokens`: the most the answer can cost.
    pub max_output_tokens: u64,
    /// The longest the call may be told to wait before it starts ([`Permit::start_after`]):
    /// an admission that can book a later start takes no more than this. Zero books
    /// nothing: the answer is go now, or wait and ask again.
    pub max_wait: Duration,
}

/// Leave to start a call, handed back to [`Admission::settle`] when the call has ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permit {
    /// What the admitting side needs to find its reservation again (empty for none).
    pub id: String,
    /// The tokens reserved for the call.
    pub reserved_tokens: u64,
    /// The call is admitted from this long on, not before: the admission booked its
    /// place in a window that has room then (at most [`CallAsk::max_wait`]), so the
    /// caller waits and starts without asking again. The permit is settled in any case,
    /// a call abandoned before its start too.
    pub start_after: Duration,
    /// What the booked wait waits for (`rpm`, `tpm`), empty when there is none.
    pub waits_for: &'static str,
}

/// The answer to [`Admission::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Start the call now.
    Go(Permit),
    /// Not now: ask again after this long. `reason` names what is short (`rpm`, `tpm`,
    /// `concurrency`, `provider` for a limit the provider announced).
    Wait {
        after: Duration,
        reason: &'static str,
    },
    /// A budget is spent: the session must not make the call. With `park` it waits until the
    /// budget is raised (or its period turns over); otherwise it ends with
    /// `budget_exhausted`. `message` says which budget.
    Exhausted { message: String, park: bool },
}

/// How a call the admission let through went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallReport {
    /// The usage the provider reported, when it answered.
    pub usage: Option<Usage>,
    /// The rate-limit state the provider's answer announced (its headers), if any.
    pub limits: Option<RateLimitInfo>,
    /// The provider refused the call for its rate limit (HTTP 429, or Anthropic's 529):
    /// `Some(retry_after)`, the wait it asked for when it said.
    pub rate_limited: Option<Option<Duration>>,
}

/// The gate every LLM call passes. One value serves one session (the host builds it with
/// whatever it needs to know: tenant, tree, provider endpoint and key).
#[async_trait]
pub trait Admission: Send + Sync {
    /// Ask to start a call described by `ask`.
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit;

    /// The call let through by `permit` has ended, as `report` says. Called once per
    /// [`Admit::Go`], whatever the outcome (cancelled and failed calls too).
    async fn settle(&self, ask: &CallAsk<'_>, permit: Permit, report: &CallReport);
}

/// Admits every call at once: `agentq run` and hosts without limits.
pub struct NoAdmission;

#[async_trait]
impl Admission for NoAdmission {
    async fn reserve(&self, _ask: &CallAsk<'_>) -> Admit {
        Admit::Go(Permit::default())
    }

    async fn settle(&self, _ask: &CallAsk<'_>, _permit: Permit, _report: &CallReport) {}
}
