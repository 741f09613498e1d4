//! Inboxes in the SQLite file: delivering items and approval decisions under the write
//! lock (waking the session), reading them back, and the follow-up that re-opens a
//! finished session.

use async_trait::async_trait;

use agentq_agent::schema::ToolCall;

use crate::error::Result;
use crate::model::{ApprovalRecorded, Delivered, InboxItem, SessionRow, SessionStatus};
use crate::protocol::{InboxKind, InboxPayload};
use crate::rowconv::to_i64;
use crate::sql::escape::stored_ids;
use crate::sql::record::{InboxRecord, PendingRow};
use crate::sql::statements::SQLITE as SQL;
use crate::sql::{outcome, read, write};
use crate::store::InboxStore;

use super::tx::{now_us, returning_one};
use super::{SqliteStore, budget, writes};

#[async_trait]
impl InboxStore for SqliteStore {
    async fn deliver(
        &self,
        session_id: &str,
        kind: InboxKind,
        dedupe: &str,
        payload: &InboxPayload,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>> {
        let payload = payload.to_value()?;
        // Under the write lock (Postgres: `FOR UPDATE`): the item's position is the bumped
        // `wake_seq`, so positions increase in commit order, and a concurrent suspend
        // sees the bump.
        let mut tx = self.write_tx().await?;
        let item = writes::Item {
            session_id,
            kind: kind.as_str(),
            dedupe,
            payload: &payload,
        };
        let delivered = writes::deliver(&mut tx, &item, wake, now_us()).await?;
        match &delivered {
            Some(d) if d.inserted => tx.commit().await?,
            // Missing, or delivered before: nothing changed.
            _ => tx.rollback().await?,
        }
        Ok(delivered)
    }

    async fn inbox(
        &self,
        session_id: &str,
        kinds: &[InboxKind],
        after: u64,
    ) -> Result<Vec<InboxItem>> {
        let rows: Vec<InboxRecord> = sqlx::query_as(&SQL.inbox)
            .bind(session_id)
            // The kinds as one JSON array parameter (SQLite has no array binds).
            .bind(serde_json::to_string(kinds)?)
            .bind(to_i64(after, "after")?)
            .fetch_all(&self.readers)
            .await?;
        rows.into_iter().map(InboxRecord::into_item).collect()
    }

    async fn decide_approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
        approve: bool,
        reason: Option<&str>,
        arguments: Option<&str>,
    ) -> Result<ApprovalRecorded> {
        // Under the write lock, like `deliver`: the decision and the wake-up are one step.
        let mut tx = self.write_tx().await?;
        let decision = writes::Decision {
            session_id,
            tool_call_id,
            approve,
            reason,
            arguments,
        };
        let recorded = writes::decide(&mut tx, &decision, now_us()).await?;
        match recorded {
            ApprovalRecorded::Recorded { .. } => tx.commit().await?,
            _ => tx.rollback().await?,
        }
        Ok(recorded)
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>, Option<String>)>> {
        read::approval(&self.readers, &SQL, session_id, tool_call_id).await
    }

    async fn pending_approvals(&self, session_id: &str, held: &[String]) -> Result<Vec<ToolCall>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<PendingRow> = sqlx::query_as(&SQL.pending_approvals)
            .bind(session_id)
            // The ids as one JSON array parameter (SQLite has no array binds), as stored.
            .bind(serde_json::to_string(&stored_ids(held))?)
            .fetch_all(&self.readers)
            .await?;
        Ok(outcome::pending_approvals(rows, held))
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        let mut tx = self.write_tx().await?;
        let rec = returning_one(
            &mut tx,
            sqlx::query_as(&SQL.follow_up)
                .bind(session_id)
                .bind(to_i64(consume.unwrap_or(0), "consume")?)
                .bind(now_us()),
        )
        .await?;
        let Some(rec) = rec else {
            tx.rollback().await?;
            return Ok(None);
        };
        let (root_id, id, seq) = (rec.root_id.clone(), rec.id.clone(), rec.history_len);
        let row = rec.into_row()?;
        // A re-opened sub-agent draws from its tree again, in the transaction that
        // queues it.
        if let Err(e) = budget::reopen_in(&mut tx, &row).await {
            tx.rollback().await?;
            return Err(e);
        }
        write::follow_up_message::<sqlx::Sqlite>(&mut tx, &SQL, &root_id, &id, seq, text).await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}
