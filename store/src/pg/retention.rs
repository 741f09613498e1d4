//! Retention on Postgres: the scan shared with SQLite ([`crate::sql::retention`]), and
//! the deletion of whole trees in one transaction, each table by the trees' roots
//! (every table's key leads with `root_id`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Postgres;

use crate::error::Result;
use crate::retention::{
    Keep, RetentionCandidate, RetentionRule, Retired, RuleKind, StoredRetentionRule,
};
use crate::rowconv::to_u64;
use crate::sql::retention::{self, CandidateRow, candidate_of, candidates};
use crate::sql::retention_rules as rules;
use crate::sql::statements::Dialect;
use crate::store::RetentionStore;

use super::PgStore;

/// Batches that hold a session of the trees: deleted with their last session.
const BATCHES: &str = "SELECT DISTINCT batch_id FROM sessions \
     WHERE root_id = ANY($1) AND batch_id IS NOT NULL";

/// The bytes of contents only these trees' manifests reference.
const RELEASED_BYTES: &str = "
SELECT COALESCE(sum(b.size), 0)::bigint FROM blobs b
WHERE b.sha256 IN (SELECT w.sha256 FROM workspace_files w WHERE w.root_id = ANY($1))
  AND NOT EXISTS (SELECT 1 FROM workspace_files o
                  WHERE o.sha256 = b.sha256 AND o.root_id <> ALL($1))";

/// Messages are keyed by uuid (migration 0004).
const DELETE_MESSAGES: &str = "DELETE FROM messages WHERE root_id = ANY($1::text[]::uuid[])";

/// What goes with the transcript whatever is kept.
const DELETE_OWNED: [&str; 3] = [
    "DELETE FROM inbox WHERE root_id = ANY($1)",
    "DELETE FROM approvals WHERE root_id = ANY($1)",
    "DELETE FROM workspace_files WHERE root_id = ANY($1)",
];

/// The deleted sessions' usage, as `GET /v1/admin/costs` groups it (the model its worker
/// used, else the one its spec named).
const RETIRE_USAGE: &str = "
INSERT INTO retired_usage (id, tenant, model, created_at, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, reasoning_tokens, web_search_requests)
SELECT s.id, s.tenant, COALESCE(s.model_used, p.spec->>'model'), s.created_at,
    s.input_tokens, s.output_tokens, s.cache_read_tokens, s.cache_write_tokens,
    s.reasoning_tokens, s.web_search_requests
FROM sessions s JOIN session_specs p ON p.root_id = s.root_id AND p.id = s.id
WHERE s.root_id = ANY($1)
ON CONFLICT (id) DO NOTHING";

const DELETE_SPECS: &str = "DELETE FROM session_specs WHERE root_id = ANY($1)";
const DELETE_SESSIONS: &str = "DELETE FROM sessions WHERE root_id = ANY($1)";
const DELETE_BATCHES: &str = "DELETE FROM batches b WHERE b.id = ANY($1) \
     AND NOT EXISTS (SELECT 1 FROM sessions x WHERE x.batch_id = b.id)";
const PRUNE: &str = "UPDATE sessions SET pruned_at = now() WHERE root_id = ANY($1)";

#[async_trait]
impl RetentionStore for PgStore {
    async fn retention_candidates(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<RetentionCandidate>> {
        let rows: Vec<CandidateRow> =
            candidates::<Postgres>(rule, rule.cutoff(now), None, limit, Dialect::Postgres)
                .build_query_as()
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(candidate_of).collect())
    }

    async fn tree_ids(&self, root_id: &str) -> Result<Vec<String>> {
        retention::tree_ids::<Postgres>(&self.pool, root_id).await
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
        let mut tx = self.pool.begin().await?;
        let due: Vec<CandidateRow> = candidates::<Postgres>(
            rule,
            rule.cutoff(now),
            Some(roots),
            limit,
            Dialect::Postgres,
        )
        .build_query_as()
        .fetch_all(&mut *tx)
        .await?;
        let roots: Vec<String> = due.into_iter().map(|r| r.0).collect();
        if roots.is_empty() {
            tx.rollback().await?;
            return Ok(Retired::default());
        }
        let bytes: i64 = sqlx::query_scalar(RELEASED_BYTES)
            .bind(&roots)
            .fetch_one(&mut *tx)
            .await?;
        let messages = sqlx::query(DELETE_MESSAGES)
            .bind(&roots)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        for sql in DELETE_OWNED {
            sqlx::query(sql).bind(&roots).execute(&mut *tx).await?;
        }
        let mut out = Retired {
            messages,
            blob_bytes: to_u64(bytes, "blob bytes")?,
            ..Retired::default()
        };
        match rule.keep {
            Keep::Result => {
                out.pruned = sqlx::query(PRUNE)
                    .bind(&roots)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            Keep::None => {
                let batches: Vec<String> = sqlx::query_scalar(BATCHES)
                    .bind(&roots)
                    .fetch_all(&mut *tx)
                    .await?;
                sqlx::query(RETIRE_USAGE)
                    .bind(&roots)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(DELETE_SPECS)
                    .bind(&roots)
                    .execute(&mut *tx)
                    .await?;
                out.sessions = sqlx::query(DELETE_SESSIONS)
                    .bind(&roots)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                sqlx::query(DELETE_BATCHES)
                    .bind(&batches)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        out.roots = roots;
        Ok(out)
    }

    async fn retention_rules(&self) -> Result<Vec<StoredRetentionRule>> {
        let mut conn = self.pool.acquire().await?;
        rules::list::<Postgres>(&mut *conn).await
    }

    async fn set_retention_rule(&self, rule: &StoredRetentionRule) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        rules::set::<Postgres>(&mut *conn, rule).await
    }

    async fn delete_retention_rule(&self, kind: RuleKind, name: &str) -> Result<bool> {
        let mut conn = self.pool.acquire().await?;
        rules::delete::<Postgres>(&mut *conn, kind, name).await
    }
}
