//! The admission each session's LLM calls pass, built in one place: the fleet's rate
//! limiter for the session's tenant and provider key, and any further gate (a budget of
//! the session's tree or tenant) composed with it through [`AllOf`]. A gate that spends
//! something the call may never use (a budget) goes before the limiter, so that a call
//! the budget refuses never holds a rate-limit slot.

use std::sync::Arc;

use agentq_agent::driver::{Admission, AllOf};
use agentq_agent::provider::LlmProvider;
use agentq_core::model::SessionRow;

use crate::Inner;
use crate::session::tenant;

/// The admission of `row`'s calls to `provider`.
pub(crate) fn admission_for(
    inner: &Inner,
    row: &SessionRow,
    provider: &dyn LlmProvider,
) -> Arc<dyn Admission> {
    let gates: Vec<Arc<dyn Admission>> = vec![inner.cfg.limiter.for_session(tenant(row), provider)];
    AllOf::of(gates)
}
