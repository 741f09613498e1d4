//! Budgets on Postgres: the spawn's transaction (tree cap, the child's grant, the insert),
//! the ledger's reads, give-backs and re-openings, tenant budgets and spend.
//!
//! Every write to a tree's ledger (a spawn, a give-back, a re-opening) locks the tree's
//! root row first: they run one at a time per tree, on every worker and scheduler, and
//! never wait on each other's row locks crosswise.

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::postgres::{PgConnection, PgPool};

use crate::budget::{
    HoldRefused, Ledger, ModelUsage, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use crate::error::Result;
use crate::model::{NewSession, SessionRow};
use crate::rowconv::to_i64;
use crate::sql::budget::{
    LedgerRow, UsageRow, check_spawn, give_back, reopen, usage_of, with_grant,
};
use crate::sql::ledger;
use crate::sql::record::SessionRecord;
use crate::sql::statements::COLS;
use crate::sql::totals::{totals_set, totals_upsert};
use crate::store::BudgetStore;

use super::tenant_holds;
use super::tenant_rounds::{self, Op};
use super::{PgStore, create};

/// The rows a spawn checks, locked root first (`$2`; see the module docs), then by id.
const LOCK_TREE: &str = "
SELECT id, tree_sessions, input_tokens + output_tokens, budget_allowance, budget_held,
       budget_children_spent
FROM sessions WHERE id = ANY($1) ORDER BY id = $2 DESC, id FOR UPDATE";

/// Whether the session is a finished child whose allowance has not gone back: the one
/// case in which a give-back has anything to do, checked before taking the root's lock.
const GIVE_BACK_DUE: &str = "
SELECT EXISTS (SELECT 1 FROM sessions
    WHERE id = $1 AND budget_allowance IS NOT NULL AND budget_returned = false
      AND parent_id IS NOT NULL AND status IN ('completed', 'failed', 'cancelled'))";

const UNRETURNED: &str = "
SELECT id FROM sessions
WHERE budget_allowance IS NOT NULL AND budget_returned = false
  AND status IN ('completed', 'failed', 'cancelled')
ORDER BY id LIMIT $1";

/// Usage per model of a tree: the model its worker called, else the spec's (JSON, read
/// from the specs table).
const TREE_USAGE: &str = "
SELECT COALESCE(s.model_used, p.spec->>'model'), count(*), sum(s.input_tokens)::bigint, sum(s.output_tokens)::bigint,
       sum(s.cache_read_tokens)::bigint, sum(s.cache_write_tokens)::bigint,
       sum(s.reasoning_tokens)::bigint, sum(s.web_search_requests)::bigint
FROM sessions s JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id
WHERE s.root_id = $1
GROUP BY 1 ORDER BY 1";

const SET_BUDGET: &str = "
INSERT INTO tenant_budgets (tenant, period, tokens, usd_nanos, on_budget, updated_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (tenant) DO UPDATE SET period = excluded.period, tokens = excluded.tokens,
    usd_nanos = excluded.usd_nanos, on_budget = excluded.on_budget, updated_at = now()";

const SPEND: &str = "
SELECT COALESCE(sum(tokens), 0)::bigint, COALESCE(sum(cost_nanos), 0)::bigint
FROM tenant_spend WHERE tenant = $1 AND day >= $2 AND day <= $3";

/// A spend with no hold: the tenant's day and its totals.
const ADD_SPEND: &str = concat!(
    "
WITH spent AS (
    INSERT INTO tenant_spend (tenant, day, tokens, cost_nanos) VALUES ($1, $2, $3, $4)
    ON CONFLICT (tenant, day) DO UPDATE SET
        tokens = tenant_spend.tokens + excluded.tokens,
        cost_nanos = tenant_spend.cost_nanos + excluded.cost_nanos)
",
    totals_upsert!(),
    totals_set!()
);

async fn existing(pool: &PgPool, new: &NewSession) -> Result<Option<Spawned>> {
    let Some(key) = &new.idempotency_key else {
        return Ok(None);
    };
    let sql = format!("SELECT {COLS} FROM sessions WHERE tenant = $1 AND idempotency_key = $2");
    let rec: Option<SessionRecord> = sqlx::query_as(&sql)
        .bind(&new.tenant)
        .bind(key)
        .fetch_optional(pool)
        .await?;
    rec.map(|r| r.into_row().map(Spawned::Existing)).transpose()
}

pub(super) async fn spawn_session(
    pool: &PgPool,
    new: &NewSession,
    limits: &SpawnLimits,
) -> Result<Spawned> {
    if let Some(e) = existing(pool, new).await? {
        return Ok(e);
    }
    let mut tx = pool.begin().await?;
    let parent = new.parent_id.clone().unwrap_or_else(|| new.root_id.clone());
    let ids = vec![new.root_id.clone(), parent.clone()];
    let rows: Vec<LedgerRow> = sqlx::query_as(LOCK_TREE)
        .bind(&ids)
        .bind(&new.root_id)
        .fetch_all(&mut *tx)
        .await?;
    let g = match check_spawn(new, limits, &rows)? {
        Ok(g) => g,
        Err(refused) => {
            tx.rollback().await?;
            return Ok(refused);
        }
    };
    let child = with_grant(new, g);
    let mut inserted = create::insert(&mut *tx, std::slice::from_ref(&child)).await?;
    let Some(row) = inserted.remove(&child.id) else {
        // A concurrent spawn of the same call inserted it: answer with that one.
        tx.rollback().await?;
        return existing(pool, new)
            .await?
            .ok_or_else(|| crate::sql::outcome::unreadable_conflict(new));
    };
    ledger::grant::<Postgres>(&mut tx, &new.root_id, &parent, &child.id, g).await?;
    tx.commit().await?;
    Ok(Spawned::Created(row))
}

pub(super) async fn return_budget(pool: &PgPool, id: &str) -> Result<bool> {
    let due: bool = sqlx::query_scalar(GIVE_BACK_DUE)
        .bind(id)
        .fetch_one(pool)
        .await?;
    if !due {
        return Ok(false);
    }
    let mut tx = pool.begin().await?;
    if lock_root(&mut tx, id).await?.is_none() {
        return Ok(false);
    }
    // Read again under the lock: a racing give-back or re-opening may have come first.
    let due: bool = sqlx::query_scalar(GIVE_BACK_DUE)
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
    if !due {
        return Ok(false);
    }
    let mut links = ledger::chain::<Postgres>(&mut tx, id).await?;
    let before = links.clone();
    if !give_back(&mut links) {
        return Ok(false);
    }
    ledger::write_links::<Postgres>(&mut tx, &before, &links).await?;
    tx.commit().await?;
    Ok(true)
}

/// Lock the root of `id`'s tree (see the module docs) and read it; `None` when there is
/// no such session.
pub(super) async fn lock_root(conn: &mut PgConnection, id: &str) -> Result<Option<SessionRow>> {
    let sql = format!(
        "SELECT {COLS} FROM sessions \
         WHERE id = (SELECT root_id FROM sessions WHERE id = $1) FOR UPDATE"
    );
    let rec: Option<SessionRecord> = sqlx::query_as(&sql)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    rec.map(SessionRecord::into_row).transpose()
}

/// Re-open `row` (just queued again by a follow-up or a retry, in this transaction) on
/// its tree's ledger, under the lock of its tree's root `root` ([`lock_root`]): see
/// [`crate::sql::budget::reopen`]. `Error::NoBudget` when the tree has nothing to give
/// it; the caller's transaction is then dropped, changing nothing.
pub(super) async fn reopen_in(
    conn: &mut PgConnection,
    row: &SessionRow,
    root: &SessionRow,
) -> Result<()> {
    let mut links = ledger::chain::<Postgres>(conn, &row.id).await?;
    let before = links.clone();
    match reopen(&mut links, root.spec.token_budget, row.spec.token_budget) {
        Ok(true) => ledger::write_links::<Postgres>(conn, &before, &links).await,
        Ok(false) => Ok(()),
        Err(no_room) => Err(no_room.error(&row.id)),
    }
}

pub(super) async fn unreturned(pool: &PgPool, limit: u32) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(UNRETURNED)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?)
}

