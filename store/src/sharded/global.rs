//! Rows of no tree on the sharded store: API keys, stored queues, stored tenant budgets
//! and schedules on the control shard; a tenant's spend and holds on its home shard, so
//! that the check of its budget stays one transaction; a tree's ledger on its shard.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::ShardedStore;
use crate::auth::{ApiKey, NewApiKey};
use crate::budget::{
    HoldRefused, Ledger, ModelUsage, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use crate::error::Result;
use crate::model::NewSession;
use crate::schedule::{Advance, FireRow, NewSchedule, ScheduleRow};
use crate::store::{BudgetStore, KeyStore, QueueCreate, QueueStore, ScheduleStore, Store};

#[async_trait]
impl<S: Store> KeyStore for ShardedStore<S> {
    async fn create_key(&self, key: &NewApiKey) -> Result<ApiKey> {
        self.control().create_key(key).await
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>> {
        self.control().list_keys().await
    }

    async fn revoke_key(&self, id: &str) -> Result<Option<ApiKey>> {
        self.control().revoke_key(id).await
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>> {
        self.control().key(id).await
    }
}

#[async_trait]
impl<S: Store> QueueStore for ShardedStore<S> {
    async fn create_queue(&self, name: &str, limit: usize) -> Result<QueueCreate> {
        self.control().create_queue(name, limit).await
    }

    async fn stored_queues(&self) -> Result<Vec<String>> {
        self.control().stored_queues().await
    }
}

#[async_trait]
impl<S: Store> BudgetStore for ShardedStore<S> {
    async fn spawn_session(&self, new: &NewSession, limits: &SpawnLimits) -> Result<Spawned> {
        let new = self.placed(new);
        by_id!(self, "spawn_session", &new.root_id, |s| s
            .spawn_session(&new, limits))
    }

    async fn ledger(&self, id: &str) -> Result<Option<Ledger>> {
        by_id!(self, "ledger", id, |s| s.ledger(id))
    }

    async fn return_budget(&self, id: &str) -> Result<bool> {
        by_id!(self, "return_budget", id, |s| s.return_budget(id))
    }

    async fn unreturned_budgets(&self, limit: u32) -> Result<Vec<String>> {
        self.concat(|s| s.unreturned_budgets(limit)).await
    }

    async fn tree_usage(&self, root_id: &str) -> Result<Vec<ModelUsage>> {
        by_id!(self, "tree_usage", root_id, |s| s.tree_usage(root_id))
    }

    async fn add_tenant_spend(&self, tenant: &str, day: &str, spend: Spend) -> Result<()> {
        self.home(tenant).add_tenant_spend(tenant, day, spend).await
    }

    async fn hold_tenant_spend(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: DateTime<Utc>,
    ) -> Result<Option<HoldRefused>> {
        self.home(&hold.tenant)
            .hold_tenant_spend(hold, budgets, now)
            .await
    }

    async fn settle_tenant_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<()> {
        self.home(tenant)
            .settle_tenant_hold(id, tenant, day, spend)
            .await
    }

    async fn settle_tenant_hold_if_held(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<bool> {
        self.home(tenant)
            .settle_tenant_hold_if_held(id, tenant, day, spend)
            .await
    }

    async fn tenant_spend(&self, tenant: &str, from: &str, to: &str) -> Result<Spend> {
        self.home(tenant).tenant_spend(tenant, from, to).await
    }

    async fn set_tenant_budget(&self, budget: &TenantBudget) -> Result<()> {
        self.control().set_tenant_budget(budget).await
    }

    async fn tenant_budgets(&self) -> Result<Vec<TenantBudget>> {
        self.control().tenant_budgets().await
    }
}

#[async_trait]
impl<S: Store> ScheduleStore for ShardedStore<S> {
    async fn create_schedule(&self, new: &NewSchedule) -> Result<()> {
        self.control().create_schedule(new).await
    }

    async fn schedule(&self, id: &str) -> Result<Option<ScheduleRow>> {
        self.control().schedule(id).await
    }

    async fn list_schedules(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>> {
        self.control().list_schedules(tenant, after, limit).await
    }

    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        self.control().delete_schedule(id).await
    }

    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: DateTime<Utc>,
    ) -> Result<bool> {
        self.control()
            .set_schedule_paused(id, paused, next_fire_at)
            .await
    }

    async fn claim_schedules(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>> {
        self.control()
            .claim_schedules(now, until, token, limit)
            .await
    }

    async fn claim_schedule(
        &self,
        id: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
    ) -> Result<Option<ScheduleRow>> {
        self.control().claim_schedule(id, now, until, token).await
    }

    async fn record_fires(
        &self,
        id: &str,
        token: &str,
        fires: &[FireRow],
        advance: &Advance,
    ) -> Result<bool> {
        self.control().record_fires(id, token, fires, advance).await
    }

    async fn list_fires(
        &self,
        id: &str,
        before: Option<DateTime<Utc>>,
        limit: u32,
    ) -> Result<Vec<FireRow>> {
        self.control().list_fires(id, before, limit).await
    }
}
