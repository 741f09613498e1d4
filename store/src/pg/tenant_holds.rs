//! One call's tenant hold and settlement on Postgres, each by itself: the conditional
//! update of the tenant's totals row (and, when it refuses, the locked recount), and the
//! settlement's one statement. [`super::tenant_rounds`] runs these for a call alone and
//! takes calls that arrive together in one transaction.

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgPool;

use crate::budget::{HoldRefused, PeriodBounds, Spend, TenantBudget, TenantHold};
use crate::error::Result;
use crate::rowconv::to_i64;
use crate::sql::budget::count;
use crate::sql::totals::{self, totals_set, totals_upsert};

/// A hold while the tenant is below every bound: one statement that counts the call's
/// worst case on the tenant's row only if the row's spend of the current day and month
/// plus what is held stays below the tightest bound of each (`$6`–`$9`, null for none;
/// `$10`, `$11`: today's day and month), then stores the hold. The row lock orders the
/// tenant's holds and settlements; nothing else is read. A hold id already stored (a
/// retried call) counts nothing again. No row back: the slow way decides.
const HOLD_FAST: &str = "
WITH l AS (
    UPDATE tenant_ledger SET held_tokens = held_tokens + $3, held_cost_nanos = held_cost_nanos + $4
    WHERE tenant = $2
      AND NOT EXISTS (SELECT 1 FROM tenant_holds WHERE id = $1)
      AND ($6::bigint IS NULL OR (CASE WHEN day = $10 THEN day_tokens ELSE 0 END)::numeric
                                  + held_tokens < $6)
      AND ($7::bigint IS NULL OR (CASE WHEN day = $10 THEN day_cost_nanos ELSE 0 END)::numeric
                                  + held_cost_nanos < $7)
      AND ($8::bigint IS NULL OR (CASE WHEN month = $11 THEN month_tokens ELSE 0 END)::numeric
                                  + held_tokens < $8)
      AND ($9::bigint IS NULL OR (CASE WHEN month = $11 THEN month_cost_nanos ELSE 0 END)::numeric
                                  + held_cost_nanos < $9)
    RETURNING 1)
INSERT INTO tenant_holds (id, tenant, tokens, cost_nanos, expires_at)
SELECT $1, $2, $3, $4, now() + make_interval(secs => $5) FROM l
RETURNING 1";

/// The tenant's holds recounted: expired ones (their worker died) dropped first.
const DROP_EXPIRED: &str = "DELETE FROM tenant_holds WHERE tenant = $1 AND expires_at <= now()";
const HELD: &str = "
SELECT COALESCE(sum(tokens), 0)::bigint, COALESCE(sum(cost_nanos), 0)::bigint, min(expires_at)
FROM tenant_holds WHERE tenant = $1";

const INSERT_HOLD: &str = "
INSERT INTO tenant_holds (id, tenant, tokens, cost_nanos, expires_at)
VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))";

/// The hold becomes the call's spend, in one statement: the hold goes, the spend is added
/// to the tenant's day and to its totals, and the totals stop counting the hold (if it
/// was still there: one that expired was dropped from them when recounted).
const SETTLE_HOLD: &str = concat!(
    "
WITH gone AS (DELETE FROM tenant_holds WHERE id = $5 RETURNING tokens, cost_nanos),
spent AS (
    INSERT INTO tenant_spend (tenant, day, tokens, cost_nanos) VALUES ($1, $2, $3, $4)
    ON CONFLICT (tenant, day) DO UPDATE SET
        tokens = tenant_spend.tokens + excluded.tokens,
        cost_nanos = tenant_spend.cost_nanos + excluded.cost_nanos)
",
    totals_upsert!(),
    totals_set!(),
    ",
    held_tokens = GREATEST(tenant_ledger.held_tokens
                           - COALESCE((SELECT sum(tokens) FROM gone), 0), 0),
    held_cost_nanos = GREATEST(tenant_ledger.held_cost_nanos
                               - COALESCE((SELECT sum(cost_nanos) FROM gone), 0), 0)"
);

