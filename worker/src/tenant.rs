//! Whose session it is: the tenant whose policy, budgets, rate limits and provider
//! settings a session runs under, read in one place so that every part of the worker
//! agrees on it.

use agentq_core::SessionRow;

/// The tenant whose policy a session runs under.
pub(crate) fn tenant(row: &SessionRow) -> &str {
    &row.tenant
}
