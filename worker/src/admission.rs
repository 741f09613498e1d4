//! The admission each session's LLM calls pass, built in one place: the budgets of the
//! session's tree and tenant ([`BudgetGate`]) in front of the fleet's rate limiter for the
//! session's tenant and provider key. The budget goes first so that a call it refuses
//! never holds a rate-limit slot.

use std::sync::Arc;

use agentq_agent::driver::Admission;
use agentq_agent::provider::LlmProvider;
use agentq_core::model::SessionRow;

use crate::Inner;
use crate::budget::BudgetGate;
use crate::session::tenant;

/// The admission of `row`'s calls to `provider`; `token_budget` is the session's own
/// allowance when its row stores none (a root's spec).
pub(crate) fn admission_for(
    inner: &Arc<Inner>,
    row: &SessionRow,
    token_budget: Option<u64>,
    provider: &dyn LlmProvider,
) -> Arc<dyn Admission> {
    let limiter = inner.cfg.limiter.for_session(tenant(row), provider);
    Arc::new(BudgetGate::new(inner.clone(), row, token_budget, limiter))
}
