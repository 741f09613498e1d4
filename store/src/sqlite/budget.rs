//! Budgets on SQLite: the same steps as on Postgres, each write inside one `BEGIN
//! IMMEDIATE` transaction, which holds the file's write lock as the row locks do there.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{Sqlite, SqliteConnection};

use crate::budget::{
    HoldRefused, Ledger, ModelUsage, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use crate::error::Result;
use crate::model::{NewSession, SessionRow};
use crate::rowconv::to_i64;
use crate::sql::budget::{
    LedgerRow, UsageRow, check_spawn, count, give_back, reopen, usage_of, with_grant,
};
use crate::sql::ledger;
use crate::sql::totals;
use crate::store::BudgetStore;

use super::tx::{now_us, record_in};
use super::{SqliteStore, writes};

const LEDGER: &str = "
SELECT id, tree_sessions, input_tokens + output_tokens, budget_allowance, budget_held,
       budget_children_spent
FROM sessions WHERE id IN ($1, $2)";

/// Whether the session is a finished child whose allowance has not gone back.
const GIVE_BACK_DUE: &str = "
SELECT EXISTS (SELECT 1 FROM sessions
    WHERE id = $1 AND budget_allowance IS NOT NULL AND budget_returned = 0
      AND parent_id IS NOT NULL AND status IN ('completed', 'failed', 'cancelled'))";

const UNRETURNED: &str = "
SELECT id FROM sessions
WHERE budget_allowance IS NOT NULL AND budget_returned = 0
  AND status IN ('completed', 'failed', 'cancelled')
ORDER BY id LIMIT $1";

const TREE_USAGE: &str = "
SELECT COALESCE(s.model_used, json_extract(p.spec, '$.model')), count(*), sum(s.input_tokens), sum(s.output_tokens),
       sum(s.cache_read_tokens), sum(s.cache_write_tokens), sum(s.reasoning_tokens),
       sum(s.web_search_requests)
FROM sessions s JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id
WHERE s.root_id = $1
GROUP BY 1 ORDER BY 1";

const SPEND: &str = "
SELECT COALESCE(sum(tokens), 0), COALESCE(sum(cost_nanos), 0)
FROM tenant_spend WHERE tenant = $1 AND day >= $2 AND day <= $3";

/// What the tenant's calls in flight hold, and when the first of those holds expires
/// (after [`DROP_EXPIRED`]).
const HELD: &str = "
SELECT COALESCE(sum(tokens), 0), COALESCE(sum(cost_nanos), 0), min(expires_at)
FROM tenant_holds WHERE tenant = $1";

/// A settled hold no longer counted in the tenant's totals.
const UNHOLD: &str = "
UPDATE tenant_ledger SET held_tokens = max(held_tokens - $2, 0),
    held_cost_nanos = max(held_cost_nanos - $3, 0)
WHERE tenant = $1";

const DROP_EXPIRED: &str = "DELETE FROM tenant_holds WHERE tenant = $1 AND expires_at <= $2";

const INSERT_HOLD: &str = "
INSERT INTO tenant_holds (id, tenant, tokens, cost_nanos, expires_at)
VALUES ($1, $2, $3, $4, $5)";

const SET_BUDGET: &str = "
INSERT INTO tenant_budgets (tenant, period, tokens, usd_nanos, on_budget, updated_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (tenant) DO UPDATE SET period = excluded.period, tokens = excluded.tokens,
    usd_nanos = excluded.usd_nanos, on_budget = excluded.on_budget,
    updated_at = excluded.updated_at";

impl SqliteStore {
    pub(super) async fn spawn_in_tree(
        &self,
        new: &NewSession,
        limits: &SpawnLimits,
    ) -> Result<Spawned> {
        let mut tx = self.write_tx().await?;
        if let Some(key) = &new.idempotency_key {
            let id: Option<String> = sqlx::query_scalar(
                "SELECT id FROM sessions WHERE tenant = $1 AND idempotency_key = $2",
            )
            .bind(&new.tenant)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(id) = id {
                let rec = record_in(&mut tx, &id).await?;
                tx.commit().await?;
                if let Some(r) = rec {
                    return Ok(Spawned::Existing(r.into_row()?));
                }
                return Err(crate::sql::outcome::unreadable_conflict(new));
            }
        }
        let parent = new.parent_id.clone().unwrap_or_else(|| new.root_id.clone());
        let rows: Vec<LedgerRow> = sqlx::query_as(LEDGER)
            .bind(&new.root_id)
            .bind(&parent)
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
        let (row, created) = writes::create(&mut tx, &child, now_us()).await?;
        if !created {
            tx.commit().await?;
            return Ok(Spawned::Existing(row));
        }
        ledger::grant::<Sqlite>(&mut tx, &new.root_id, &parent, &child.id, g).await?;
        tx.commit().await?;
        Ok(Spawned::Created(row))
    }

    pub(super) async fn give_back(&self, id: &str) -> Result<bool> {
        let due: bool = sqlx::query_scalar(GIVE_BACK_DUE)
            .bind(id)
            .fetch_one(&self.readers)
            .await?;
        if !due {
            return Ok(false);
        }
        let mut tx = self.write_tx().await?;
        // Read again in the write transaction: a racing give-back or re-opening may have
        // come first.
        let due: bool = sqlx::query_scalar(GIVE_BACK_DUE)
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        if !due {
            tx.commit().await?;
            return Ok(false);
        }
        let mut links = ledger::chain::<Sqlite>(&mut tx, id).await?;
        let before = links.clone();
        let done = give_back(&mut links);
        ledger::write_links::<Sqlite>(&mut tx, &before, &links).await?;
        tx.commit().await?;
        Ok(done)
    }

    pub(super) async fn unreturned(&self, limit: u32) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(UNRETURNED)
            .bind(i64::from(limit))
            .fetch_all(&self.readers)
            .await?)
    }

    pub(super) async fn usage_of_tree(&self, root_id: &str) -> Result<Vec<ModelUsage>> {
        let rows: Vec<UsageRow> = sqlx::query_as(TREE_USAGE)
            .bind(root_id)
            .fetch_all(&self.readers)
            .await?;
        Ok(usage_of(rows))
    }

    /// See [`crate::store::BudgetStore::hold_tenant_spend`]: the write transaction
    /// serialises it with every other writer, so it takes the way Postgres takes only when
    /// its one statement refuses: the tenant's row, its holds recounted, the decision.
    pub(super) async fn hold(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: DateTime<Utc>,
    ) -> Result<Option<HoldRefused>> {
        let mut tx = self.write_tx().await?;
        let exists: bool = sqlx::query_scalar(totals::HOLD_EXISTS)
            .bind(&hold.id)
            .fetch_one(&mut *tx)
            .await?;
        if exists {
            tx.rollback().await?;
            return Ok(None);
        }
        let (day, month) = totals::period_keys(now);
        sqlx::query(totals::ENSURE)
            .bind(&hold.tenant)
            .bind(&day)
            .bind(&month)
            .execute(&mut *tx)
            .await?;
        let row = totals::totals::<Sqlite, _>(&mut *tx, totals::TOTALS, &hold.tenant).await?;
        let at = now_us();
        sqlx::query(DROP_EXPIRED)
            .bind(&hold.tenant)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        let (t, c, expires): (i64, i64, Option<i64>) = sqlx::query_as(HELD)
            .bind(&hold.tenant)
            .fetch_one(&mut *tx)
            .await?;
        let expires = expires.and_then(DateTime::from_timestamp_micros);
        let held = Spend {
            tokens: count(t),
            cost_nanos: count(c),
        };
        let refused = totals::decide(&row, held, expires, budgets, now);
        let held = if refused.is_some() {
            held
        } else {
            let ttl_us = i64::try_from(hold.ttl.as_micros()).unwrap_or(i64::MAX);
            sqlx::query(INSERT_HOLD)
                .bind(&hold.id)
                .bind(&hold.tenant)
                .bind(to_i64(hold.worst.tokens, "tokens")?)
                .bind(to_i64(hold.worst.cost_nanos, "cost")?)
                .bind(at.saturating_add(ttl_us))
                .execute(&mut *tx)
                .await?;
            held.plus(hold.worst)
        };
        totals::set_held::<Sqlite, _>(&mut *tx, &hold.tenant, held).await?;
        tx.commit().await?;
        Ok(refused)
    }

    /// The settlement, or with `only_held` nothing when the hold is gone; whether it
    /// counted the spend. One write transaction: the hold's presence cannot change
    /// between the look and the settlement.
    pub(super) async fn settle_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        s: Spend,
        only_held: bool,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let gone: Option<(i64, i64)> =
            sqlx::query_as("DELETE FROM tenant_holds WHERE id = $1 RETURNING tokens, cost_nanos")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        match gone {
            Some((t, c)) => {
                sqlx::query(UNHOLD)
                    .bind(tenant)
                    .bind(t)
                    .bind(c)
                    .execute(&mut *tx)
                    .await?;
            }
            None if only_held => {
                tx.commit().await?;
                return Ok(false);
            }
            None => {}
        }
        ledger::add_spend(&mut *tx, tenant, day, s).await?;
        totals::add_to_totals(&mut *tx, tenant, day, s).await?;
        tx.commit().await?;
        Ok(true)
    }

    pub(super) async fn set_budget(&self, b: &TenantBudget) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(SET_BUDGET)
            .bind(&b.tenant)
            .bind(b.period.as_str())
            .bind(b.tokens.map(|t| to_i64(t, "tokens")).transpose()?)
            .bind(b.usd_nanos.map(|t| to_i64(t, "usd")).transpose()?)
            .bind(b.on_budget.as_str())
            .bind(now_us())
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}

