//! Retention on SQLite: the scan shared with Postgres ([`crate::sql::retention`]) on the
//! readers, and the deletion of whole trees in one write transaction, the roots passed as
//! one JSON array (`json_each`), as `mark_enqueued` passes its ids.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Sqlite;

use crate::error::Result;
use crate::retention::{
    Keep, RetentionCandidate, RetentionRule, Retired, RuleKind, StoredRetentionRule,
};
use crate::rowconv::to_u64;
use crate::sql::retention::{self, CandidateRow, candidate_of, candidates};
use crate::sql::retention_rules as rules;
use crate::sql::statements::Dialect;
use crate::store::RetentionStore;

use super::SqliteStore;
use super::tx::now_us;

/// The trees' roots, from the JSON array bound as `$1`.
macro_rules! roots {
    () => {
        "(SELECT value FROM json_each($1))"
    };
}

const BATCHES: &str = concat!(
    "SELECT DISTINCT batch_id FROM sessions WHERE root_id IN ",
    roots!(),
    " AND batch_id IS NOT NULL"
);

/// The bytes of contents only these trees' manifests reference.
const RELEASED_BYTES: &str = concat!(
    "SELECT COALESCE(sum(b.size), 0) FROM blobs b \
     WHERE b.sha256 IN (SELECT w.sha256 FROM workspace_files w WHERE w.root_id IN ",
    roots!(),
    ") AND NOT EXISTS (SELECT 1 FROM workspace_files o \
         WHERE o.sha256 = b.sha256 AND o.root_id NOT IN ",
    roots!(),
    ")"
);

const DELETE_MESSAGES: &str = concat!("DELETE FROM messages WHERE root_id IN ", roots!());

/// What goes with the transcript whatever is kept.
const DELETE_OWNED: [&str; 3] = [
    concat!("DELETE FROM inbox WHERE root_id IN ", roots!()),
    concat!("DELETE FROM approvals WHERE root_id IN ", roots!()),
    concat!("DELETE FROM workspace_files WHERE root_id IN ", roots!()),
];

/// See the Postgres store's.
const RETIRE_USAGE: &str = concat!(
    "INSERT INTO retired_usage (id, tenant, model, created_at, input_tokens, output_tokens, \
         cache_read_tokens, cache_write_tokens, reasoning_tokens, web_search_requests) \
     SELECT s.id, s.tenant, COALESCE(s.model_used, json_extract(p.spec, '$.model')), \
         s.created_at, s.input_tokens, s.output_tokens, s.cache_read_tokens, \
         s.cache_write_tokens, s.reasoning_tokens, s.web_search_requests \
     FROM sessions s JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id \
     WHERE s.root_id IN ",
    roots!(),
    " ON CONFLICT (id) DO NOTHING"
);

const DELETE_SPECS: &str = concat!("DELETE FROM session_specs WHERE root_id IN ", roots!());
const DELETE_SESSIONS: &str = concat!("DELETE FROM sessions WHERE root_id IN ", roots!());
const DELETE_BATCHES: &str = concat!(
    "DELETE FROM batches WHERE id IN ",
    roots!(),
    " AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.batch_id = batches.id)"
);
const PRUNE: &str = concat!(
    "UPDATE sessions SET pruned_at = $2 WHERE root_id IN ",
    roots!()
);

#[async_trait]
impl RetentionStore for SqliteStore {
    async fn retention_candidates(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<RetentionCandidate>> {
        let rows: Vec<CandidateRow> =
            candidates::<Sqlite>(rule, rule.cutoff(now), None, limit, Dialect::Sqlite)
                .build_query_as()
                .fetch_all(&self.readers)
                .await?;
        Ok(rows.into_iter().map(candidate_of).collect())
    }

    async fn tree_ids(&self, root_id: &str) -> Result<Vec<String>> {
        retention::tree_ids::<Sqlite>(&self.readers, root_id).await
    }

    async fn retire_trees(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        roots: &[String],
    ) -> Result<Retired> {
        if roots.is_empty() {
            return Ok(Retired::default());
        }
        let limit = u32::try_from(roots.len()).unwrap_or(u32::MAX);
        let mut tx = self.write_tx().await?;
        let due: Vec<CandidateRow> =
            candidates::<Sqlite>(rule, rule.cutoff(now), Some(roots), limit, Dialect::Sqlite)
                .build_query_as()
                .fetch_all(&mut *tx)
                .await?;
        let roots: Vec<String> = due.into_iter().map(|r| r.0).collect();
        if roots.is_empty() {
            tx.rollback().await?;
            return Ok(Retired::default());
        }
        let ids = serde_json::to_string(&roots)?;
        let bytes: i64 = sqlx::query_scalar(RELEASED_BYTES)
            .bind(&ids)
            .fetch_one(&mut *tx)
            .await?;
        let messages = sqlx::query(DELETE_MESSAGES)
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        for sql in DELETE_OWNED {
            sqlx::query(sql).bind(&ids).execute(&mut *tx).await?;
        }
        let mut out = Retired {
            messages,
            blob_bytes: to_u64(bytes, "blob bytes")?,
            ..Retired::default()
        };
        match rule.keep {
            Keep::Result => {
                out.pruned = sqlx::query(PRUNE)
                    .bind(&ids)
                    .bind(now_us())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            Keep::None => {
                let batches: Vec<String> = sqlx::query_scalar(BATCHES)
                    .bind(&ids)
                    .fetch_all(&mut *tx)
                    .await?;
                sqlx::query(RETIRE_USAGE)
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(DELETE_SPECS)
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await?;
                out.sessions = sqlx::query(DELETE_SESSIONS)
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                sqlx::query(DELETE_BATCHES)
                    .bind(serde_json::to_string(&batches)?)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        out.roots = roots;
        Ok(out)
    }

    async fn retention_rules(&self) -> Result<Vec<StoredRetentionRule>> {
        let mut conn = self.readers.acquire().await?;
        rules::list::<Sqlite>(&mut *conn).await
    }

    async fn set_retention_rule(&self, rule: &StoredRetentionRule) -> Result<()> {
        let mut tx = self.write_tx().await?;
        rules::set::<Sqlite>(&mut *tx, rule).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn delete_retention_rule(&self, kind: RuleKind, name: &str) -> Result<bool> {
        let mut tx = self.write_tx().await?;
        let deleted = rules::delete::<Sqlite>(&mut *tx, kind, name).await?;
        tx.commit().await?;
        Ok(deleted)
    }
}