/// See [`crate::store::BudgetStore::hold_tenant_spend`]: [`HOLD_FAST`], else [`slow_hold`].
pub(super) async fn hold(
    pool: &PgPool,
    hold: &TenantHold,
    budgets: &[TenantBudget],
    now: DateTime<Utc>,
) -> Result<Option<HoldRefused>> {
    let bounds = PeriodBounds::of(budgets);
    let (day, month) = totals::period_keys(now);
    let held: Option<i32> = sqlx::query_scalar(HOLD_FAST)
        .bind(&hold.id)
        .bind(&hold.tenant)
        .bind(to_i64(hold.worst.tokens, "tokens")?)
        .bind(to_i64(hold.worst.cost_nanos, "cost")?)
        .bind(hold.ttl.as_secs_f64())
        .bind(bounds.day_tokens)
        .bind(bounds.day_cost_nanos)
        .bind(bounds.month_tokens)
        .bind(bounds.month_cost_nanos)
        .bind(&day)
        .bind(&month)
        .fetch_optional(pool)
        .await?;
    if held.is_some() {
        return Ok(None);
    }
    slow_hold(pool, hold, budgets, now, (&day, &month)).await
}

/// A hold the fast statement did not take: the tenant has no row yet, the hold is a
/// retry, or a bound is reached. On the row, locked: the holds recounted (which mends a
/// count of expired holds), then the decision, then the hold; a refusal keeps the
/// recount.
async fn slow_hold(
    pool: &PgPool,
    hold: &TenantHold,
    budgets: &[TenantBudget],
    now: DateTime<Utc>,
    (day, month): (&str, &str),
) -> Result<Option<HoldRefused>> {
    let mut tx = pool.begin().await?;
    sqlx::query(totals::ENSURE)
        .bind(&hold.tenant)
        .bind(day)
        .bind(month)
        .execute(&mut *tx)
        .await?;
    let row = totals::totals::<Postgres, _>(&mut *tx, totals::TOTALS_LOCKED, &hold.tenant).await?;
    let exists: bool = sqlx::query_scalar(totals::HOLD_EXISTS)
        .bind(&hold.id)
        .fetch_one(&mut *tx)
        .await?;
    if exists {
        tx.commit().await?;
        return Ok(None);
    }
    let (held, expires) = recount(&mut tx, &hold.tenant).await?;
    let refused = totals::decide(&row, held, expires, budgets, now);
    let held = if refused.is_some() {
        held
    } else {
        sqlx::query(INSERT_HOLD)
            .bind(&hold.id)
            .bind(&hold.tenant)
            .bind(to_i64(hold.worst.tokens, "tokens")?)
            .bind(to_i64(hold.worst.cost_nanos, "cost")?)
            .bind(hold.ttl.as_secs_f64())
            .execute(&mut *tx)
            .await?;
        held.plus(hold.worst)
    };
    totals::set_held::<Postgres, _>(&mut *tx, &hold.tenant, held).await?;
    tx.commit().await?;
    Ok(refused)
}

/// What `tenant`'s holds hold, recounted in `tx` after the expired ones (their worker
/// died) are dropped, and when the first of the rest expires.
pub(super) async fn recount(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    tenant: &str,
) -> Result<(Spend, Option<DateTime<Utc>>)> {
    sqlx::query(DROP_EXPIRED)
        .bind(tenant)
        .execute(&mut **tx)
        .await?;
    let (t, c, first): (i64, i64, Option<DateTime<Utc>>) = sqlx::query_as(HELD)
        .bind(tenant)
        .fetch_one(&mut **tx)
        .await?;
    let held = Spend {
        tokens: count(t),
        cost_nanos: count(c),
    };
    Ok((held, first))
}

/// [`SETTLE_HOLD`], alone or in a transaction.
pub(super) async fn settle_hold<'e, E: sqlx::PgExecutor<'e>>(
    conn: E,
    id: &str,
    tenant: &str,
    day: &str,
    s: Spend,
) -> Result<()> {
    sqlx::query(SETTLE_HOLD)
        .bind(tenant)
        .bind(day)
        .bind(to_i64(s.tokens, "tokens")?)
        .bind(to_i64(s.cost_nanos, "cost")?)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// See [`crate::store::BudgetStore::settle_tenant_hold_if_held`]. The tenant's totals row
/// is locked first, as every statement on a tenant's budget locks it: a settlement of the
/// same hold still in flight (the one whose answer was lost) holds that lock until it
/// commits or rolls back, so the hold seen after it is the truth. No totals row: no hold.
pub(super) async fn settle_if_held(
    pool: &PgPool,
    id: &str,
    tenant: &str,
    day: &str,
    s: Spend,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    let row: Option<i32> = sqlx::query_scalar(totals::LOCK)
        .bind(tenant)
        .fetch_optional(&mut *tx)
        .await?;
    let held = row.is_some()
        && sqlx::query_scalar::<_, bool>(totals::HOLD_EXISTS)
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
    if held {
        settle_hold(&mut *tx, id, tenant, day, s).await?;
    }
    tx.commit().await?;
    Ok(held)
}