/// Re-open `row` (just queued again by a follow-up or a retry, in this write
/// transaction) on its tree's ledger: see [`crate::sql::budget::reopen`].
/// `Error::NoBudget` when the tree has nothing to give it; the caller's transaction is
/// then dropped, changing nothing.
pub(super) async fn reopen_in(conn: &mut SqliteConnection, row: &SessionRow) -> Result<()> {
    let root_budget = if row.parent_id.is_none() {
        row.spec.token_budget
    } else {
        record_in(conn, &row.root_id)
            .await?
            .map(|r| r.into_row())
            .transpose()?
            .and_then(|r| r.spec.token_budget)
    };
    let mut links = ledger::chain::<Sqlite>(conn, &row.id).await?;
    let before = links.clone();
    match reopen(&mut links, root_budget, row.spec.token_budget) {
        Ok(true) => ledger::write_links::<Sqlite>(conn, &before, &links).await,
        Ok(false) => Ok(()),
        Err(no_room) => Err(no_room.error(&row.id)),
    }
}

#[async_trait]
impl BudgetStore for SqliteStore {
    async fn spawn_session(&self, new: &NewSession, limits: &SpawnLimits) -> Result<Spawned> {
        self.spawn_in_tree(new, limits).await
    }

    async fn ledger(&self, id: &str) -> Result<Option<Ledger>> {
        ledger::ledger(&self.readers, id).await
    }

