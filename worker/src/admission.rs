//! The admission each session's LLM calls pass, built in one place: the budgets of the
//! session's tree and tenant ([`BudgetGate`]) in front of the fleet's rate limiter for the
//! session's tenant and provider key. The budget goes first so that a call it refuses
//! never holds a rate-limit slot. The guardian's reviews are calls of the session too:
//! the same budgets (one count of the session's spend for both), in front of the limiter
//! of the guardian's own provider key.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use agentq_agent::driver::Admission;
use agentq_agent::provider::LlmProvider;
use agentq_core::model::SessionRow;

use crate::budget::BudgetGate;
use crate::inner::Inner;
use crate::tenant::tenant;

/// How a session's calls are admitted.
pub(crate) struct Admissions {
    /// Its own calls, to `provider`.
    pub(crate) session: Arc<dyn Admission>,
    /// Its guardian's reviews, when the operator configured a guardian.
    pub(crate) guardian: Option<Arc<dyn Admission>>,
    /// What both have spent as this run knows it (ahead of the stored spend between
    /// checkpoints).
    pub(crate) spent: Arc<AtomicU64>,
}

/// The admission of `row`'s calls to `provider` and of its guardian's reviews;
/// `token_budget` is the session's own allowance when its row stores none (a root's spec).
pub(crate) fn admission_for(
    inner: &Arc<Inner>,
    row: &SessionRow,
    token_budget: Option<u64>,
    provider: &dyn LlmProvider,
) -> Admissions {
    let limiter = inner.cfg.limiter.for_session(tenant(row), provider);
    let gate = BudgetGate::new(inner.clone(), row, token_budget, limiter);
    let guardian = inner.cfg.operator.guardian_provider.as_ref().map(|g| {
        let limiter = inner.cfg.limiter.for_session(tenant(row), g.as_ref());
        Arc::new(gate.sibling(limiter)) as Arc<dyn Admission>
    });
    Admissions {
        spent: gate.spent(),
        session: Arc::new(gate),
        guardian,
    }
}
