//! [`RedisQueue`]: the [`crate::queue::Queue`] on Redis Streams.
//!
//! This module owns every Redis key and channel agentq uses for work and news:
//! - one stream per queue, `agentq:queue:<name>`, read by the consumer group
//!   `agentq-workers` (created at id `0`, so entries added before the group are not lost);
//!   entries carry `session_id` and `reason`;
//! - the dead-letter stream `agentq:dead`, the completion stream `agentq:completions`;
//! - the pub/sub channels `agentq:done`, `agentq:done:<id>` and `agentq:cancel`.
//!
//! # Connections
//! - Ordinary commands share one [`ConnectionManager`] (multiplexed, reconnects by itself
//!   after the server drops it; a command that fails while Redis is down returns a
//!   retryable error, and the next ones work once Redis is back).
//! - Blocking `XREADGROUP … BLOCK` runs on reader connections of its own, with no response
//!   timeout (redis-rs 1.x defaults to 500 ms, which would fail any longer block) but an
//!   outer deadline of `block` + [`READ_GRACE`]. A reader is checked out of a small idle
//!   list for the duration of one read and only returned after a complete reply (data or
//!   a server error such as `NOGROUP`): a read that fails, times out or is dropped
//!   mid-flight (cancelled) drops its connection, so no connection is ever reused with a
//!   reply still in flight. Entries a dropped read had already been delivered stay pending
//!   for the consumer: `read_own_pending` (ID `0`) or the reclaimer gets them back.
//! - Each subscription has a dedicated pub/sub connection; the returned stream reconnects
//!   and re-subscribes with backoff when the connection is lost (messages published while
//!   it is down are missed: pub/sub is fire-and-forget, the completion stream is the
//!   durable record). It pings the server periodically so a silently dead connection is
//!   noticed. The stream ends only when dropped.
//!
//! # Healing after a Redis restart without persistence
//! The streams and the group are gone then. `XADD … NOMKSTREAM` tells the enqueuer (nil
//! reply) that the stream is missing, so it re-creates stream and group before adding —
//! a stream never exists without its group, which KEDA's lag scaler needs. Reads, claims
//! and touches that get `NOGROUP` re-create the group (and retry, for reads).
//!
//! # Trimming
//! `XADD` to a queue stream trims nothing: `MAXLEN` would drop the oldest entries whether
//! or not they are acked, and the entry of a session that runs for hours is the oldest
//! one pending; once it is gone, a touch (`XCLAIM`) drops it from the pending list and a
//! dead worker's session is reclaimed by nobody. Acked history is dropped instead by
//! [`WorkQueue::trim`] (the scheduler's sweeper, past a length it is configured with):
//! `XTRIM MINID` at the oldest entry that is pending or not yet delivered, read before the
//! trim (an entry delivered meanwhile is newer than the group's cursor read first, so it is
//! kept). Entries are never `XDEL`eted, and the trim never passes the group's cursor, so
//! the group's `lag` stays known. The dead-letter and completion streams are capped at
//! [`HISTORY_MAXLEN`].

mod reply;
mod subscription;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::io::tcp::TcpSettings;
use redis::io::tcp::socket2::TcpKeepalive;
use redis::{
    AsyncConnectionConfig, Client, Cmd, IntoConnectionInfo, RedisError, RedisResult, Value,
};

use crate::error::{Error, Result};
use crate::model::{Completion, EnqueueReason};
use crate::protocol::WorkerSignal;
use reply::{
    event_record, parse_entries, stream_entries, value_items, value_pairs, value_string, value_u64,
};
use subscription::subscribe;

use crate::queue::{
    CANCEL_CHANNEL, COMPLETIONS_STREAM, DEAD_STREAM, DONE_CHANNEL, Delivery, EventRecord,
    EventStreams, GROUP, QueueHealth, QueueStats, Signals, WorkQueue, done_channel, events_stream,
    queue_stream,
};