    async fn return_budget(&self, id: &str) -> Result<bool> {
        self.give_back(id).await
    }

    async fn unreturned_budgets(&self, limit: u32) -> Result<Vec<String>> {
        self.unreturned(limit).await
    }

    async fn tree_usage(&self, root_id: &str) -> Result<Vec<ModelUsage>> {
        self.usage_of_tree(root_id).await
    }

    async fn add_tenant_spend(&self, tenant: &str, day: &str, spend: Spend) -> Result<()> {
        let mut tx = self.write_tx().await?;
        ledger::add_spend(&mut *tx, tenant, day, spend).await?;
        totals::add_to_totals(&mut *tx, tenant, day, spend).await?;
        tx.commit().await
    }

    async fn tenant_spend(&self, tenant: &str, from: &str, to: &str) -> Result<Spend> {
        ledger::spend(&self.readers, SPEND, tenant, from, to).await
    }

    async fn hold_tenant_spend(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<HoldRefused>> {
        self.hold(hold, budgets, now).await
    }

    async fn settle_tenant_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<()> {
        self.settle_hold(id, tenant, day, spend, false)
            .await
            .map(drop)
    }

    async fn settle_tenant_hold_if_held(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<bool> {
        self.settle_hold(id, tenant, day, spend, true).await
    }

    async fn set_tenant_budget(&self, b: &TenantBudget) -> Result<()> {
        self.set_budget(b).await
    }

    async fn tenant_budgets(&self) -> Result<Vec<TenantBudget>> {
        ledger::budgets(&self.readers).await
    }
}
