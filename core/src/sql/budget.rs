//! What both stores share for budgets: the rows their budget statements read, how they
//! become the model, and the spawn's checks on the locked rows.

use crate::budget::{
    Ledger, ModelUsage, OnBudget, Period, SpawnLimits, Spawned, TenantBudget, grant,
};
use crate::error::{Error, Result};
use crate::model::NewSession;

/// (id, tree_sessions, own tokens, allowance, held, children_spent)
pub(crate) type LedgerRow = (String, i64, i64, Option<i64>, i64, i64);

/// (model, sessions, input, output, cache read, cache write, reasoning)
pub(crate) type UsageRow = (Option<String>, i64, i64, i64, i64, i64, i64);

/// (tenant, period, tokens, usd_nanos, on_budget)
pub(crate) type BudgetRow = (String, String, Option<i64>, Option<i64>, String);

/// A stored count as an unsigned one (the columns are checked non-negative).
pub(crate) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

pub(crate) fn ledger_of(row: &LedgerRow) -> Ledger {
    Ledger {
        allowance: row.3.map(count),
        spent: count(row.2),
        held: count(row.4),
        children_spent: count(row.5),
    }
}

pub(crate) fn usage_of(rows: Vec<UsageRow>) -> Vec<ModelUsage> {
    rows.into_iter()
        .map(|(model, n, i, o, cr, cw, r)| ModelUsage {
            model,
            sessions: count(n),
            usage: agentq_agent::schema::Usage {
                input_tokens: count(i),
                output_tokens: count(o),
                cache_read_tokens: count(cr),
                cache_write_tokens: count(cw),
                reasoning_tokens: count(r),
            },
        })
        .collect()
}

pub(crate) fn budget_of(row: BudgetRow) -> Result<TenantBudget> {
    let (tenant, period, tokens, usd, on) = row;
    let bad = |what: &str| Error::Config(format!("stored tenant budget of {tenant}: bad {what}"));
    Ok(TenantBudget {
        period: Period::parse(&period).ok_or_else(|| bad("period"))?,
        on_budget: OnBudget::parse(&on).ok_or_else(|| bad("on_budget"))?,
        tokens: tokens.map(count),
        usd_nanos: usd.map(count),
        tenant,
    })
}

/// The grant for the child and the checks before its insert, on the locked rows.
pub(crate) fn check_spawn(
    new: &NewSession,
    limits: &SpawnLimits,
    rows: &[LedgerRow],
) -> Result<std::result::Result<Option<u64>, Spawned>> {
    let find = |id: &str| rows.iter().find(|r| r.0 == id);
    let root = find(&new.root_id)
        .ok_or_else(|| Error::NotFound(format!("the root {} of the spawn", new.root_id)))?;
    if count(root.1) >= limits.max_tree_sessions {
        return Ok(Err(Spawned::TreeFull {
            max: limits.max_tree_sessions,
        }));
    }
    let Some(b) = &limits.budget else {
        return Ok(Ok(None));
    };
    let parent_id = new.parent_id.as_deref().unwrap_or(&new.root_id);
    let parent =
        find(parent_id).ok_or_else(|| Error::NotFound(format!("the parent {parent_id}")))?;
    let l = ledger_of(parent);
    let remaining = l.remaining(l.allowance.unwrap_or(b.parent_allowance), 0);
    match grant(remaining, b.requested) {
        Some(g) => Ok(Ok(Some(g))),
        None => Ok(Err(Spawned::NoBudget { remaining })),
    }
}

/// The child as it is inserted: its spec's budget is its grant.
pub(crate) fn with_grant(new: &NewSession, g: Option<u64>) -> NewSession {
    let mut child = new.clone();
    if let Some(g) = g {
        child.spec.token_budget = Some(g);
    }
    child
}