/// Approximate cap on `agentq:dead` and `agentq:completions`.
pub const HISTORY_MAXLEN: usize = 100_000;
/// Cap of each session's event stream: text deltas make it long; the transcript in the
/// store is the record, this is for following a session live.
pub const EVENTS_MAXLEN: usize = 20_000;
/// How long a blocking read may take beyond its `BLOCK` before the reader gives up on the
/// connection (a half-open TCP connection would otherwise hang it forever).
pub const READ_GRACE: Duration = Duration::from_secs(5);

/// Connect timeout of every connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Response timeout of the shared command connection. Longer than redis-rs's 500 ms so a
/// busy server or a large pipeline does not fail spuriously.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect attempts of the command connection before a command fails: kept small so
/// commands fail fast (retryably) while Redis is down; the next command tries again.
const COMMAND_RECONNECT_RETRIES: usize = 2;
/// Idle reader connections kept for reuse.
const MAX_IDLE_READERS: usize = 8;
/// Reconnect backoff of subscriptions.
const SUB_BACKOFF_MIN: Duration = Duration::from_millis(100);
const SUB_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a subscription checks its connection with a PING.
const SUB_PING_EVERY: Duration = Duration::from_secs(15);
/// Upper bound of `XAUTOCLAIM` calls per `reclaim` (each scans at most 10×COUNT entries of
/// the pending list).
const RECLAIM_MAX_ROUNDS: usize = 16;

/// The [`crate::queue::Queue`] on Redis Streams. Cheap to share behind an `Arc`; see the module docs.
pub struct RedisQueue {
    client: Client,
    conn: ConnectionManager,
    /// Idle reader connections for blocking reads (no response timeout).
    readers: Mutex<Vec<MultiplexedConnection>>,
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue")
            .field("server", &self.client.get_connection_info().addr())
            .finish_non_exhaustive()
    }
}

