//! Schedules in the SQLite file: the shared statements of `crate::sql::schedules`, reads on
//! the readers, each write in the one writer's transaction.

use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::Result;
use crate::schedule::{Advance, FireRow, NewSchedule, ScheduleRow};
use crate::sql::schedules::{self as sql, ScheduleStatements, Which};
use crate::sql::webhooks::exec;
use crate::store::ScheduleStore;

use super::SqliteStore;

static SQL: LazyLock<ScheduleStatements> = LazyLock::new(ScheduleStatements::sqlite);

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn create_schedule(&self, new: &NewSchedule) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sql::create::<sqlx::Sqlite>(&mut *tx, new).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn schedule(&self, id: &str) -> Result<Option<ScheduleRow>> {
        let mut conn = self.readers.acquire().await?;
        sql::one::<sqlx::Sqlite>(&mut *conn, id).await
    }

    async fn list_schedules(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>> {
        let mut conn = self.readers.acquire().await?;
        sql::list::<sqlx::Sqlite>(&mut *conn, tenant, after, limit).await
    }

    async fn delete_schedule(&self, id: &str) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let deleted = exec::<sqlx::Sqlite>(&mut *tx, sql::DELETE, id).await? > 0;
        tx.commit().await?;
        Ok(deleted)
    }

    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: DateTime<Utc>,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let done = sql::set_paused::<sqlx::Sqlite>(&mut *tx, id, paused, next_fire_at).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn claim_schedules(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>> {
        let mut tx = self.write_tx().await?;
        let rows =
            sql::claim::<sqlx::Sqlite>(&mut *tx, &SQL.claim, now, until, token, Which::Due(limit))
                .await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn claim_schedule(
        &self,
        id: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
    ) -> Result<Option<ScheduleRow>> {
        let mut tx = self.write_tx().await?;
        let rows =
            sql::claim::<sqlx::Sqlite>(&mut *tx, &SQL.claim_one, now, until, token, Which::One(id))
                .await?;
        tx.commit().await?;
        Ok(rows.into_iter().next())
    }

    async fn record_fires(
        &self,
        id: &str,
        token: &str,
        fires: &[FireRow],
        advance: &Advance,
    ) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let held = sql::record::<sqlx::Sqlite>(&mut *tx, id, token, fires, advance).await?;
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
        let mut conn = self.readers.acquire().await?;
        sql::fires::<sqlx::Sqlite>(&mut *conn, id, before, limit).await
    }
}
