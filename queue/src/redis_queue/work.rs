//! The work queue on Redis: [`WorkQueue`] for [`RedisQueue`] (each queue's partitions are
//! streams read by one consumer group; enqueue, read, touch, reclaim, ack, trim and
//! dead-letter, each re-creating a group that a Redis restart lost). Reads on a cluster,
//! one blocking reader per partition, are `read.rs`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::try_join_all;
use redis::{Cmd, RedisError, Value};

use crate::queue::{Delivery, GROUP, WorkQueue};
use agentq_error::{Error, Result};
use agentq_types::model::EnqueueReason;

use super::HISTORY_MAXLEN;
use super::connection::RedisQueue;
use super::layout::Part;
use super::reply::{
    parse_entries, stream_entries, value_items, value_pairs, value_string, value_u64,
};

/// Upper bound of `XAUTOCLAIM` calls per `reclaim` (each scans at most 10×COUNT entries of
/// the pending list).
const RECLAIM_MAX_ROUNDS: usize = 16;

/// Creates the stream and its group unless the group exists: one script, so that no
/// process start makes Redis answer an error (`BUSYGROUP`), which its command statistics
/// would count as a failed call.
const ENSURE_GROUP: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    if g[2] == ARGV[1] then return 0 end
  end
end
redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0', 'MKSTREAM')
return 1
";

impl RedisQueue {
    /// `XREADGROUP` (blocking when `block` is set) over every partition of `queues`, with
    /// `id` (`>` or `0`), re-creating missing groups once.
    async fn read_group(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
        block: Option<Duration>,
        id: &str,
    ) -> Result<Vec<Delivery>> {
        if queues.is_empty() {
            if let Some(block) = block {
                // Nothing to read: behave like an empty blocking read.
                tokio::time::sleep(block).await;
            }
            return Ok(Vec::new());
        }
        if self.is_cluster() {
            return self.read_cluster(queues, consumer, count, block, id).await;
        }
        let parts: Vec<Part> = queues
            .iter()
            .flat_map(|q| self.layout.all().map(move |p| (q.clone(), p)))
            .collect();
        let block = block.filter(|b| !b.is_zero());
        let cmd = self.xreadgroup(&parts, consumer, count, block, id);
        // Every partition on one server: any of its keys names the reader's node.
        let key = parts
            .first()
            .map(|(q, p)| self.layout.stream(q, *p))
            .unwrap_or_default();
        let mut healed = false;
        let reply = loop {
            let result = match block {
                Some(block) => self.blocking_query(&key, &cmd, block).await,
                None => self.query(&cmd).await,
            };
            match result {
                Ok(v) => break v,
                Err(e) if !healed && has_code(&e, "NOGROUP") => {
                    tracing::warn!(
                        ?queues,
                        "consumer group missing (redis restarted?); re-creating"
                    );
                    for q in queues {
                        self.ensure_queue(q).await?;
                    }
                    healed = true;
                }
                Err(e) => return Err(e.into()),
            }
        };
        Ok(self.deliveries(&parts, reply).await)
    }

    /// `XREADGROUP GROUP … [BLOCK ms] STREAMS <the partitions' streams> <id…>`.
    pub(super) fn xreadgroup(
        &self,
        parts: &[Part],
        consumer: &str,
        count: usize,
        block: Option<Duration>,
        id: &str,
    ) -> Cmd {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(count.max(1));
        if let Some(block) = block {
            // BLOCK 0 would block forever: a zero block is a non-blocking read.
            let ms = block.as_millis();
            if ms > 0 {
                cmd.arg("BLOCK").arg(u64::try_from(ms).unwrap_or(u64::MAX));
            }
        }
        cmd.arg("STREAMS");
        for (q, p) in parts {
            cmd.arg(self.layout.stream(q, *p));
        }
        for _ in parts {
            cmd.arg(id);
        }
        cmd
    }