impl RedisQueue {
    /// Open the shared command connection to `url` (`redis://[:password@]host:port[/db]`).
    /// Fails when Redis cannot be reached now; once connected, the queue survives Redis
    /// restarts without being re-created.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = Client::open(url.into_connection_info()?.set_tcp_settings(tcp_settings()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(COMMAND_RECONNECT_RETRIES)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok(RedisQueue {
            client,
            conn,
            readers: Mutex::new(Vec::new()),
        })
    }

    fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        cmd.query_async(&mut self.conn()).await
    }

    /// A reader connection: an idle one if any (`true`: it may have gone stale), else a
    /// new one.
    async fn checkout_reader(&self) -> RedisResult<(MultiplexedConnection, bool)> {
        let idle = self.readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(conn) = idle {
            return Ok((conn, true));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            // Blocking reads outlast any fixed response timeout; `blocking_query` puts its
            // own deadline around each one.
            .set_response_timeout(None);
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok((conn, false))
    }

    fn return_reader(&self, conn: MultiplexedConnection) {
        let mut idle = self.readers.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }

    /// Run a blocking command on a reader connection. A connection that was idle in the
    /// list and turns out dead (Redis restarted meanwhile) is replaced once.
    async fn blocking_query(&self, cmd: &Cmd, block: Duration) -> RedisResult<Value> {
        let mut tried_fresh = false;
        loop {
            let (mut conn, pooled) = self.checkout_reader().await?;
            tried_fresh |= !pooled;
            let result =
                match tokio::time::timeout(block + READ_GRACE, cmd.query_async(&mut conn)).await {
                    Ok(r) => r,
                    Err(_) => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "blocking read got no reply within its block + grace",
                    ))),
                };
            match result {
                Ok(v) => {
                    self.return_reader(conn);
                    return Ok(v);
                }
                // A server error (e.g. NOGROUP) leaves the connection in a clean state.
                Err(e) if !e.is_io_error() && !e.is_unrecoverable_error() => {
                    self.return_reader(conn);
                    return Err(e);
                }
                Err(e) if pooled && !tried_fresh && e.is_connection_dropped() => {
                    tracing::debug!(error = %e, "idle redis reader connection was dead; reconnecting");
                    drop(conn);
                    // Drain the other idle readers too: they share the dead server.
                    self.readers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                    tried_fresh = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

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

    /// Ack entries without a session id (or deleted ones left in the pending list) so they
    /// cannot wedge a worker. Failures are only logged: the entries stay pending and come
    /// back through the reclaimer, which tries again.
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
        // The group's cursor first, then the pending list: see the module docs.
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

#[async_trait]
impl Signals for RedisQueue {
    async fn publish_completion(&self, completion: &Completion) -> Result<()> {
        let json = serde_json::to_string(completion)?;
        let mut pipe = redis::pipe();
        pipe.cmd("PUBLISH")
            .arg(done_channel(&completion.session_id))
            .arg(&json)
            .ignore()
            .cmd("PUBLISH")
            .arg(DONE_CHANNEL)
            .arg(&json)
            .ignore()
            .cmd("XADD")
            .arg(COMPLETIONS_STREAM)
            .arg("MAXLEN")
            .arg("~")
            .arg(HISTORY_MAXLEN)
            .arg("*")
            .arg("session_id")
            .arg(&completion.session_id)
            .arg("data")
            .arg(&json)
            .ignore();
        pipe.exec_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn publish_signal(&self, signal: &WorkerSignal) -> Result<()> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(CANCEL_CHANNEL).arg(signal.encode());
        self.query(&cmd).await?;
        Ok(())
    }

    async fn subscribe_signals(&self) -> Result<BoxStream<'static, WorkerSignal>> {
        let raw = subscribe(self.client.clone(), CANCEL_CHANNEL.to_string()).await?;
        Ok(raw.map(|msg| WorkerSignal::decode(&msg)).boxed())
    }

    async fn subscribe_completion(
        &self,
        session_id: &str,
    ) -> Result<BoxStream<'static, Completion>> {
        let raw = subscribe(self.client.clone(), done_channel(session_id)).await?;
        Ok(raw
            .filter_map(|payload| async move {
                match serde_json::from_str::<Completion>(&payload) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "ignoring malformed completion message");
                        None
                    }
                }
            })
            .boxed())
    }
}

#[async_trait]
impl EventStreams for RedisQueue {
    async fn append_events(&self, events: &[EventRecord]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for e in events {
            pipe.cmd("XADD")
                .arg(events_stream(&e.session_id))
                .arg("MAXLEN")
                .arg("~")
                .arg(EVENTS_MAXLEN)
                .arg("*")
                .arg("seq")
                .arg(e.seq)
                .arg("epoch")
                .arg(e.epoch)
                .arg("data")
                .arg(&e.data)
                .ignore();
        }
        let _: () = pipe.query_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count.max(1));
        let block = block.filter(|b| !b.is_zero());
        if let Some(b) = block {
            cmd.arg("BLOCK")
                .arg(u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
        }
        cmd.arg("STREAMS").arg(events_stream(session_id)).arg(after);
        let reply = match block {
            Some(b) => self.blocking_query(&cmd, b).await?,
            None => self.query(&cmd).await?,
        };
        Ok(stream_entries(reply)
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .filter_map(|e| event_record(session_id, e))
            .collect())
    }

