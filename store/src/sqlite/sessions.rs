//! Session rows in the SQLite file: creating, reading and listing them, and the changes
//! made to one from outside a run (fail, retry, cancel), with the store's liveness.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use sqlx::Sqlite;

use agentq_agent::schema::Message;

use crate::error::Result;
use crate::model::{CancelResult, ListFilter, NewSession, SessionRow, SessionStatus};
use crate::sql::escape::escape_text;
use crate::sql::record::SessionRecord;
use crate::sql::statements::{self, SQLITE as SQL};
use crate::sql::{outcome, read};
use crate::store::{RetryResult, SessionStore};

use super::tx::{now_us, record_in, returning_one};
use super::{SqliteStore, budget, workspace, writes};

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)> {
        let out = self.create_sessions(std::slice::from_ref(new)).await?;
        outcome::only_created(new, out)
    }

    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>> {
        if new.is_empty() {
            return Ok(Vec::new());
        }
        // The input files' contents go to the object store (if any) before the file lock
        // is taken, and their guard is held until the commit.
        let uploaded = self.upload_inputs(new).await?;
        let now = now_us();
        // One transaction for the batch; statements are in-process calls, so a few per
        // item cost little, and each sees the rows of the items before it.
        let mut tx = self.write_tx().await?;
        let mut out = Vec::with_capacity(new.len());
        for s in new {
            let created = writes::create(&mut tx, s, now).await?;
            if created.1 && (!s.files.is_empty() || s.workspace_from.is_some()) {
                workspace::add_inputs(&mut tx, s, now, uploaded.is_some()).await?;
            }
            out.push(created);
        }
        tx.commit().await?;
        drop(uploaded);
        Ok(out)
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        self.get_record(id)
            .await?
            .map(SessionRecord::into_row)
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        let rows: Vec<SessionRecord> =
            statements::list::<Sqlite>(filter, statements::Dialect::Sqlite)
                .build_query_as()
                .fetch_all(&self.readers)
                .await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        read::history(&self.readers, &SQL, id).await
    }

    async fn fork_session(&self, fork: &crate::fork::NewFork) -> Result<crate::fork::ForkResult> {
        self.fork(fork).await
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        let mut tx = self.write_tx().await?;
        let failed = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.fail)
                .bind(id)
                .bind(escape_text(reason))
                .bind(now_us()),
        )
        .await?;
        tx.commit().await?;
        match failed {
            Some(rec) => rec.into_row().map(Some),
            // Missing, or finished already: leave it as it is.
            None => self.get(id).await,
        }
    }

    async fn mark_announced(&self, id: &str) -> Result<()> {
        let mut tx = self.write_tx().await?;
        sqlx::query(&SQL.mark_announced)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn retry(&self, id: &str, hold: bool) -> Result<RetryResult> {
        let mut tx = self.write_tx().await?;
        let retried = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.retry)
                .bind(id)
                .bind(hold)
                .bind(now_us()),
        )
        .await?;
        let Some(rec) = retried else {
            tx.commit().await?;
            return Ok(outcome::not_retried(self.get(id).await?));
        };
        let row = rec.into_row()?;
        // A retried sub-agent draws from its tree again, in the transaction that queues it.
        if let Err(e) = budget::reopen_in(&mut tx, &row).await {
            tx.rollback().await?;
            return Err(e);
        }
        tx.commit().await?;
        Ok(RetryResult::Retried(Box::new(row)))
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        let mut tx = self.write_tx().await?;
        let changed =
            returning_one(&mut tx, sqlx::query_as(&SQL.cancel).bind(id).bind(now_us())).await?;
        if let Some(rec) = changed {
            tx.commit().await?;
            return outcome::cancel_changed(rec);
        }
        // Read under the same lock, so no race can make the answer wrong.
        let rec = record_in(&mut tx, id).await?;
        tx.rollback().await?;
        outcome::cancel_unchanged(id, rec)
    }

    /// Reads, and while a failed write left the store suspect, writes (see the module
    /// docs).
    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        if self.write_suspect.load(Ordering::Relaxed) {
            self.probe_write().await?;
        }
        Ok(())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        read::unfinished(&self.readers).await
    }
}
