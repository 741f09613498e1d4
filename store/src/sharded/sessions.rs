//! Sessions, leases and inboxes on the sharded store: every call names one session (or a
//! lease of one) and goes to its tree's shard, except the group commit and the heartbeat,
//! split by shard, and the listings and counts, asked of every shard.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::state::SessionState;
use agentq_types::shard::{id_in, key_partition, partition_of};

use super::ShardedStore;
use super::merge::{cap, each_failed, fold, merge_pages, per_shard, reassemble};
use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::fork::{ForkResult, NewFork};
use crate::model::{
    ApprovalRecorded, CancelResult, Claim, Delivered, InboxItem, Lease, ListFilter, NewSession,
    SessionRow, SessionStatus,
};
use crate::protocol::{InboxKind, InboxPayload};
use crate::store::{
    Committed, InboxStore, LeaseStatus, LeaseStore, RetryResult, SessionStore, Store,
};
use crate::wait::WaitReason;

impl<S: Store> ShardedStore<S> {
    /// `new` with an id on the shard its tree must live on: a child beside its root, a
    /// root that starts from another tree's files beside that tree, else a root with an
    /// idempotency key on the shard of its key (where a retry of it lands too). Callers mint such ids
    /// already (`agentq_types::shard`); this keeps a caller that did not from writing a
    /// tree across shards.
    pub(super) fn placed<'a>(&self, new: &'a NewSession) -> Cow<'a, NewSession> {
        let is_root = is_root(new);
        let anchor = match (&new.workspace_from, &new.idempotency_key, is_root) {
            (_, _, false) => new.root_id.clone(),
            (Some(from), _, true) => from.clone(),
            (None, Some(key), true) => id_in(key_partition(&new.tenant, key)),
            (None, None, true) => return Cow::Borrowed(new),
        };
        if self.index(&new.id) == self.index(&anchor) {
            return Cow::Borrowed(new);
        }
        let mut moved = new.clone();
        moved.id = self.shard_map().id_beside(&anchor);
        if is_root {
            moved.root_id = moved.id.clone();
        }
        Cow::Owned(moved)
    }

    /// The session a keyed root's retry finds on a shard its key picked in an earlier
    /// generation of the map (a submit first made before a shard was added); none for
    /// any other session, or with one generation.
    async fn keyed_before(&self, new: &NewSession) -> Result<Option<SessionRow>> {
        let (true, None, Some(key)) = (
            is_root(new),
            &new.workspace_from,
            new.idempotency_key.as_deref(),
        ) else {
            return Ok(None);
        };
        let map = self.shard_map();
        let (Some(g), Some(p)) = (map.generation_of(&new.id), partition_of(&new.id)) else {
            return Ok(None);
        };
        for i in map.earlier_shards(g, p) {
            if i < self.len()
                && let Some(row) = self.on(i).session_with_key(&new.tenant, key).await?
            {
                return Ok(Some(row));
            }
        }
        Ok(None)
    }
}

/// A session without a parent, its own root.
fn is_root(new: &NewSession) -> bool {
    new.parent_id.is_none() && new.root_id == new.id
}

