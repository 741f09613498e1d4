//! The sweeper's, the dispatcher's, the reports' and retention's calls on the sharded
//! store: each shard is swept for its own sessions (the answers concatenated, counts
//! added), the dispatcher's held candidates re-ranked across shards, and a retention's
//! deletion split by the trees' shards.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::ShardedStore;
use super::merge::{cap, fold, merge_pages};
use crate::error::Result;
use crate::model::Woken;
use crate::report::{CostFilter, CostRow, StatusCount, WorkerLeases};
use crate::retention::{RetentionCandidate, RetentionRule, Retired, RuleKind, StoredRetentionRule};
use crate::scheduling::{ActiveCount, Candidate};
use crate::store::{ReportStore, RetentionStore, Store, SweepStore};
use crate::wait::WaitReason;

/// Every shard's list, taken in turn (the first of each, then the second of each…) and
/// cut at `limit`: a shard with much to do does not starve another's.
fn interleave<T>(lists: Vec<Vec<T>>, limit: usize) -> Vec<T> {
    let mut iters: Vec<std::vec::IntoIter<T>> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    while out.len() < limit {
        let before = out.len();
        for it in &mut iters {
            if out.len() < limit
                && let Some(v) = it.next()
            {
                out.push(v);
            }
        }
        if out.len() == before {
            break;
        }
    }
    out
}

/// The earlier of two times, either of which may be unknown.
fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Held candidates of every shard ranked again as one store ranks them: per (tenant,
/// batch) the best first (higher priority, then older: ids are time-ordered), at most
/// `per_group` of each, then the lowest ranks first, at most `limit`.
fn rerank(all: Vec<Candidate>, per_group: u32, limit: u32) -> Vec<Candidate> {
    let mut groups: BTreeMap<(String, Option<String>), Vec<Candidate>> = BTreeMap::new();
    for c in all {
        groups
            .entry((c.tenant.clone(), c.batch_id.clone()))
            .or_default()
            .push(c);
    }
    let mut out: Vec<Candidate> = Vec::new();
    for (_, mut group) in groups {
        group.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.id.cmp(&b.id)));
        for (rank, mut c) in group.into_iter().take(cap(per_group)).enumerate() {
            c.rank = u32::try_from(rank + 1).unwrap_or(u32::MAX);
            out.push(c);
        }
    }
    out.sort_by(|a, b| {
        a.rank
            .cmp(&b.rank)
            .then_with(|| b.priority.cmp(&a.priority))
            .then_with(|| a.id.cmp(&b.id))
    });
    out.truncate(cap(limit));
    out
}

/// The sweeper's writes (wakes, forgotten entries) take up to `limit` per shard: each
/// shard's pass is bounded on its own, and whatever a shard changed is answered (cutting
/// it would leave woken sessions for the next sweep to find without an entry).
#[async_trait]
impl<S: Store> SweepStore for ShardedStore<S> {
    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        let groups = self.split(ids.iter().map(String::as_str));
        let calls = groups.into_iter().map(|(i, positions)| {
            let part: Vec<String> = positions.iter().map(|p| ids[*p].clone()).collect();
            async move { self.on(i).mark_enqueued(&part).await }
        });
        futures::future::try_join_all(calls).await.map(|_| ())
    }

    async fn reset_enqueued(&self, queue: &str) -> Result<u64> {
        self.sum(|s| s.reset_enqueued(queue)).await
    }

    async fn forget_expired_entries(&self, grace: Duration, limit: u32) -> Result<u64> {
        self.sum(|s| s.forget_expired_entries(grace, limit)).await
    }

    /// Each shard's orphans, all of them (up to `limit` each): every one returned has had
    /// its entry forgotten, and the caller queues each.
    async fn requeue_orphans(
        &self,
        queues: &[String],
        limit: u32,
    ) -> Result<Vec<(String, String)>> {
        self.concat(|s| s.requeue_orphans(queues, limit)).await
    }

    async fn forget_workers(&self, age: Duration) -> Result<u64> {
        self.sum(|s| s.forget_workers(age)).await
    }

    async fn unannounced(
        &self,
        grace: Duration,
        limit: u32,
    ) -> Result<Vec<crate::model::SessionRow>> {
        // A read: what is cut is found by the next pass.
        let lists = self.each(|s| s.unannounced(grace, limit)).await?;
        Ok(merge_pages(lists, |r| r.id.clone(), false, cap(limit)))
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        // Oldest first across shards (ids are time-ordered); a read, so what is cut is
        // found by the next pass.
        let lists = self.each(|s| s.unenqueued(age, limit)).await?;
        Ok(merge_pages(lists, |(id, _)| id.clone(), false, cap(limit)))
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<Woken>> {
        self.concat(|s| s.wake_expired_approvals(limit)).await
    }

    async fn wake_due(&self, limit: u32) -> Result<Vec<Woken>> {
        self.concat(|s| s.wake_due(limit)).await
    }

    async fn wake_budget_waiters(&self, tenant: &str, limit: u32) -> Result<Vec<Woken>> {
        self.concat(|s| s.wake_budget_waiters(tenant, limit)).await
    }

    async fn waiting_by_reason(&self) -> Result<Vec<(WaitReason, u64)>> {
        let rows = self.concat(|s| s.waiting_by_reason()).await?;
        Ok(fold(rows, |r| r.0 as u8, |a, b| a.1 += b.1))
    }

    async fn held_by_queue(&self) -> Result<Vec<(String, u64)>> {
        let rows = self.concat(|s| s.held_by_queue()).await?;
        Ok(fold(rows, |r| r.0.clone(), |a, b| a.1 += b.1))
    }

    async fn dispatch_load(&self) -> Result<Vec<ActiveCount>> {
        let rows = self.concat(|s| s.dispatch_load()).await?;
        Ok(fold(
            rows,
            |r| (r.queue.clone(), r.tenant.clone(), r.batch_id.clone()),
            |a, b| {
                a.running += b.running;
                a.buffered += b.buffered;
            },
        ))
    }

    async fn held(&self, queue: &str, per_group: u32, limit: u32) -> Result<Vec<Candidate>> {
        let all = self.concat(|s| s.held(queue, per_group, limit)).await?;
        Ok(rerank(all, per_group, limit))
    }

    async fn any_held(&self, queue: Option<&str>) -> Result<bool> {
        Ok(self
            .each(|s| s.any_held(queue))
            .await?
            .into_iter()
            .any(|h| h))
    }

    async fn release_held(&self, ids: &[String]) -> Result<Vec<String>> {
        let groups = self.split(ids.iter().map(String::as_str));
        let calls = groups.into_iter().map(|(i, positions)| {
            let part: Vec<String> = positions.iter().map(|p| ids[*p].clone()).collect();
            async move { self.on(i).release_held(&part).await }
        });
        let lists = futures::future::try_join_all(calls).await?;
        Ok(lists.into_iter().flatten().collect())
    }

    async fn expire_workspaces(&self, ttl: Duration, limit: u32) -> Result<u64> {
        self.sum(|s| s.expire_workspaces(ttl, limit)).await
    }

    async fn collect_blobs(&self, grace: Duration, limit: u32) -> Result<u64> {
        self.sum(|s| s.collect_blobs(grace, limit)).await
    }
}

