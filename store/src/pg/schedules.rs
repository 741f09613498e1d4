//! Schedules on Postgres: the shared statements of `crate::sql::schedules` on the pool,
//! a fire's record in one transaction.

use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::schedule::{Advance, FireRow, NewSchedule, ScheduleRow};
use crate::sql::schedules::{self as sql, ScheduleStatements, Which};
use crate::sql::webhooks::exec;
use crate::store::ScheduleStore;

use super::PgStore;

static SQL: LazyLock<ScheduleStatements> = LazyLock::new(ScheduleStatements::postgres);

#[async_trait]
impl ScheduleStore for PgStore {
    async fn create_schedule(&self, new: &NewSchedule) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        sql::create::<sqlx::Postgres>(&mut *conn, new).await
    }

    async fn schedule(&self, id: &str) -> Result<Option<ScheduleRow>> {
        let mut conn = self.pool.acquire().await?;
        sql::one::<sqlx::Postgres>(&mut *conn, id).await
    }

    async fn list_schedules(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>> {
        let mut conn = self.pool.acquire().await?;
        sql::list::<sqlx::Postgres>(&mut *conn, tenant, after, limit).await
    }

    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        Ok(exec::<sqlx::Postgres>(&mut *conn, sql::DELETE, id).await? > 0)
    }

    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: DateTime<Utc>,
    ) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        sql::set_paused::<sqlx::Postgres>(&mut *conn, id, paused, next_fire_at).await
    }

    async fn claim_schedules(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>> {
        let mut conn = self.pool.acquire().await?;
        sql::claim::<sqlx::Postgres>(&mut *conn, &SQL.claim, now, until, token, Which::Due(limit))
            .await
    }

    async fn claim_schedule(
        &self,
        id: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
    ) -> Result<Option<ScheduleRow>> {
        let mut conn = self.pool.acquire().await?;
        let rows = sql::claim::<sqlx::Postgres>(
            &mut *conn,
            &SQL.claim_one,
            now,
            until,
            token,
            Which::One(id),
        )
        .await?;
        Ok(rows.into_iter().next())
    }

    async fn record_fires(
        &self,
        id: &str,
        token: &str,
        fires: &[FireRow],
        advance: &Advance,
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let held = sql::record::<sqlx::Postgres>(&mut *tx, id, token, fires, advance).await?;
        if held {
            tx.commit().await?;
        }
        Ok(held)
    }

    async fn list_fires(
        &self,
        id: &str,
        before: Option<DateTime<Utc>>,
        limit: u32,
    ) -> Result<Vec<FireRow>> {
        let mut conn = self.pool.acquire().await?;
        sql::fires::<sqlx::Postgres>(&mut *conn, id, before, limit).await
    }
}