    /// The deliveries of an `XREADGROUP` reply over `parts`; entries without a session id
    /// are acked out of the way.
    pub(super) async fn deliveries(&self, parts: &[Part], reply: Value) -> Vec<Delivery> {
        let by_stream: HashMap<String, &Part> = parts
            .iter()
            .map(|part| (self.layout.stream(&part.0, part.1), part))
            .collect();
        let mut out = Vec::new();
        let mut garbage: HashMap<Part, Vec<String>> = HashMap::new();
        for (stream, entries) in stream_entries(reply) {
            let Some((queue, p)) = by_stream.get(stream.as_str()).copied() else {
                continue;
            };
            for entry in entries {
                match entry.into_delivery(queue) {
                    Ok(mut d) => {
                        d.entry_id = self.layout.entry_id(*p, d.entry_id);
                        out.push(d);
                    }
                    Err(id) => garbage.entry((queue.clone(), *p)).or_default().push(id),
                }
            }
        }
        self.ack_garbage(garbage).await;
        out
    }

    /// The consumer group's `last-delivered-id` on `stream`; `None` without the stream or
    /// the group.
    async fn group_cursor(&self, stream: &str) -> Result<Option<(u64, u64)>> {
        let mut info = redis::cmd("XINFO");
        info.arg("GROUPS").arg(stream);
        let groups = match self.query(&info).await {
            Ok(v) => v,
            Err(e) if e.to_string().contains("no such key") => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        for group in value_items(groups) {
            let fields: HashMap<String, Value> = value_pairs(group)
                .into_iter()
                .filter_map(|(k, v)| Some((value_string(&k)?, v)))
                .collect();
            if fields.get("name").and_then(value_string).as_deref() == Some(GROUP) {
                return Ok(fields
                    .get("last-delivered-id")
                    .and_then(value_string)
                    .as_deref()
                    .and_then(parse_id));
            }
        }
        Ok(None)
    }

    /// Ack entries without a session id (or deleted ones left in the pending list) so they
    /// cannot wedge a worker. Failures are only logged: the entries stay pending and come
    /// back through the reclaimer, which tries again.
    pub(super) async fn ack_garbage(&self, garbage: HashMap<Part, Vec<String>>) {
        for ((queue, p), ids) in garbage {
            tracing::warn!(%queue, partition = p, ?ids, "skipping queue entries without a session_id");
            if let Err(e) = self.ack_raw(&queue, p, &ids).await {
                tracing::warn!(%queue, error = %e, "could not ack malformed queue entries");
            }
        }
    }

    /// `XACK` of stream ids of one partition.
    async fn ack_raw(&self, queue: &str, p: u32, ids: &[String]) -> Result<()> {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(self.layout.stream(queue, p)).arg(GROUP).arg(ids);
        match self.query(&cmd).await {
            Ok(_) => Ok(()),
            // The group is gone (Redis restarted): nothing is pending any more.
            Err(e) if has_code(&e, "NOGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Add `items` to partition `p`'s stream, in one round trip (one slot).
    async fn enqueue_part(
        &self,
        queue: &str,
        p: u32,
        items: &[&(String, EnqueueReason)],
    ) -> Result<()> {
        let stream = self.layout.stream(queue, p);
        let mut pipe = redis::pipe();
        for (session_id, reason) in items {
            // NOMKSTREAM: a nil reply means the stream (and so its group) is missing; we
            // create both below instead of letting XADD create a stream without a group.
            pipe.add_command(xadd_entry(&stream, true, session_id, *reason));
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.conn()).await?;
        let missing: Vec<&&(String, EnqueueReason)> = items
            .iter()
            .zip(replies.iter().chain(std::iter::repeat(&Value::Nil)))
            .filter(|(_, r)| matches!(r, Value::Nil))
            .map(|(item, _)| item)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        self.ensure_part(queue, p).await?;
        let mut pipe = redis::pipe();
        for (session_id, reason) in missing {
            pipe.add_command(xadd_entry(&stream, false, session_id, *reason));
        }
        pipe.exec_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn ensure_part(&self, queue: &str, p: u32) -> Result<()> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(ENSURE_GROUP)
            .arg(1)
            .arg(self.layout.stream(queue, p))
            .arg(GROUP);
        self.query(&cmd).await?;
        Ok(())
    }

    async fn trim_part(&self, queue: &str, p: u32, max_len: u64) -> Result<u64> {
        let stream = self.layout.stream(queue, p);
        let mut xlen = redis::cmd("XLEN");
        xlen.arg(&stream);
        if value_u64(&self.query(&xlen).await?).unwrap_or(0) <= max_len {
            return Ok(0);
        }
        // The group's cursor first, then the pending list: see the parent module's docs.
        let Some(cursor) = self.group_cursor(&stream).await? else {
            // No group: nothing says what was delivered, so nothing may go.
            return Ok(0);
        };
        let mut xpending = redis::cmd("XPENDING");
        xpending.arg(&stream).arg(GROUP);
        let oldest_pending = match self.query(&xpending).await {
            // `[count, smallest id, greatest id, consumers]`; nil ids when none is pending.
            Ok(v) => value_items(v).get(1).and_then(value_string),
            Err(e) if has_code(&e, "NOGROUP") => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let keep_from = match oldest_pending.as_deref().and_then(parse_id) {
            Some(p) => p.min(cursor),
            None => cursor,
        };
        if keep_from == (0, 0) {
            return Ok(0);
        }
        let mut xtrim = redis::cmd("XTRIM");
        xtrim
            .arg(&stream)
            .arg("MINID")
            .arg(format!("{}-{}", keep_from.0, keep_from.1));
        Ok(value_u64(&self.query(&xtrim).await?).unwrap_or(0))
    }

    /// Entries of partition `p` idle past `min_idle`, up to `count`, to `consumer`.
    async fn reclaim_part(
        &self,
        queue: &str,
        p: u32,
        consumer: &str,
        min_idle_ms: u64,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        let stream = self.layout.stream(queue, p);
        let mut cursor = "0-0".to_string();
        let mut out = Vec::new();
        let mut garbage = Vec::new();
        for _ in 0..RECLAIM_MAX_ROUNDS {
            let want = count.saturating_sub(out.len());
            if want == 0 {
                break;
            }
            let mut cmd = redis::cmd("XAUTOCLAIM");
            cmd.arg(&stream)
                .arg(GROUP)
                .arg(consumer)
                .arg(min_idle_ms)
                .arg(&cursor)
                .arg("COUNT")
                .arg(want);
            let reply = match self.query(&cmd).await {
                Ok(v) => v,
                Err(e) if has_code(&e, "NOGROUP") => {
                    tracing::warn!(%queue, "consumer group missing on reclaim; re-creating");
                    self.ensure_part(queue, p).await?;
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            let Value::Array(mut parts) = reply else {
                return Err(unexpected("XAUTOCLAIM reply is not an array"));
            };
            // Redis ≥ 7 adds a third element: ids that were pending but no longer exist
            // (trimmed); Redis removed them from the pending list already, nothing to do.
            if parts.len() >= 3 {
                let deleted = parts.remove(2);
                if let Value::Array(ids) = &deleted
                    && !ids.is_empty()
                {
                    tracing::debug!(%queue, n = ids.len(), "reclaim skipped deleted entries");
                }
            }
            let entries = if parts.len() >= 2 {
                parts.remove(1)
            } else {
                Value::Nil
            };
            let next = parts.first().and_then(value_string);
            for entry in parse_entries(entries) {
                match entry.into_delivery(queue) {
                    Ok(mut d) => {
                        d.entry_id = self.layout.entry_id(p, d.entry_id);
                        out.push(d);
                    }
                    Err(id) => garbage.push(id),
                }
            }
            match next {
                Some(next) if next != "0-0" => cursor = next,
                _ => break,
            }
        }
        if !garbage.is_empty() {
            self.ack_garbage(HashMap::from([((queue.to_string(), p), garbage)]))
                .await;
        }
        Ok(out)
    }
}

#[async_trait]
impl WorkQueue for RedisQueue {
    async fn ensure_queue(&self, queue: &str) -> Result<()> {
        try_join_all(self.layout.all().map(|p| self.ensure_part(queue, p))).await?;
        Ok(())
    }

    async fn enqueue(&self, queue: &str, session_id: &str, reason: EnqueueReason) -> Result<()> {
        self.enqueue_many(queue, &[(session_id.to_string(), reason)])
            .await
    }

    async fn enqueue_many(&self, queue: &str, items: &[(String, EnqueueReason)]) -> Result<()> {
        // One pipeline per partition (one slot each), the partitions in parallel.
        let mut parts: BTreeMap<u32, Vec<&(String, EnqueueReason)>> = BTreeMap::new();
        for item in items {
            parts
                .entry(self.layout.partition_of(&item.0))
                .or_default()
                .push(item);
        }
        try_join_all(
            parts
                .iter()
                .map(|(p, items)| self.enqueue_part(queue, *p, items)),
        )
        .await?;
        Ok(())
    }

    async fn read(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        self.read_group(queues, consumer, count, Some(block), ">")
            .await
    }

    async fn read_own_pending(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        self.read_group(queues, consumer, count, None, "0").await
    }

    async fn touch(&self, queue: &str, consumer: &str, entry_ids: &[String]) -> Result<()> {
        for (p, ids) in self.layout.by_partition(entry_ids) {
            let mut cmd = redis::cmd("XCLAIM");
            // min-idle 0 to ourselves: resets the idle time, keeps ownership; JUSTID does
            // not bump the delivery counter.
            cmd.arg(self.layout.stream(queue, p))
                .arg(GROUP)
                .arg(consumer)
                .arg(0)
                .arg(&ids)
                .arg("JUSTID");
            match self.query(&cmd).await {
                Ok(_) => {}
                Err(e) if has_code(&e, "NOGROUP") => {
                    // Redis lost the stream: nothing left to touch; restore the group for
                    // the next enqueue and read.
                    tracing::warn!(%queue, "consumer group missing on touch; re-creating");
                    self.ensure_part(queue, p).await?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn reclaim(
        &self,
        queue: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        let min_idle_ms = u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX);
        let mut out = Vec::new();
        for p in self.layout.all() {
            let want = count.saturating_sub(out.len());
            if want == 0 {
                break;
            }
            out.extend(
                self.reclaim_part(queue, p, consumer, min_idle_ms, want)
                    .await?,
            );
        }
        Ok(out)
    }

    async fn ack(&self, queue: &str, entry_ids: &[String]) -> Result<()> {
        let parts = self.layout.by_partition(entry_ids);
        try_join_all(parts.iter().map(|(p, ids)| self.ack_raw(queue, *p, ids))).await?;
        Ok(())
    }

    async fn trim(&self, queue: &str, max_len: u64) -> Result<u64> {
        let mut dropped = 0u64;
        for p in self.layout.all() {
            dropped = dropped.saturating_add(self.trim_part(queue, p, max_len).await?);
        }
        Ok(dropped)
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<()> {
        let Some((p, id)) = self.layout.split_id(&delivery.entry_id) else {
            return Err(Error::invalid(
                "entry_id",
                format!("{:?} is not an entry id of this queue", delivery.entry_id),
            ));
        };
        // The dead letter shares the partition's hash tag: one slot, so one MULTI.
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XADD")
            .arg(self.layout.dead(&delivery.queue, p))
            .arg("MAXLEN")
            .arg("~")
            .arg(HISTORY_MAXLEN)
            .arg("*")
            .arg("session_id")
            .arg(&delivery.session_id)
            .arg("queue")
            .arg(&delivery.queue)
            .arg("entry_id")
            .arg(&delivery.entry_id)
            .arg("reason")
            .arg(reason)
            .arg("enqueue_reason")
            .arg(delivery.reason.as_str())
            .ignore()
            .cmd("XACK")
            .arg(self.layout.stream(&delivery.queue, p))
            .arg(GROUP)
            .arg(id)
            .ignore();
        pipe.exec_async(&mut self.conn()).await?;
        Ok(())
    }
}

/// `XADD <stream> [NOMKSTREAM] * session_id <id> reason <reason>`, trimming nothing (see
/// the docs of [`crate::redis_queue`]).
fn xadd_entry(stream: &str, no_mkstream: bool, session_id: &str, reason: EnqueueReason) -> Cmd {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream);
    if no_mkstream {
        cmd.arg("NOMKSTREAM");
    }
    cmd.arg("*")
        .arg("session_id")
        .arg(session_id)
        .arg("reason")
        .arg(reason.as_str());
    cmd
}

/// A stream entry id `<ms>-<seq>` as a pair that orders as Redis orders ids.
fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// Whether the error (or one of a pipeline's errors) carries the server code `code`.
pub(super) fn has_code(e: &RedisError, code: &str) -> bool {
    if e.code() == Some(code) {
        return true;
    }
    e.clone()
        .into_server_errors()
        .is_some_and(|errs| errs.iter().any(|(_, se)| se.code() == code))
}

fn unexpected(what: &str) -> Error {
    Error::Redis(RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "unexpected reply",
        what.to_string(),
    )))
}