#[async_trait]
impl<S: Store> ReportStore for ShardedStore<S> {
    async fn count_sessions(&self, filter: &crate::model::ListFilter) -> Result<Vec<StatusCount>> {
        let rows = self.concat(|s| s.count_sessions(filter)).await?;
        Ok(fold(
            rows,
            |r| (r.status.as_str(), r.wait_reason.map(|w| w as u8)),
            |a, b| a.sessions += b.sessions,
        ))
    }

    /// Most recent day first, as one store answers.
    async fn costs(&self, filter: &CostFilter) -> Result<Vec<CostRow>> {
        let rows = self.concat(|s| s.costs(filter)).await?;
        let mut rows = fold(
            rows,
            |r| (r.day.clone(), r.tenant.clone(), r.model.clone()),
            |a, b| {
                a.sessions += b.sessions;
                a.usage.add(&b.usage);
            },
        );
        rows.sort_by(|a, b| b.day.cmp(&a.day).then_with(|| a.tenant.cmp(&b.tenant)));
        rows.truncate(cap(filter.limit));
        Ok(rows)
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerLeases>> {
        let rows = self.concat(|s| s.workers(limit)).await?;
        let mut rows = fold(
            rows,
            |r| r.worker.clone(),
            |a, b| {
                a.sessions += b.sessions;
                a.first_expiry = earliest(a.first_expiry, b.first_expiry);
                a.last_expiry = a.last_expiry.max(b.last_expiry);
            },
        );
        rows.truncate(cap(limit));
        Ok(rows)
    }
}

#[async_trait]
impl<S: Store> RetentionStore for ShardedStore<S> {
    async fn retention_candidates(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<RetentionCandidate>> {
        let lists = self
            .each(|s| s.retention_candidates(rule, now, limit))
            .await?;
        Ok(interleave(lists, cap(limit)))
    }

    async fn tree_ids(&self, root_id: &str) -> Result<Vec<String>> {
        by_id!(self, "tree_ids", root_id, |s| s.tree_ids(root_id))
    }

    async fn retire_trees(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        roots: &[String],
    ) -> Result<Retired> {
        let groups = self.split(roots.iter().map(String::as_str));
        let calls = groups.into_iter().map(|(i, positions)| {
            let part: Vec<String> = positions.iter().map(|p| roots[*p].clone()).collect();
            async move { self.on(i).retire_trees(rule, now, &part).await }
        });
        let mut total = Retired::default();
        for r in futures::future::try_join_all(calls).await? {
            total.roots.extend(r.roots);
            total.sessions += r.sessions;
            total.pruned += r.pruned;
            total.messages += r.messages;
            total.blob_bytes += r.blob_bytes;
        }
        Ok(total)
    }

    // Rules are global rows: the control shard's, read by the pass of every shard.
    async fn retention_rules(&self) -> Result<Vec<StoredRetentionRule>> {
        self.control().retention_rules().await
    }

    async fn set_retention_rule(&self, rule: &StoredRetentionRule) -> Result<()> {
        self.control().set_retention_rule(rule).await
    }

    async fn delete_retention_rule(&self, kind: RuleKind, name: &str) -> Result<bool> {
        self.control().delete_retention_rule(kind, name).await
    }
}
