//! Session rows on Postgres: creating, reading and listing them, and the changes made to
//! one from outside a run (fail, retry, cancel), with the pools' liveness.

use async_trait::async_trait;

use agentq_agent::schema::Message;

use crate::error::Result;
use crate::model::{CancelResult, ListFilter, NewSession, SessionRow, SessionStatus};
use crate::sql::escape::escape_text;
use crate::sql::record::SessionRecord;
use crate::sql::statements::{self, POSTGRES as SQL};
use crate::sql::{outcome, read};
use crate::store::{RetryResult, SessionStore};

use super::{PgStore, budget, create};

#[async_trait]
impl SessionStore for PgStore {
    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)> {
        let out = self.create_sessions(std::slice::from_ref(new)).await?;
        outcome::only_created(new, out)
    }

    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>> {
        create::create_sessions(&self.pool, new, self.objects.as_deref()).await
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        self.get_record(id)
            .await?
            .map(SessionRecord::into_row)
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        let rows: Vec<SessionRecord> =
            statements::list::<sqlx::Postgres>(filter, statements::Dialect::Postgres)
                .build_query_as()
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        read::history(&self.pool, &SQL, id).await
    }

    async fn fork_session(&self, fork: &crate::fork::NewFork) -> Result<crate::fork::ForkResult> {
        self.fork(fork).await
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        let failed: Option<SessionRecord> = sqlx::query_as(&SQL.fail)
            .bind(id)
            .bind(escape_text(reason))
            .fetch_optional(&self.pool)
            .await?;
        match failed {
            Some(rec) => rec.into_row().map(Some),
            // Missing, or finished already: leave it as it is.
            None => self.get(id).await,
        }
    }

    async fn mark_announced(&self, id: &str) -> Result<()> {
        super::announce_rounds::mark(&self.announced, &self.pool, id).await
    }

    async fn retry(&self, id: &str, hold: bool) -> Result<RetryResult> {
        // Under the tree's lock: a retried sub-agent draws from its tree again, in the
        // transaction that queues it (`budget::reopen_in`).
        let mut tx = self.pool.begin().await?;
        let Some(root) = budget::lock_root(&mut tx, id).await? else {
            return Ok(RetryResult::NotFound);
        };
        let retried: Option<SessionRecord> = sqlx::query_as(&SQL.retry)
            .bind(id)
            .bind(hold)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(rec) = retried else {
            tx.rollback().await?;
            return Ok(outcome::not_retried(self.get(id).await?));
        };
        let row = rec.into_row()?;
        budget::reopen_in(&mut tx, &row, &root).await?;
        tx.commit().await?;
        Ok(RetryResult::Retried(Box::new(row)))
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        let changed: Option<SessionRecord> = sqlx::query_as(&SQL.cancel)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match changed {
            Some(rec) => outcome::cancel_changed(rec),
            None => outcome::cancel_unchanged(id, self.get_record(id).await?),
        }
    }

    async fn ping(&self) -> Result<()> {
        // Both pools (the writers' once it has connections): after an outage, each gives
        // up its dead connections as it is used.
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        if self.writer.size() > 0 {
            sqlx::query("SELECT 1").execute(&self.writer).await?;
        }
        Ok(())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        read::unfinished(&self.pool).await
    }
}