#[async_trait]
impl<S: Store> SessionStore for ShardedStore<S> {
    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)> {
        let new = self.placed(new);
        if let Some(row) = self.keyed_before(&new).await? {
            return Ok((row, false));
        }
        by_id!(self, "create_session", &new.root_id, |s| s
            .create_session(&new))
    }

    /// One transaction per shard: items of one tree, or of one request minted in one
    /// partition (as the API does), are all-or-nothing; items spread over shards are
    /// all-or-nothing per shard only.
    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>> {
        let placed: Vec<NewSession> = new.iter().map(|n| self.placed(n).into_owned()).collect();
        let groups = self.split(placed.iter().map(|n| n.root_id.as_str()));
        let calls =
            groups.into_iter().map(|(i, positions)| {
                let items: Vec<NewSession> = positions.iter().map(|p| placed[*p].clone()).collect();
                async move {
                    Ok::<_, crate::Error>((positions, self.on(i).create_sessions(&items).await?))
                }
            });
        let answers = futures::future::try_join_all(calls).await?;
        reassemble(placed.len(), answers)
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        by_id!(self, "get", id, |s| s.get(id))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        if let Some(parent) = &filter.parent_id {
            return by_id!(self, "list", parent, |s| s.list(filter));
        }
        let pages = self.each(|s| s.list(filter)).await?;
        let limit = cap(crate::sql::statements::list_limit(filter.limit));
        Ok(merge_pages(
            pages,
            |r| r.id.clone(),
            !filter.oldest_first,
            limit,
        ))
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        by_id!(self, "messages", id, |s| s.messages(id))
    }

    /// On the origin's shard: the fork reads its history there, in place.
    async fn fork_session(&self, fork: &NewFork) -> Result<ForkResult> {
        let fork = if self.index(&fork.new.id) == self.index(&fork.origin) {
            Cow::Borrowed(fork)
        } else {
            let mut moved = fork.clone();
            moved.new.id = self.shard_map().id_beside(&fork.origin);
            moved.new.root_id = moved.new.id.clone();
            Cow::Owned(moved)
        };
        by_id!(self, "fork_session", &fork.origin, |s| s
            .fork_session(&fork))
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        by_id!(self, "fail", id, |s| s.fail(id, reason))
    }

    async fn mark_announced(&self, id: &str) -> Result<()> {
        by_id!(self, "mark_announced", id, |s| s.mark_announced(id))
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        by_id!(self, "request_cancel", id, |s| s.request_cancel(id))
    }

    async fn retry(&self, id: &str, hold: bool) -> Result<RetryResult> {
        by_id!(self, "retry", id, |s| s.retry(id, hold))
    }

    async fn ping(&self) -> Result<()> {
        self.each(|s| s.ping()).await.map(|_| ())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        let rows = self.concat(|s| s.count_unfinished()).await?;
        Ok(fold(rows, |r| r.0.as_str(), |a, b| a.1 += b.1))
    }
}

