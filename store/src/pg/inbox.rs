//! Inboxes on Postgres: delivering items and approval decisions under the session's row
//! lock (one statement each, waking the session), reading them back, and the follow-up
//! that re-opens a finished session.

use async_trait::async_trait;

use agentq_agent::schema::ToolCall;

use crate::error::Result;
use crate::model::{ApprovalRecorded, Delivered, InboxItem, SessionRow, SessionStatus};
use crate::protocol::{InboxKind, InboxPayload};
use crate::rowconv::{parse_status, to_i64};
use crate::sql::escape::{escape_opt, escape_text, stored_ids, stored_json};
use crate::sql::record::{InboxRecord, PendingRow, SessionRecord};
use crate::sql::statements::POSTGRES as SQL;
use crate::sql::{outcome, read, write};
use crate::store::InboxStore;

use super::{PgStore, budget};

/// Append to an inbox under the session's row lock: the item's position is the bumped
/// `wake_seq`, so positions increase in commit order.
const DELIVER: &str = "
WITH p AS (
    SELECT root_id, id, queue, status, wake_seq FROM sessions WHERE id = $1 FOR UPDATE
), ins AS (
    INSERT INTO inbox (root_id, session_id, seq, kind, dedupe, payload)
    SELECT p.root_id, p.id, p.wake_seq + 1, $2, $3, $4 FROM p
    ON CONFLICT (root_id, session_id, dedupe) DO NOTHING
    RETURNING seq
), upd AS (
    UPDATE sessions s SET
        wake_seq = ins.seq,
        status = CASE WHEN s.status = ANY($5::text[]) THEN 'queued' ELSE s.status END,
        enqueued_at = CASE WHEN s.status = ANY($5::text[]) THEN NULL ELSE s.enqueued_at END,
        held = CASE WHEN s.status = ANY($5::text[]) THEN s.capped ELSE s.held END,
        updated_at = now()
    FROM ins WHERE s.id = $1
    RETURNING s.status, s.held
)
SELECT p.queue, p.status, (SELECT seq FROM ins), (SELECT status FROM upd),
       COALESCE((SELECT held FROM upd), false) FROM p";

const DECIDE: &str = "
WITH p AS (
    SELECT root_id, id, queue, status FROM sessions WHERE id = $1 FOR UPDATE
), ins AS (
    INSERT INTO approvals (root_id, session_id, tool_call_id, approve, reason, arguments)
    SELECT p.root_id, p.id, $2, $3, $4, $5 FROM p
    WHERE p.status NOT IN ('completed', 'failed', 'cancelled')
    ON CONFLICT DO NOTHING
    RETURNING 1
), upd AS (
    UPDATE sessions s SET
        wake_seq = s.wake_seq + 1,
        status = CASE WHEN s.status = 'awaiting_approval' THEN 'queued' ELSE s.status END,
        enqueued_at = CASE WHEN s.status = 'awaiting_approval' THEN NULL ELSE s.enqueued_at END,
        held = CASE WHEN s.status = 'awaiting_approval' THEN s.capped ELSE s.held END,
        updated_at = now()
    FROM ins WHERE s.id = $1
    RETURNING s.status, s.held
)
SELECT p.queue, p.status, EXISTS (SELECT 1 FROM ins), (SELECT status FROM upd),
       COALESCE((SELECT held FROM upd), false) FROM p";

#[async_trait]
impl InboxStore for PgStore {
    async fn deliver(
        &self,
        session_id: &str,
        kind: InboxKind,
        dedupe: &str,
        payload: &InboxPayload,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>> {
        let wake: Vec<&str> = wake.iter().map(SessionStatus::as_str).collect();
        let row: Option<(String, String, Option<i64>, Option<String>, bool)> =
            sqlx::query_as(DELIVER)
                .bind(session_id)
                .bind(kind.as_str())
                .bind(dedupe)
                .bind(stored_json(&payload.to_value()?)?)
                .bind(&wake)
                .fetch_optional(&self.pool)
                .await?;
        let Some((queue, old, seq, new, held)) = row else {
            return Ok(None);
        };
        let queued = new.as_deref() == Some(SessionStatus::Queued.as_str());
        outcome::delivered(queue, parse_status(&old)?, seq, queued, held).map(Some)
    }

    async fn inbox(
        &self,
        session_id: &str,
        kinds: &[InboxKind],
        after: u64,
    ) -> Result<Vec<InboxItem>> {
        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let rows: Vec<InboxRecord> = sqlx::query_as(&SQL.inbox)
            .bind(session_id)
            .bind(&kinds)
            .bind(to_i64(after, "after")?)
            .fetch_all(&self.pool)
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
        let row: Option<(String, String, bool, Option<String>, bool)> = sqlx::query_as(DECIDE)
            .bind(session_id)
            .bind(escape_text(tool_call_id).as_ref())
            .bind(approve)
            .bind(escape_opt(reason))
            .bind(escape_opt(arguments))
            .fetch_optional(&self.pool)
            .await?;
        let Some((queue, old, inserted, new, held)) = row else {
            return Ok(ApprovalRecorded::NotFound);
        };
        let old = parse_status(&old)?;
        let woken = old == SessionStatus::AwaitingApproval
            && new.as_deref() == Some(SessionStatus::Queued.as_str());
        Ok(outcome::approval_recorded(
            queue, old, inserted, woken, held,
        ))
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>, Option<String>)>> {
        read::approval(&self.pool, &SQL, session_id, tool_call_id).await
    }

    async fn pending_approvals(&self, session_id: &str, held: &[String]) -> Result<Vec<ToolCall>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<PendingRow> = sqlx::query_as(&SQL.pending_approvals)
            .bind(session_id)
            .bind(stored_ids(held))
            .fetch_all(&self.pool)
            .await?;
        Ok(outcome::pending_approvals(rows, held))
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        let mut tx = self.pool.begin().await?;
        // Under the tree's lock: a re-opened sub-agent draws from its tree again, in the
        // transaction that queues it (`budget::reopen_in`).
        let Some(root) = budget::lock_root(&mut tx, session_id).await? else {
            return Ok(None);
        };
        let rec: Option<SessionRecord> = sqlx::query_as(&SQL.follow_up)
            .bind(session_id)
            .bind(to_i64(consume.unwrap_or(0), "consume")?)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(rec) = rec else {
            tx.rollback().await?;
            return Ok(None);
        };
        let (root_id, id, seq) = (rec.root_id.clone(), rec.id.clone(), rec.history_len);
        let row = rec.into_row()?;
        budget::reopen_in(&mut tx, &row, &root).await?;
        write::follow_up_message::<sqlx::Postgres>(&mut tx, &SQL, &root_id, &id, seq, text).await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}
