//! The budget statements both stores run alike, generic over the database: a tree's
//! ledger read and written link by link, the grant a spawn writes, one session's ledger,
//! tenant spend added and summed, and the tenant budgets. Each runs on whatever the store
//! hands it (a pool, or the connection of its transaction, which holds the tree's lock);
//! what differs between the dialects is only the text of a few reads, passed in.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::budget::{Ledger, Spend, TenantBudget};
use crate::error::Result;
use crate::rowconv::to_i64;

use super::budget::{
    BudgetRow, CHAIN, ChainRow, LedgerRow, Link, WRITE_LINK, budget_of, changed, count, ledger_of,
};

/// One session's ledger row.
const LEDGER: &str = "SELECT id, tree_sessions, input_tokens + output_tokens, budget_allowance, \
     budget_held, budget_children_spent FROM sessions WHERE id = $1";

/// A call's spend, added to the tenant's day.
pub(crate) const ADD_SPEND: &str = "
INSERT INTO tenant_spend (tenant, day, tokens, cost_nanos) VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, day) DO UPDATE SET
    tokens = tenant_spend.tokens + excluded.tokens,
    cost_nanos = tenant_spend.cost_nanos + excluded.cost_nanos";

const BUDGETS: &str =
    "SELECT tenant, period, tokens, usd_nanos, on_budget FROM tenant_budgets ORDER BY tenant";

/// The spawn's grant, after the child's insert: the tree counts one more session, and
/// with an allowance `g` the parent holds it and the child has it.
const COUNT_IN_TREE: &str = "UPDATE sessions SET tree_sessions = tree_sessions + 1 WHERE id = $1";
const HOLD_FOR_CHILD: &str = "UPDATE sessions SET budget_held = budget_held + $2 WHERE id = $1";
const ALLOW: &str = "UPDATE sessions SET budget_allowance = $2 WHERE id = $1";

/// `id` and its ancestors up to its root, nearest first.
pub(crate) async fn chain<DB>(conn: &mut DB::Connection, id: &str) -> Result<Vec<Link>>
where
    DB: Database,
    for<'r> ChainRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<ChainRow> = sqlx::query_as::<DB, ChainRow>(CHAIN)
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.into_iter().map(Link::of).collect())
}

/// Write the links `after` changed from `before`.
pub(crate) async fn write_links<DB>(
    conn: &mut DB::Connection,
    before: &[Link],
    after: &[Link],
) -> Result<()>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    for l in changed(before, after) {
        sqlx::query::<DB>(WRITE_LINK)
            .bind(l.id.as_str())
            .bind(l.allowance.map(|a| to_i64(a, "budget")).transpose()?)
            .bind(to_i64(l.held, "budget")?)
            .bind(to_i64(l.children_spent, "budget")?)
            .bind(l.returned)
            .bind(l.consumed.map(|c| to_i64(c, "budget")).transpose()?)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The spawn's grant for the child `child` of `parent` in the tree of `root`: counted in
/// the tree, and with an allowance, held by the parent and given to the child.
pub(crate) async fn grant<DB>(
    conn: &mut DB::Connection,
    root: &str,
    parent: &str,
    child: &str,
    allowance: Option<u64>,
) -> Result<()>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    sqlx::query::<DB>(COUNT_IN_TREE)
        .bind(root)
        .execute(&mut *conn)
        .await?;
    if let Some(g) = allowance {
        let g = to_i64(g, "budget")?;
        sqlx::query::<DB>(HOLD_FOR_CHILD)
            .bind(parent)
            .bind(g)
            .execute(&mut *conn)
            .await?;
        sqlx::query::<DB>(ALLOW)
            .bind(child)
            .bind(g)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// One session's ledger, if the session exists.
pub(crate) async fn ledger<'c, DB, E>(ex: E, id: &str) -> Result<Option<Ledger>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'r> LedgerRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let row: Option<LedgerRow> = sqlx::query_as::<DB, LedgerRow>(LEDGER)
        .bind(id)
        .fetch_optional(ex)
        .await?;
    Ok(row.as_ref().map(ledger_of))
}

/// Add `s` to the tenant's spend of `day`.
pub(crate) async fn add_spend<'c, DB, E>(ex: E, tenant: &str, day: &str, s: Spend) -> Result<()>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    add_spend_by(ex, ADD_SPEND, tenant, day, s).await
}

/// Run `sql`, a statement that adds `$3` tokens and `$4` nano-dollars spent by `$1` on
/// day `$2` (to the day's spend, the tenant's totals, or both).
pub(crate) async fn add_spend_by<'c, DB, E>(
    ex: E,
    sql: &str,
    tenant: &str,
    day: &str,
    s: Spend,
) -> Result<()>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    sqlx::query::<DB>(sql)
        .bind(tenant)
        .bind(day)
        .bind(to_i64(s.tokens, "tokens")?)
        .bind(to_i64(s.cost_nanos, "cost")?)
        .execute(ex)
        .await?;
    Ok(())
}

/// The tenant's spend from `from` to `to` (days, inclusive), by the dialect's `sql`.
pub(crate) async fn spend<'c, DB, E>(
    ex: E,
    sql: &str,
    tenant: &str,
    from: &str,
    to: &str,
) -> Result<Spend>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'r> (i64, i64): FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let (t, c): (i64, i64) = sqlx::query_as::<DB, (i64, i64)>(sql)
        .bind(tenant)
        .bind(from)
        .bind(to)
        .fetch_one(ex)
        .await?;
    Ok(Spend {
        tokens: count(t),
        cost_nanos: count(c),
    })
}

/// Every tenant budget, by tenant.
pub(crate) async fn budgets<'c, DB, E>(ex: E) -> Result<Vec<TenantBudget>>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'r> BudgetRow: FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let rows: Vec<BudgetRow> = sqlx::query_as::<DB, BudgetRow>(BUDGETS)
        .fetch_all(ex)
        .await?;
    rows.into_iter().map(budget_of).collect()
}