pub(super) async fn tree_usage(pool: &PgPool, root_id: &str) -> Result<Vec<ModelUsage>> {
    let rows: Vec<UsageRow> = sqlx::query_as(TREE_USAGE)
        .bind(root_id)
        .fetch_all(pool)
        .await?;
    Ok(usage_of(rows))
}

async fn add_spend(pool: &PgPool, tenant: &str, day: &str, s: Spend) -> Result<()> {
    ledger::add_spend_by(pool, ADD_SPEND, tenant, day, s).await
}

pub(super) async fn set_budget(pool: &PgPool, b: &TenantBudget) -> Result<()> {
    sqlx::query(SET_BUDGET)
        .bind(&b.tenant)
        .bind(b.period.as_str())
        .bind(b.tokens.map(|t| to_i64(t, "tokens")).transpose()?)
        .bind(b.usd_nanos.map(|t| to_i64(t, "usd")).transpose()?)
        .bind(b.on_budget.as_str())
        .execute(pool)
        .await?;
    Ok(())
}

#[async_trait]
impl BudgetStore for PgStore {
    async fn spawn_session(&self, new: &NewSession, limits: &SpawnLimits) -> Result<Spawned> {
        spawn_session(&self.pool, new, limits).await
    }

    async fn ledger(&self, id: &str) -> Result<Option<Ledger>> {
        ledger::ledger(&self.pool, id).await
    }

    async fn return_budget(&self, id: &str) -> Result<bool> {
        return_budget(&self.pool, id).await
    }

    async fn unreturned_budgets(&self, limit: u32) -> Result<Vec<String>> {
        unreturned(&self.pool, limit).await
    }

    async fn tree_usage(&self, root_id: &str) -> Result<Vec<ModelUsage>> {
        tree_usage(&self.pool, root_id).await
    }

    async fn add_tenant_spend(&self, tenant: &str, day: &str, spend: Spend) -> Result<()> {
        add_spend(&self.pool, tenant, day, spend).await
    }

    async fn tenant_spend(&self, tenant: &str, from: &str, to: &str) -> Result<Spend> {
        ledger::spend(&self.pool, SPEND, tenant, from, to).await
    }

    async fn hold_tenant_spend(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<HoldRefused>> {
        tenant_rounds::ask(&self.rounds, &self.pool, &hold.tenant, |done| Op::Hold {
            hold: hold.clone(),
            budgets: budgets.to_vec(),
            now,
            done,
        })
        .await
    }

    async fn settle_tenant_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<()> {
        tenant_rounds::ask(&self.rounds, &self.pool, tenant, |done| Op::Settle {
            id: id.to_string(),
            day: day.to_string(),
            spend,
            done,
        })
        .await
    }

    async fn settle_tenant_hold_if_held(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<bool> {
        tenant_rounds::again(|| tenant_holds::settle_if_held(&self.pool, id, tenant, day, spend))
            .await
    }

    async fn set_tenant_budget(&self, b: &TenantBudget) -> Result<()> {
        set_budget(&self.pool, b).await
    }

    async fn tenant_budgets(&self) -> Result<Vec<TenantBudget>> {
        ledger::budgets(&self.pool).await
    }
}
