//! Admission of LLM calls: whether a call may start now, and what it cost once it ended.
//!
//! The loop asks its [`Admission`] before every try of an LLM call and reports to it after.
//! The host decides what stands behind it: a fleet-wide rate limiter (requests, tokens and
//! calls in flight per provider endpoint, model and key), the budgets of the session's tree
//! and tenant, or nothing at all ([`NoAdmission`]). Waiting for admission is not a failed
//! try: it never spends the session's retry allowance.

use std::sync::Arc;
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
}

/// Leave to start a call, handed back to [`Admission::settle`] when the call has ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permit {
    /// What the admitting side needs to find its reservation again (empty for none).
    pub id: String,
    /// The tokens reserved for the call.
    pub reserved_tokens: u64,
    /// The permits of each gate, for a permit of [`AllOf`].
    pub parts: Vec<Permit>,
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
    /// The call never started (a later gate of [`AllOf`] did not admit it): whatever
    /// was reserved for it is given back whole.
    pub not_started: bool,
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

/// Every gate must admit a call: asked in order, the first that does not decides. The
/// permits of the gates before it are settled at once as never started.
pub struct AllOf {
    gates: Vec<Arc<dyn Admission>>,
}

impl AllOf {
    /// One gate is itself; none admits everything.
    pub fn of(mut gates: Vec<Arc<dyn Admission>>) -> Arc<dyn Admission> {
        match gates.len() {
            0 => Arc::new(NoAdmission),
            1 => gates.remove(0),
            _ => Arc::new(AllOf { gates }),
        }
    }
}

#[async_trait]
impl Admission for AllOf {
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit {
        let mut parts = Vec::with_capacity(self.gates.len());
        for (i, gate) in self.gates.iter().enumerate() {
            match gate.reserve(ask).await {
                Admit::Go(p) => parts.push(p),
                other => {
                    let unused = CallReport {
                        not_started: true,
                        ..CallReport::default()
                    };
                    for (g, p) in self.gates[..i].iter().zip(parts) {
                        g.settle(ask, p, &unused).await;
                    }
                    return other;
                }
            }
        }
        Admit::Go(Permit {
            id: String::new(),
            reserved_tokens: parts.iter().map(|p| p.reserved_tokens).max().unwrap_or(0),
            parts,
        })
    }

    async fn settle(&self, ask: &CallAsk<'_>, permit: Permit, report: &CallReport) {
        for (g, p) in self.gates.iter().zip(permit.parts) {
            g.settle(ask, p, report).await;
        }
    }
}
