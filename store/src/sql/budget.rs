//! What both stores share for budgets: the rows their budget statements read, how they
//! become the model, and the spawn's checks on the locked rows.

use crate::budget::{
    Ledger, ModelUsage, OnBudget, Period, SpawnLimits, Spawned, TenantBudget, grant,
};
use crate::error::{Error, Result};
use crate::model::NewSession;

/// (id, tree_sessions, own tokens, allowance, held, children_spent)
pub(crate) type LedgerRow = (String, i64, i64, Option<i64>, i64, i64);

/// (model, sessions, input, output, cache read, cache write, reasoning, web searches)
pub(crate) type UsageRow = (Option<String>, i64, i64, i64, i64, i64, i64, i64);

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
        .map(|(model, n, i, o, cr, cw, r, ws)| ModelUsage {
            model,
            sessions: count(n),
            usage: usage_from([i, o, cr, cw, r, ws]),
        })
        .collect()
}

/// Usage from its stored sums, in the order the statements select them: input, output,
/// cache read, cache write, reasoning, web searches.
pub(crate) fn usage_from([i, o, cr, cw, r, ws]: [i64; 6]) -> agentq_agent::schema::Usage {
    agentq_agent::schema::Usage {
        input_tokens: count(i),
        output_tokens: count(o),
        cache_read_tokens: count(cr),
        cache_write_tokens: count(cw),
        reasoning_tokens: count(r),
        web_search_requests: count(ws),
    }
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
    let remaining = l.remaining(l.allowance.unwrap_or(b.parent_allowance), b.parent_spent);
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

/// The ledger of one session and its ancestors up to its root (`CHAIN`), nearest first:
/// (id, parent_id, own tokens, allowance, held, children_spent, returned, consumed).
pub(crate) type ChainRow = (
    String,
    Option<String>,
    i64,
    Option<i64>,
    i64,
    i64,
    bool,
    Option<i64>,
);

/// The session with its ancestors, nearest first, as a give-back or a re-opening reads
/// them (under the root's lock). Recursion stops at 256 levels: parents never form a
/// cycle, and a tree is far shallower than that.
pub(crate) const CHAIN: &str = "
WITH RECURSIVE chain(id, up) AS (
    SELECT id, 0 FROM sessions WHERE id = $1
    UNION ALL
    SELECT s.parent_id, c.up + 1 FROM chain c JOIN sessions s ON s.id = c.id
    WHERE s.parent_id IS NOT NULL AND c.up < 256
)
SELECT s.id, s.parent_id, s.input_tokens + s.output_tokens, s.budget_allowance,
       s.budget_held, s.budget_children_spent, s.budget_returned, s.budget_consumed
FROM chain c JOIN sessions s ON s.id = c.id ORDER BY c.up";

/// One changed [`Link`], written as a whole: every ledger write of a tree holds its
/// root's lock, so nothing else writes these columns meanwhile.
pub(crate) const WRITE_LINK: &str = "
UPDATE sessions SET budget_allowance = $2, budget_held = $3, budget_children_spent = $4,
    budget_returned = $5, budget_consumed = $6
WHERE id = $1";

/// One session's part of its tree's ledger, as [`give_back`] and [`reopen`] change it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub id: String,
    pub has_parent: bool,
    /// Its own spend (input + output tokens).
    pub own: u64,
    pub allowance: Option<u64>,
    pub held: u64,
    pub children_spent: u64,
    /// Its allowance went back to its parent.
    pub returned: bool,
    /// What it counts in its parent's `children_spent` while returned (`None` on a row
    /// given back before this was stored).
    pub consumed: Option<u64>,
}

impl Link {
    pub(crate) fn of(row: ChainRow) -> Link {
        let (id, parent, own, allowance, held, children_spent, returned, consumed) = row;
        Link {
            id,
            has_parent: parent.is_some(),
            own: count(own),
            allowance: allowance.map(count),
            held: count(held),
            children_spent: count(children_spent),
            returned,
            consumed: consumed.map(count),
        }
    }

    /// What it takes of its parent's budget as it stands: its own spend, its finished
    /// children's, and what its live children hold.
    fn consumption(&self) -> u64 {
        self.own
            .saturating_add(self.children_spent)
            .saturating_add(self.held)
    }

    /// Given back by its own ancestor chain: a child whose consumption its parent counts.
    fn counted_by_parent(&self) -> bool {
        self.has_parent && self.returned
    }
}

/// `n + delta`, floored at 0 (a count never goes below nothing).
fn shift(n: u64, delta: i128) -> u64 {
    u64::try_from((i128::from(n) + delta).max(0)).unwrap_or(u64::MAX)
}

/// Pass a change of `delta` in the consumption of `chain[0]`'s parent (`up[0]`) on, for as
/// long as the ancestor whose consumption changed has given back: its parent counts its
/// consumption in `children_spent`, so that count moves with it. The first ancestor that
/// has not given back (at the latest the root) takes the change into its own ledger.
fn pass_up(up: &mut [Link], delta: i128) {
    for i in 0..up.len() {
        if delta == 0 || !up[i].counted_by_parent() {
            return;
        }
        // A row given back before `consumed` was stored keeps the old rule: what changes
        // under it after its give-back is not passed further.
        let Some(consumed) = up[i].consumed else {
            return;
        };
        up[i].consumed = Some(shift(consumed, delta));
        match up.get_mut(i + 1) {
            Some(p) => p.children_spent = shift(p.children_spent, delta),
            None => return,
        }
    }
}