    async fn read_events_many(
        &self,
        from: &[(String, String)],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let block = block.filter(|b| !b.is_zero());
        if from.is_empty() {
            if let Some(b) = block {
                tokio::time::sleep(b).await;
            }
            return Ok(Vec::new());
        }
        if let Some((_, after)) = from.iter().find(|(_, a)| a.as_str() == "$") {
            return Err(Error::invalid(
                "after",
                format!("{after:?}: read_events_many takes entry ids only"),
            ));
        }
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count.max(1));
        if let Some(b) = block {
            cmd.arg("BLOCK")
                .arg(u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
        }
        cmd.arg("STREAMS");
        for (session_id, _) in from {
            cmd.arg(events_stream(session_id));
        }
        for (_, after) in from {
            cmd.arg(after);
        }
        let reply = match block {
            Some(b) => self.blocking_query(&cmd, b).await?,
            None => self.query(&cmd).await?,
        };
        let prefix = events_stream("");
        Ok(stream_entries(reply)
            .into_iter()
            .filter_map(|(stream, entries)| {
                let session_id = stream.strip_prefix(prefix.as_str())?.to_string();
                Some((session_id, entries))
            })
            .flat_map(|(session_id, entries)| {
                entries
                    .into_iter()
                    .filter_map(move |e| event_record(&session_id, e))
            })
            .collect())
    }

    async fn last_events(&self, session_id: &str, count: usize) -> Result<Vec<EventRecord>> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(events_stream(session_id))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count.max(1));
        let reply = self.query(&cmd).await?;
        Ok(parse_entries(reply)
            .into_iter()
            .filter_map(|e| event_record(session_id, e))
            .collect())
    }

    async fn expire_events(&self, session_id: &str, ttl: Duration) -> Result<()> {
        let mut cmd = redis::cmd("PEXPIRE");
        cmd.arg(events_stream(session_id))
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self.query(&cmd).await?;
        Ok(())
    }
}

#[async_trait]
impl QueueHealth for RedisQueue {
    async fn check_lost(&self, queue: &str) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(marker_key(queue));
        let n: i64 = cmd.query_async(&mut self.conn()).await?;
        Ok(n == 0)
    }

    async fn mark_queue(&self, queue: &str) -> Result<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(marker_key(queue)).arg("1");
        self.query(&cmd).await?;
        Ok(())
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let stream = queue_stream(queue);
        let mut info = redis::cmd("XINFO");
        info.arg("GROUPS").arg(&stream);
        let groups = match self.query(&info).await {
            Ok(v) => v,
            // No stream yet: empty, and no group whose lag could be known.
            Err(e) if e.to_string().contains("no such key") => {
                return Ok(QueueStats::default());
            }
            Err(e) => return Err(e.into()),
        };
        let mut stats = QueueStats::default();
        for group in value_items(groups) {
            let fields: HashMap<String, Value> = value_pairs(group)
                .into_iter()
                .filter_map(|(k, v)| Some((value_string(&k)?, v)))
                .collect();
            if fields.get("name").and_then(value_string).as_deref() != Some(GROUP) {
                continue;
            }
            stats.pending = fields.get("pending").and_then(value_u64).unwrap_or(0);
            stats.lag = fields.get("lag").and_then(value_u64);
        }
        let mut xlen = redis::cmd("XLEN");
        xlen.arg(&stream);
        stats.length = value_u64(&self.query(&xlen).await?).unwrap_or(0);
        Ok(stats)
    }

    async fn ping(&self) -> Result<()> {
        self.query(&redis::cmd("PING")).await?;
        Ok(())
    }
}

/// TCP settings of every connection: no Nagle delay on small request/response
/// exchanges, and keepalive probes plus (on Linux) a user timeout so that a half-open
/// connection (peer gone without a FIN, e.g. a partition) is closed by the kernel and then
/// replaced, instead of timing out command after command or blocking a reader forever.
fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    let settings = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(Duration::from_secs(60));
    settings
}

/// A key that exists while Redis still holds everything the scheduler enqueued: a Redis
/// that comes back empty has lost it, and the stream alone cannot tell (workers re-create
/// missing streams and groups on their own).
fn marker_key(queue: &str) -> String {
    format!("agentq:marker:{queue}")
}

/// `XADD <stream> [NOMKSTREAM] * session_id <id> reason <reason>`, trimming nothing (see
/// the module docs).
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
