//! Retention's scan, as both stores run it: the roots of finished trees a rule takes at a
//! cutoff, oldest finish first, and the same test again inside the deletion's
//! transaction (`only`), so that a tree that came back to life in between is left alone;
//! the read both make alike on the pool they read from ([`tree_ids`]; the scan's
//! own read stays per dialect: a generic query builder's arguments are invariant in
//! their lifetime, so the builder could not be borrowed for the fetch). The
//! deletions themselves differ by dialect (`pg/retention.rs`, `sqlite/retention.rs`).

use chrono::{DateTime, Utc};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use crate::error::Result;
use crate::retention::{Keep, RetentionRule};

use super::statements::Dialect;

/// The statuses of a finished session.
const FINISHED: &str = "('completed', 'failed', 'cancelled')";

/// The references that keep a tree whose every session finished before the cutoff, `s`
/// being its root. Both dialects run this text; every "still referenced" rule is one
/// predicate here and nowhere else:
/// - a batch not yet finished holds a session of the tree (its other items are
///   running: the batch is reported whole when it completes);
/// - a fork of one of its sessions (`sessions.forked_from`, another tree) reads its
///   history up to the fork's step from this tree's messages: the tree stays while any
///   fork of it exists (a fork that goes in turn lets it go at a later pass).
///
/// A workspace fork (`workspace_from`) copies the tree's manifest when it is created, so
/// it never needs the tree afterwards; the contents both hold stay, because a blob is
/// collected only once no workspace references it.
pub(crate) const RETENTION_STILL_REFERENCED: &str = " AND NOT EXISTS (SELECT 1 FROM sessions c \
       JOIN sessions m ON m.batch_id = c.batch_id \
       WHERE c.root_id = s.id AND c.batch_id IS NOT NULL \
         AND m.status NOT IN ('completed', 'failed', 'cancelled')) \
     AND NOT EXISTS (SELECT 1 FROM sessions f WHERE f.forked_from IN \
       (SELECT t.id FROM sessions t WHERE t.root_id = s.id) AND f.root_id <> s.id)";

/// `(root_id, tenant, queue, sessions of the tree)`
pub(crate) type CandidateRow = (String, String, String, i64);

fn push_time<'a, DB: Database>(qb: &mut QueryBuilder<'a, DB>, at: DateTime<Utc>, dialect: Dialect)
where
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    match dialect {
        Dialect::Postgres => qb.push_bind(at),
        Dialect::Sqlite => qb.push_bind(at.timestamp_micros()),
    };
}

fn push_list<'a, DB: Database>(qb: &mut QueryBuilder<'a, DB>, list: &'a [String])
where
    &'a str: Encode<'a, DB> + Type<DB>,
{
    qb.push("(");
    let mut sep = qb.separated(", ");
    for v in list {
        sep.push_bind(v.as_str());
    }
    qb.push(")");
}

/// The roots `rule` takes at `cutoff` (every session of the tree finished before it, no
/// reference left), oldest finish first, at most `limit`; among `only` when given (the
/// check inside the deletion, which on Postgres also locks the roots, skipping those a
/// writer holds). Walks `sessions_retention_idx` (rules keeping results, which skip the
/// trees pruned already) or `sessions_finished_root_idx`.
pub(crate) fn candidates<'a, DB: Database>(
    rule: &'a RetentionRule,
    cutoff: DateTime<Utc>,
    only: Option<&'a [String]>,
    limit: u32,
    dialect: Dialect,
) -> QueryBuilder<'a, DB>
where
    DB::Arguments<'a>: Default,
    &'a str: Encode<'a, DB> + Type<DB>,
    i64: Encode<'a, DB> + Type<DB>,
    DateTime<Utc>: Encode<'a, DB> + Type<DB>,
{
    let mut qb = QueryBuilder::new(format!(
        "SELECT s.id, s.tenant, s.queue, \
             (SELECT count(*) FROM sessions n WHERE n.root_id = s.id) \
         FROM sessions s \
         WHERE s.parent_id IS NULL AND s.finished_at IS NOT NULL \
           AND s.status IN {FINISHED} AND s.finished_at < "
    ));
    push_time(&mut qb, cutoff, dialect);
    if rule.keep == Keep::Result {
        qb.push(" AND s.pruned_at IS NULL");
    }
    let scope = &rule.scope;
    if let Some(t) = &scope.tenant {
        qb.push(" AND s.tenant = ").push_bind(t.as_str());
    }
    if let Some(q) = &scope.queue {
        qb.push(" AND s.queue = ").push_bind(q.as_str());
    }
    if !scope.not_tenants.is_empty() {
        qb.push(" AND s.tenant NOT IN ");
        push_list(&mut qb, &scope.not_tenants);
    }
    if !scope.not_queues.is_empty() {
        qb.push(" AND s.queue NOT IN ");
        push_list(&mut qb, &scope.not_queues);
    }
    if let Some(only) = only {
        qb.push(" AND s.id IN ");
        push_list(&mut qb, only);
    }
    // Every session of the tree finished before the cutoff (a sub-agent may have
    // finished after its root was cancelled, or run again since).
    qb.push(format!(
        " AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.root_id = s.id \
           AND (c.status NOT IN {FINISHED} OR c.finished_at IS NULL OR c.finished_at >= "
    ));
    push_time(&mut qb, cutoff, dialect);
    qb.push("))");
    qb.push(RETENTION_STILL_REFERENCED);
    qb.push(" ORDER BY s.finished_at LIMIT ")
        .push_bind(i64::from(limit));
    if only.is_some() && dialect == Dialect::Postgres {
        qb.push(" FOR UPDATE OF s SKIP LOCKED");
    }
    qb
}

pub(crate) fn candidate_of(
    (root_id, tenant, queue, n): CandidateRow,
) -> crate::retention::RetentionCandidate {
    crate::retention::RetentionCandidate {
        root_id,
        tenant,
        queue,
        sessions: super::budget::count(n),
    }
}

/// The ids of a tree's sessions, root first.
pub(crate) async fn tree_ids<DB>(pool: &Pool<DB>, root_id: &str) -> Result<Vec<String>>
where
    DB: Database,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let rows: Vec<(String,)> = sqlx::query_as::<DB, (String,)>(
        "SELECT id FROM sessions WHERE root_id = $1 ORDER BY depth, id",
    )
    .bind(root_id)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}
