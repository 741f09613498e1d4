//! The work queue on Redis: [`WorkQueue`] for [`RedisQueue`] (one stream per queue read by
//! one consumer group; enqueue, read, touch, reclaim, ack, trim and dead-letter, each
//! re-creating a group that a Redis restart lost).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Cmd, RedisError, Value};

use crate::queue::{DEAD_STREAM, Delivery, GROUP, WorkQueue, queue_stream};
use agentq_error::{Error, Result};
use agentq_types::model::EnqueueReason;

use super::HISTORY_MAXLEN;
use super::connection::RedisQueue;
use super::reply::{
    parse_entries, stream_entries, value_items, value_pairs, value_string, value_u64,
};

/// Upper bound of `XAUTOCLAIM` calls per `reclaim` (each scans at most 10×COUNT entries of
/// the pending list).
const RECLAIM_MAX_ROUNDS: usize = 16;

impl RedisQueue {
    /// `XREADGROUP` (blocking when `block` is set) over `queues` with `id` (`>` or `0`),
    /// re-creating missing groups once.
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
        let streams: Vec<String> = queues.iter().map(|q| queue_stream(q)).collect();
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
        cmd.arg("STREAMS").arg(&streams);
        for _ in queues {
            cmd.arg(id);
        }

        let mut healed = false;
        let reply = loop {
            let result = match block {
                Some(block) if !block.is_zero() => self.blocking_query(&cmd, block).await,
                _ => self.query(&cmd).await,
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

        let by_stream: HashMap<&str, &String> = streams
            .iter()
            .map(String::as_str)
            .zip(queues.iter())
            .collect();
        let mut out = Vec::new();
        let mut garbage: HashMap<String, Vec<String>> = HashMap::new();
        for (stream, entries) in stream_entries(reply) {
            let queue = match by_stream.get(stream.as_str()) {
                Some(q) => (*q).clone(),
                None => match stream.strip_prefix("agentq:queue:") {
                    Some(q) => q.to_string(),
                    None => continue,
                },
            };
            for entry in entries {
                match entry.into_delivery(&queue) {
                    Ok(d) => out.push(d),
                    Err(id) => garbage.entry(queue.clone()).or_default().push(id),
                }
            }
        }
        self.ack_garbage(garbage).await;
        Ok(out)
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
    async fn ack_garbage(&self, garbage: HashMap<String, Vec<String>>) {
        for (queue, ids) in garbage {
            tracing::warn!(%queue, ?ids, "skipping queue entries without a session_id");
            if let Err(e) = self.ack(&queue, &ids).await {
                tracing::warn!(%queue, error = %e, "could not ack malformed queue entries");
            }
        }
    }
}

#[async_trait]
impl WorkQueue for RedisQueue {
    async fn ensure_queue(&self, queue: &str) -> Result<()> {
        let mut cmd = redis::cmd("XGROUP");
        // Id 0, not `$`: entries added before the group existed must be delivered too.
        cmd.arg("CREATE")
            .arg(queue_stream(queue))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM");
        match self.query(&cmd).await {
            Ok(_) => Ok(()),
            Err(e) if has_code(&e, "BUSYGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn enqueue(&self, queue: &str, session_id: &str, reason: EnqueueReason) -> Result<()> {
        self.enqueue_many(queue, &[(session_id.to_string(), reason)])
            .await
    }

    async fn enqueue_many(&self, queue: &str, items: &[(String, EnqueueReason)]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        let stream = queue_stream(queue);
        let mut pipe = redis::pipe();
        for (session_id, reason) in items {
            // NOMKSTREAM: a nil reply means the stream (and so its group) is missing; we
            // create both below instead of letting XADD create a stream without a group.
            pipe.add_command(xadd_entry(&stream, true, session_id, *reason));
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.conn()).await?;
        let missing: Vec<&(String, EnqueueReason)> = items
            .iter()
            .zip(replies.iter().chain(std::iter::repeat(&Value::Nil)))
            .filter(|(_, r)| matches!(r, Value::Nil))
            .map(|(item, _)| item)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        self.ensure_queue(queue).await?;
        let mut pipe = redis::pipe();
        for (session_id, reason) in missing {
            pipe.add_command(xadd_entry(&stream, false, session_id, *reason));
        }
        pipe.exec_async(&mut self.conn()).await?;
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
        if entry_ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XCLAIM");
        // min-idle 0 to ourselves: resets the idle time, keeps ownership; JUSTID does not
        // bump the delivery counter.
        cmd.arg(queue_stream(queue))
            .arg(GROUP)
            .arg(consumer)
            .arg(0)
            .arg(entry_ids)
            .arg("JUSTID");
        match self.query(&cmd).await {
            Ok(_) => Ok(()),
            Err(e) if has_code(&e, "NOGROUP") => {
                // Redis lost the stream: nothing left to touch; restore the group for
                // the next enqueue and read.
                tracing::warn!(%queue, "consumer group missing on touch; re-creating");
                self.ensure_queue(queue).await
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn reclaim(
        &self,
        queue: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        let stream = queue_stream(queue);
        let min_idle_ms = u64::try_from(min_idle.as_millis()).unwrap_or(u64::MAX);
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
                    self.ensure_queue(queue).await?;
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
                    Ok(d) => out.push(d),
                    Err(id) => garbage.push(id),
                }
            }
            match next {
                Some(next) if next != "0-0" => cursor = next,
                _ => break,
            }
        }
        if !garbage.is_empty() {
            self.ack_garbage(HashMap::from([(queue.to_string(), garbage)]))
                .await;
        }
        Ok(out)
    }

    async fn ack(&self, queue: &str, entry_ids: &[String]) -> Result<()> {
        if entry_ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(queue_stream(queue)).arg(GROUP).arg(entry_ids);
        match self.query(&cmd).await {
            Ok(_) => Ok(()),
            // The group is gone (Redis restarted): nothing is pending any more.
            Err(e) if has_code(&e, "NOGROUP") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn trim(&self, queue: &str, max_len: u64) -> Result<u64> {
        let stream = queue_stream(queue);
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

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XADD")
            .arg(DEAD_STREAM)
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
            .arg(queue_stream(&delivery.queue))
            .arg(GROUP)
            .arg(&delivery.entry_id)
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
fn has_code(e: &RedisError, code: &str) -> bool {
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
