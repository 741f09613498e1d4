//! Budgets and cost: `PUT /v1/admin/budgets/{tenant}` (raise or set a tenant's budget),
//! `GET /v1/admin/budgets` (every budget with its current spend), `GET
//! /v1/admin/tenants/{tenant}/spend`, and the cost fields of `GET /v1/sessions/{id}`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /v1/admin/budgets/{tenant}` (admin): the tenant's budget from now on, stored; it
/// replaces the tenant's configured `[[budgets]]`. Its parked sessions are woken (those
/// still over the new budget park again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBudget {
    /// `day` or `month` (UTC).
    pub period: String,
    /// Tokens (input + output) per period.
    #[serde(default)]
    pub tokens: Option<u64>,
    /// Dollars per period, at the configured prices.
    #[serde(default)]
    pub usd: Option<f64>,
    /// `park` or `fail` (default `fail`).
    #[serde(default)]
    pub on_budget: Option<String>,
}

/// A tenant's budget and what it spent in the current period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetView {
    pub tenant: String,
    pub period: String,
    pub tokens: Option<u64>,
    pub usd: Option<f64>,
    pub on_budget: String,
    /// `config` (`[[budgets]]`) or `stored` (set through this API).
    pub source: String,
    pub spent_tokens: u64,
    pub spent_usd: f64,
}

/// The answer of `PUT /v1/admin/budgets/{tenant}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetSet {
    pub budget: BudgetView,
    /// Parked sessions put back on the queue.
    pub woken: usize,
}

/// `GET /v1/admin/budgets`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetList {
    pub budgets: Vec<BudgetView>,
}

/// What a tenant spent, counted per call for tenants with a budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SpendView {
    pub tokens: u64,
    pub usd: f64,
}

/// `GET /v1/admin/tenants/{tenant}/spend`: today and this month (UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantSpend {
    pub tenant: String,
    pub day: SpendView,
    pub month: SpendView,
}

/// A session tree's spend, on `GET /v1/sessions/{id}` (the tree the session belongs to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TreeCost {
    pub root_id: String,
    pub sessions: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// At the configured prices; models without a price count 0.
    pub cost_usd: f64,
}

/// A session's part of its tree's token budget, on `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BudgetLedger {
    /// The tokens this session and its sub-agents may spend.
    pub allowance: u64,
    /// Spent by the session itself.
    pub spent: u64,
    /// Held by its running sub-agents.
    pub held: u64,
    /// Spent by its finished sub-agents (their whole subtrees).
    pub children_spent: u64,
    pub remaining: u64,
}
