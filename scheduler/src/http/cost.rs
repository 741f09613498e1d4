//! Cost and budgets as the API shows them: a session's cost, its tree's spend and its part
//! of the tree's budget (`GET /v1/sessions/{id}`), and tenant budgets with their spend.
//!
//! Cost is computed when it is read, from the stored usage and today's prices: a price
//! change shows at once for every session, and the checkpoint stores nothing for it.

use chrono::Utc;

use agentq_api::{BudgetLedger, BudgetView, SpendView, TreeCost};
use agentq_core::SessionRow;
use agentq_core::budget::{NANOS_PER_USD, Spend, TenantBudget};

use super::ApiResult;
use crate::state::Scheduler;

/// The model whose price applies to a session: the one its worker called, else the one
/// it names (a session no worker has run and that names none is priced by a `*` entry,
/// if any).
fn model_of(row: &SessionRow) -> &str {
    row.model_used
        .as_deref()
        .or(row.spec.model.as_deref())
        .unwrap_or("")
}

/// The cost fields of `GET /v1/sessions/{id}`.
pub async fn of_session(
    s: &Scheduler,
    row: &SessionRow,
) -> ApiResult<(Option<f64>, Option<TreeCost>, Option<BudgetLedger>)> {
    let prices = &s.cfg.prices;
    let own = prices.cost_usd(model_of(row), &row.usage);
    let per_model = s.store.tree_usage(&row.root_id).await?;
    let mut tree = TreeCost {
        root_id: row.root_id.clone(),
        sessions: 0,
        input_tokens: 0,
        output_tokens: 0,
        cost_usd: 0.0,
    };
    for m in &per_model {
        tree.sessions = tree.sessions.saturating_add(m.sessions);
        tree.input_tokens = tree.input_tokens.saturating_add(m.usage.input_tokens);
        tree.output_tokens = tree.output_tokens.saturating_add(m.usage.output_tokens);
        tree.cost_usd += prices
            .cost_usd(m.model.as_deref().unwrap_or(""), &m.usage)
            .unwrap_or(0.0);
    }
    let budget = match row.spec.token_budget {
        Some(b) => s.store.ledger(&row.id).await?.map(|l| {
            let allowance = l.allowance.unwrap_or(b);
            BudgetLedger {
                allowance,
                spent: l.spent,
                held: l.held,
                children_spent: l.children_spent,
                remaining: l.remaining(allowance, 0),
            }
        }),
        None => None,
    };
    Ok((own, Some(tree), budget))
}

/// What `row` costs at the configured prices; `None` when its model has no price.
pub fn of_row(s: &Scheduler, row: &SessionRow) -> Option<f64> {
    s.cfg.prices.cost_usd(model_of(row), &row.usage)
}

/// What `rows` cost together at the configured prices; `None` when none has a price.
pub fn of_rows(s: &Scheduler, rows: &[SessionRow]) -> Option<f64> {
    let prices = &s.cfg.prices;
    rows.iter()
        .filter_map(|r| prices.cost_usd(model_of(r), &r.usage))
        .reduce(|a, b| a + b)
}

pub fn spend_view(s: Spend) -> SpendView {
    SpendView {
        tokens: s.tokens,
        usd: s.cost_nanos as f64 / NANOS_PER_USD,
    }
}

/// The budgets that bind each tenant: a stored one replaces the tenant's configured ones.
pub async fn effective_budgets(s: &Scheduler) -> ApiResult<Vec<(TenantBudget, &'static str)>> {
    let stored = s.store.tenant_budgets().await?;
    let mut out: Vec<(TenantBudget, &'static str)> = s
        .cfg
        .budgets
        .iter()
        .filter(|b| !stored.iter().any(|x| x.tenant == b.tenant))
        .map(|b| (b.clone(), "config"))
        .collect();
    out.extend(stored.into_iter().map(|b| (b, "stored")));
    out.sort_by(|a, b| (&a.0.tenant, a.0.period).cmp(&(&b.0.tenant, b.0.period)));
    Ok(out)
}

/// A budget with what its tenant spent in the current period.
pub async fn budget_view(s: &Scheduler, b: &TenantBudget, source: &str) -> ApiResult<BudgetView> {
    let (from, to) = b.period.days(Utc::now());
    let spent = s.store.tenant_spend(&b.tenant, &from, &to).await?;
    Ok(BudgetView {
        tenant: b.tenant.clone(),
        period: b.period.as_str().to_string(),
        tokens: b.tokens,
        usd: b.usd_nanos.map(|n| n as f64 / NANOS_PER_USD),
        on_budget: b.on_budget.as_str().to_string(),
        source: source.to_string(),
        spent_tokens: spent.tokens,
        spent_usd: spent.cost_nanos as f64 / NANOS_PER_USD,
    })
}