#[async_trait]
impl<S: Store> LeaseStore for ShardedStore<S> {
    async fn claim(
        &self,
        id: &str,
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Claim> {
        by_id!(self, "claim", id, |s| s.claim(id, owner, ttl, max_attempts))
    }

    /// One group claim per shard, at once, each session's routed as its lone claim is (an
    /// id that cannot be routed is answered with that error alone). A shard that is down
    /// fails only its own claims, as the group commit does.
    async fn claim_batch(
        &self,
        ids: &[&str],
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Vec<Result<Claim>>> {
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut unrouted = Vec::new();
        for (pos, id) in ids.iter().enumerate() {
            match self.route(id).await {
                Ok(i) => groups.entry(i).or_default().push(pos),
                Err(e) => unrouted.push((vec![pos], vec![Err(e)])),
            }
        }
        let calls = groups.into_iter().map(|(i, positions)| {
            let part: Vec<&str> = positions.iter().map(|p| ids[*p]).collect();
            async move {
                let answer = self
                    .on(i)
                    .claim_batch(&part, owner, ttl, max_attempts)
                    .await;
                (positions, answer)
            }
        });
        let answers = futures::future::join_all(calls).await;
        let mut answers = per_shard(answers, each_failed)?;
        answers.extend(unrouted);
        reassemble(ids.len(), answers)
    }

    async fn checkpoint(&self, lease: &Lease, state: &SessionState, from: usize) -> Result<()> {
        by_id!(self, "checkpoint", &lease.root_id, |s| s
            .checkpoint(lease, state, from))
    }

    /// One commit per shard, at once. A shard that is down (a retryable failure) fails
    /// only its own checkpoints, each on its own, so the sessions of the other shards go
    /// on; any other failure, or every shard down, fails the batch as a whole (nothing of
    /// it may be assumed written, and the caller splits or retries it).
    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        let groups = self.split(batch.iter().map(|c| c.lease.root_id.as_str()));
        let calls = groups.into_iter().map(|(i, positions)| {
            let part: Vec<&Checkpoint> = positions.iter().map(|p| batch[*p]).collect();
            async move { (positions, self.on(i).checkpoint_batch(&part).await) }
        });
        let answers = futures::future::join_all(calls).await;
        let answers = per_shard(answers, each_failed)?;
        reassemble(batch.len(), answers)
    }

    /// Split by shard as the group commit is, and sent to every shard, since each shard's
    /// claims read the worker's liveness row there (a shard without its leases gets the
    /// beat alone). The leases of a shard that is down are answered neither held nor lost
    /// (the next checkpoint's fencing decides), so the others' are still renewed.
    async fn heartbeat(
        &self,
        worker: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<LeaseStatus>> {
        let mut groups: Vec<Vec<usize>> = vec![Vec::new(); self.len()];
        for (i, positions) in self.split(leases.iter().map(|l| l.root_id.as_str())) {
            groups[i] = positions;
        }
        let calls = groups.into_iter().enumerate().map(|(i, positions)| {
            let part: Vec<Lease> = positions.iter().map(|p| leases[*p].clone()).collect();
            async move { (positions, self.on(i).heartbeat(worker, &part, ttl).await) }
        });
        let answers = futures::future::join_all(calls).await;
        let answers = per_shard(answers, |_, positions| {
            positions
                .iter()
                .map(|p| LeaseStatus {
                    session_id: leases[*p].session_id.clone(),
                    held: false,
                    lost: false,
                    cancel_requested: false,
                })
                .collect()
        })?;
        reassemble(leases.len(), answers)
    }

    async fn leases_of(&self, worker: &str) -> Result<Vec<(Lease, String)>> {
        self.concat(|s| s.leases_of(worker)).await
    }

    /// Every shard has the worker's row.
    async fn retire_worker(&self, worker: &str) -> Result<()> {
        self.each(|s| s.retire_worker(worker)).await.map(|_| ())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        by_id!(self, "release", &lease.root_id, |s| s.release(lease))
    }

    async fn suspend(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        by_id!(self, "suspend", &lease.root_id, |s| s.suspend(
            lease,
            status,
            seen_wake,
            approval_deadline
        ))
    }

    async fn suspend_for(
        &self,
        lease: &Lease,
        seen_wake: i64,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        by_id!(self, "suspend_for", &lease.root_id, |s| s
            .suspend_for(lease, seen_wake, reason, wake_at))
    }
}

#[async_trait]
impl<S: Store> InboxStore for ShardedStore<S> {
    async fn deliver(
        &self,
        session_id: &str,
        kind: InboxKind,
        dedupe: &str,
        payload: &InboxPayload,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>> {
        by_id!(self, "deliver", session_id, |s| s
            .deliver(session_id, kind, dedupe, payload, wake))
    }

    async fn inbox(
        &self,
        session_id: &str,
        kinds: &[InboxKind],
        after: u64,
    ) -> Result<Vec<InboxItem>> {
        by_id!(self, "inbox", session_id, |s| s
            .inbox(session_id, kinds, after))
    }

    async fn decide_approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
        approve: bool,
        reason: Option<&str>,
        arguments: Option<&str>,
    ) -> Result<ApprovalRecorded> {
        by_id!(self, "decide_approval", session_id, |s| s.decide_approval(
            session_id,
            tool_call_id,
            approve,
            reason,
            arguments
        ))
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>, Option<String>)>> {
        by_id!(self, "approval", session_id, |s| s
            .approval(session_id, tool_call_id))
    }

    async fn pending_approvals(&self, session_id: &str, held: &[String]) -> Result<Vec<ToolCall>> {
        by_id!(self, "pending_approvals", session_id, |s| s
            .pending_approvals(session_id, held))
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        by_id!(self, "follow_up", session_id, |s| s
            .follow_up(session_id, text, consume))
    }
}