/// `chain[0]` (finished) gives its allowance back to its parent (`chain[1]`): the parent
/// stops holding it and counts what it consumed instead, and the difference is passed up
/// through ancestors that gave back already ([`pass_up`]). `false` when there is nothing
/// to give back (a root, no allowance, given back already).
pub(crate) fn give_back(chain: &mut [Link]) -> bool {
    let Some((x, up)) = chain.split_first_mut() else {
        return false;
    };
    let Some(allowance) = x.allowance else {
        return false;
    };
    if !x.has_parent || x.returned {
        return false;
    }
    let consumed = x.consumption();
    x.returned = true;
    x.consumed = Some(consumed);
    let Some(p) = up.first_mut() else {
        return true;
    };
    p.held = p.held.saturating_sub(allowance);
    p.children_spent = p.children_spent.saturating_add(consumed);
    pass_up(up, i128::from(consumed) - i128::from(allowance));
    true
}

/// Why a finished session may not be re-opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NoRoom {
    /// What its tree has left to give.
    pub remaining: u64,
    /// What its own `token_budget` still lets it spend.
    pub own_left: u64,
}

impl NoRoom {
    pub(crate) fn error(&self, id: &str) -> Error {
        Error::NoBudget(format!(
            "session {id} cannot start again: its tree's token budget has {} tokens left to \
             give and its own token_budget lets it spend {} more",
            self.remaining, self.own_left
        ))
    }
}

/// Re-open the finished session `chain[0]` (a follow-up, a retry) on its tree's ledger.
///
/// A sub-agent draws again from its tree as a new child would: from the nearest ancestor
/// that has not given its own allowance back (its parent while that runs, at the latest
/// the root), at most what its own `token_budget` (`spec_budget`, a lifetime bound on it
/// and its sub-agents, as a root's is) still lets them spend. What it consumed before moves from its parent's
/// `children_spent` back into what the parent holds for it, with the new grant on top, so
/// its spend is counted once, and its next give-back returns only what is new. A root
/// needs what is left of its own budget (`root_budget`) to be more than nothing.
///
/// `Ok(true)`: the ledger changed; `Ok(false)`: nothing to change (no budget in the tree).
pub(crate) fn reopen(
    chain: &mut [Link],
    root_budget: Option<u64>,
    spec_budget: Option<u64>,
) -> std::result::Result<bool, NoRoom> {
    let Some(x) = chain.first() else {
        return Ok(false);
    };
    if !x.has_parent {
        // A root: its budget bounds what it spends over its whole life, and the spend of
        // its earlier turns is in its ledger already.
        let Some(budget) = root_budget else {
            return Ok(false);
        };
        let remaining = link_ledger(x).remaining(budget, 0);
        let own_left = budget.saturating_sub(x.own);
        if remaining == 0 {
            return Err(NoRoom {
                remaining,
                own_left,
            });
        }
        return Ok(false);
    }
    if x.allowance.is_none() {
        return Ok(false);
    }
    // Not given back yet (its worker died before it could): give back first, so that
    // what it consumed is counted before it draws again.
    if !x.returned {
        give_back(chain);
    }
    let Some(src) = chain.iter().skip(1).position(|l| !l.counted_by_parent()) else {
        // Its ancestors are not all there: nothing to draw from.
        return Err(NoRoom {
            remaining: 0,
            own_left: 0,
        });
    };
    let src = src + 1;
    let s = &chain[src];
    let allowance = match (s.allowance, s.has_parent) {
        (Some(a), _) => a,
        (None, false) => root_budget.unwrap_or(0),
        (None, true) => 0,
    };
    let remaining = link_ledger(s).remaining(allowance, 0);
    let x = &chain[0];
    let consumed = x.consumed.unwrap_or_else(|| x.consumption());
    // Its budget bounds what its own sub-agents spent too (they drew from it), as a
    // root's does: counting only its own spend would grant it its budget again for each
    // re-opening of a sub-agent that spent through children of its own.
    let own_left = spec_budget
        .or(x.allowance)
        .unwrap_or(0)
        .saturating_sub(consumed);
    let Some(g) = grant(remaining, Some(own_left)) else {
        return Err(NoRoom {
            remaining,
            own_left,
        });
    };
    let x = &mut chain[0];
    x.returned = false;
    x.consumed = None;
    x.allowance = Some(consumed.saturating_add(g));
    let p = &mut chain[1];
    p.children_spent = p.children_spent.saturating_sub(consumed);
    p.held = p.held.saturating_add(consumed).saturating_add(g);
    // Ancestors between the parent and the one it drew from gave back already: each one's
    // consumption grows by the grant, and so does what its parent counts of it.
    for i in 1..src {
        let l = &mut chain[i];
        l.consumed = l.consumed.map(|c| c.saturating_add(g));
        let up = &mut chain[i + 1];
        up.children_spent = up.children_spent.saturating_add(g);
    }
    Ok(true)
}

fn link_ledger(l: &Link) -> Ledger {
    Ledger {
        allowance: l.allowance,
        spent: l.own,
        held: l.held,
        children_spent: l.children_spent,
    }
}

/// The links of `after` that differ from `before` (the same chain, changed).
pub(crate) fn changed<'a>(before: &'a [Link], after: &'a [Link]) -> impl Iterator<Item = &'a Link> {
    after
        .iter()
        .zip(before)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a)
}
