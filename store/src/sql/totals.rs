//! A tenant's running totals (`tenant_ledger`): the statements both stores run on that
//! row — a spend added to its day and month, the row read (locked where the dialect can),
//! and the holds recounted — and the one decision both take on a hold from what it read.
//!
//! The row exists so that the common case of a hold, a tenant below its budgets, is one
//! conditional update (Postgres: `HOLD_FAST` in `pg/budget.rs`): no lock across the
//! tenant's calls, no sum over what they hold, no sum over a month of days. Only a hold
//! that update refuses takes the slow way here, which also mends what the counter may have
//! drifted by (holds of dead workers, expired and still counted).

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::budget::{HoldRefused, Spend, TenantBudget, TenantTotals, first_reached, month_key};
use crate::error::Result;
use crate::rowconv::to_i64;

use super::budget::count;

/// The `SET` of a spend added to the totals (`excluded` holding the spend, on its day and
/// month): a counter of that period grows; one of an earlier period starts again from it;
/// a spend of a period older than the row's (a call that ended across midnight and
/// settled after a later one) leaves the counter alone — it is in `tenant_spend`, and the
/// row counts only the newest period.
macro_rules! totals_set {
    () => {
        "day_tokens = CASE WHEN tenant_ledger.day = excluded.day
                      THEN tenant_ledger.day_tokens + excluded.day_tokens
                      WHEN tenant_ledger.day < excluded.day THEN excluded.day_tokens
                      ELSE tenant_ledger.day_tokens END,
    day_cost_nanos = CASE WHEN tenant_ledger.day = excluded.day
                      THEN tenant_ledger.day_cost_nanos + excluded.day_cost_nanos
                      WHEN tenant_ledger.day < excluded.day THEN excluded.day_cost_nanos
                      ELSE tenant_ledger.day_cost_nanos END,
    month_tokens = CASE WHEN tenant_ledger.month = excluded.month
                      THEN tenant_ledger.month_tokens + excluded.month_tokens
                      WHEN tenant_ledger.month < excluded.month THEN excluded.month_tokens
                      ELSE tenant_ledger.month_tokens END,
    month_cost_nanos = CASE WHEN tenant_ledger.month = excluded.month
                      THEN tenant_ledger.month_cost_nanos + excluded.month_cost_nanos
                      WHEN tenant_ledger.month < excluded.month THEN excluded.month_cost_nanos
                      ELSE tenant_ledger.month_cost_nanos END,
    day = CASE WHEN tenant_ledger.day < excluded.day THEN excluded.day ELSE tenant_ledger.day END,
    month = CASE WHEN tenant_ledger.month < excluded.month THEN excluded.month
                 ELSE tenant_ledger.month END"
    };
}
pub(crate) use totals_set;

/// The head of the upsert that adds `$3` tokens and `$4` nano-dollars spent by `$1` on day
/// `$2` to its totals; [`totals_set!`] follows it.
macro_rules! totals_upsert {
    () => {
        "INSERT INTO tenant_ledger (tenant, day, day_tokens, day_cost_nanos, month, month_tokens,
                           month_cost_nanos)
VALUES ($1, $2, $3, $4, substr($2, 1, 7), $3, $4)
ON CONFLICT (tenant) DO UPDATE SET "
    };
}
pub(crate) use totals_upsert;

/// A spend added to the totals (both dialects).
pub(crate) const ADD_TO_TOTALS: &str = concat!(totals_upsert!(), totals_set!());

/// The row a hold needs, created empty for a tenant that has none yet (`$2`, `$3`: today's
/// day and month).
pub(crate) const ENSURE: &str = "INSERT INTO tenant_ledger (tenant, day, month) VALUES ($1, $2, $3) ON CONFLICT (tenant) DO NOTHING";

pub(crate) const TOTALS: &str = "SELECT day, day_tokens, day_cost_nanos, month, month_tokens, \
     month_cost_nanos, held_tokens, held_cost_nanos FROM tenant_ledger WHERE tenant = $1";

/// [`TOTALS`], locking the row for the rest of the transaction (Postgres).
pub(crate) const TOTALS_LOCKED: &str = "SELECT day, day_tokens, day_cost_nanos, month, \
     month_tokens, month_cost_nanos, held_tokens, held_cost_nanos FROM tenant_ledger \
     WHERE tenant = $1 FOR UPDATE";

/// The tenant's totals row locked for the rest of the transaction, nothing read (Postgres):
/// taken first by every statement on a tenant's budget, so they all lock in one order.
pub(crate) const LOCK: &str = "SELECT 1 FROM tenant_ledger WHERE tenant = $1 FOR UPDATE";

/// What the holds of the tenant count once recounted (`$2`, `$3`).
const SET_HELD: &str =
    "UPDATE tenant_ledger SET held_tokens = $2, held_cost_nanos = $3 WHERE tenant = $1";

pub(crate) const HOLD_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM tenant_holds WHERE id = $1)";

type TotalsRow = (String, i64, i64, String, i64, i64, i64, i64);

fn totals_of(r: TotalsRow) -> TenantTotals {
    let spend = |t, c| Spend {
        tokens: count(t),
        cost_nanos: count(c),
    };
    TenantTotals {
        day: r.0,
        day_spend: spend(r.1, r.2),
        month: r.3,
        month_spend: spend(r.4, r.5),
        held: spend(r.6, r.7),
    }
}

/// The tenant's totals by `sql` ([`TOTALS`] or [`TOTALS_LOCKED`]); nothing spent or held
/// when it has no row.
pub(crate) async fn totals<'c, DB, E>(ex: E, sql: &str, tenant: &str) -> Result<TenantTotals>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'r> TotalsRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    let row: Option<TotalsRow> = sqlx::query_as::<DB, TotalsRow>(sql)
        .bind(tenant)
        .fetch_optional(ex)
        .await?;
    Ok(row.map(totals_of).unwrap_or_default())
}

/// Add `s`, spent by `tenant` on `day`, to its totals.
pub(crate) async fn add_to_totals<'c, DB, E>(ex: E, tenant: &str, day: &str, s: Spend) -> Result<()>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    super::ledger::add_spend_by(ex, ADD_TO_TOTALS, tenant, day, s).await
}

/// Count `held` as what the tenant's holds hold ([`SET_HELD`]).
pub(crate) async fn set_held<'c, DB, E>(ex: E, tenant: &str, held: Spend) -> Result<()>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
{
    sqlx::query::<DB>(SET_HELD)
        .bind(tenant)
        .bind(to_i64(held.tokens, "tokens")?)
        .bind(to_i64(held.cost_nanos, "cost")?)
        .execute(ex)
        .await?;
    Ok(())
}

/// Today's day and month keys as of `now`, for [`ENSURE`].
pub(crate) fn period_keys(now: DateTime<Utc>) -> (String, String) {
    (crate::budget::day_key(now.date_naive()), month_key(now))
}

/// The slow way's decision, on totals whose holds were just recounted (`held`, the first
/// of them expiring at `expires`): refused with the first budget reached, as
/// [`first_reached`] says.
pub(crate) fn decide(
    totals: &TenantTotals,
    held: Spend,
    expires: Option<DateTime<Utc>>,
    budgets: &[TenantBudget],
    now: DateTime<Utc>,
) -> Option<HoldRefused> {
    let spent = totals.spent_per_budget(budgets, now);
    first_reached(budgets, &spent, held, expires)
}
