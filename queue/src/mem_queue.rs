//! [`MemQueue`]: the [`crate::queue::Queue`] in process, for the embedded mode (with
//! `agentq_core::sqlite::SqliteStore`). It models what agentq uses of Redis Streams, with the
//! same observable behaviour as [`crate::redis_queue::RedisQueue`]:
//! - per queue, a log of entries with ids `<ms>-<seq>` (increasing) and one consumer
//!   group: a cursor (the last entry delivered), and the pending entries (delivered, not
//!   acked) each with its consumer, its delivery time (the idle clock) and its delivery
//!   count;
//! - `read` hands out entries past the cursor, blocking up to `block` (woken by
//!   [`tokio::sync::Notify`] on every enqueue); `read_own_pending` re-reads the pending
//!   entries of a consumer; `touch` resets their idle time (as `XCLAIM … JUSTID` does, it
//!   takes the entry for the caller and leaves the delivery count alone); `reclaim` takes
//!   entries idle at least `min_idle` (counting a delivery, as `XAUTOCLAIM` does);
//! - the dead-letter list ([`MemQueue::dead_letters`]) and the completion list
//!   ([`MemQueue::completions`]), capped like the Redis streams;
//! - completions broadcast to everyone ([`MemQueue::subscribe_all_completions`], the
//!   `agentq:done` channel) and to the subscribers of one session; cancels broadcast to
//!   every [`Signals::subscribe_signals`] stream;
//! - per-session event streams (`agentq:events:<id>`): capped at [`EVENTS_MAXLEN`],
//!   blocking reads after an id, newest-first reads, and expiry after a TTL (expired
//!   streams are dropped lazily, at most once a second).
//!
//! Everything lives in memory and is lost with the process: on start, the embedded mode
//! re-enqueues from the store every session that is queued or running
//! (`agentq_core::sqlite::requeue_runnable`). Like pub/sub, a subscriber only receives what
//! is published while it is subscribed; a subscriber that falls more than
//! [`BROADCAST_CAPACITY`] messages behind skips the oldest ones (logged).
//!
//! The state sits behind one `std::sync::Mutex`, never held across an `.await`: every
//! operation is a short critical section, and a `read` hands out its entries and returns
//! them without an `.await` in between, so a read dropped mid-flight never loses entries.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

use crate::queue::{
    Delivery, EventRecord, EventStreams, QueueHealth, QueueStats, Signals, WorkQueue,
};
use agentq_error::{Error, Result};
use agentq_types::model::{Completion, EnqueueReason};
use agentq_types::protocol::WorkerSignal;

/// Approximate cap on a queue's log: acked history beyond it is dropped (oldest first);
/// undelivered and pending entries are always kept.
pub const QUEUE_MAXLEN: usize = 100_000;
/// Cap on the dead-letter and completion lists (oldest dropped first).
pub const HISTORY_MAXLEN: usize = 100_000;
/// Messages a broadcast subscriber may fall behind before it skips some.
pub const BROADCAST_CAPACITY: usize = 4096;
/// Cap on one session's event stream (oldest dropped first), as on Redis.
pub const EVENTS_MAXLEN: usize = 20_000;
/// How often expired event streams are looked for.
const EVENT_SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Per-session completion channels: a session's completion is published once (or a few
/// times when republished), so a small buffer is plenty.
const PER_SESSION_CAPACITY: usize = 16;

/// An entry id, `<ms>-<seq>`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
struct EntryId {
    ms: u64,
    seq: u64,
}

impl EntryId {
    /// `<ms>-<seq>`, or `<ms>` alone (as `<ms>-0`, so `0` means "from the start").
    fn parse(s: &str) -> Option<Self> {
        match s.split_once('-') {
            Some((ms, seq)) => Some(EntryId {
                ms: ms.parse().ok()?,
                seq: seq.parse().ok()?,
            }),
            None => Some(EntryId {
                ms: s.parse().ok()?,
                seq: 0,
            }),
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    session_id: String,
    reason: EnqueueReason,
}

/// A delivered, unacked entry.
#[derive(Debug, Clone)]
struct Pending {
    consumer: String,
    /// Start of the idle clock: last delivery, claim or touch.
    delivered_at: Instant,
    deliveries: u32,
}

/// One queue: its log and its consumer group.
#[derive(Debug, Default)]
struct Stream {
    entries: BTreeMap<EntryId, Entry>,
    /// The group's cursor: the last entry delivered by `read`.
    last_delivered: EntryId,
    pending: BTreeMap<EntryId, Pending>,
}

impl Stream {
    fn delivery(&self, queue: &str, id: EntryId) -> Option<Delivery> {
        self.entries.get(&id).map(|e| Delivery {
            queue: queue.to_string(),
            entry_id: id.to_string(),
            session_id: e.session_id.clone(),
            reason: e.reason,
        })
    }

    /// Entries not yet delivered to the group.
    fn lag(&self) -> u64 {
        use std::ops::Bound::{Excluded, Unbounded};
        let n = self
            .entries
            .range((Excluded(self.last_delivered), Unbounded))
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// Drop the oldest acked entries beyond `max_len`, stopping at the first entry that is
    /// pending or undelivered (as `XTRIM MINID` at the oldest of those does on Redis).
    /// Returns how many were dropped.
    fn trim(&mut self, max_len: usize) -> u64 {
        let mut dropped = 0;
        while self.entries.len() > max_len {
            let Some((&oldest, _)) = self.entries.first_key_value() else {
                break;
            };
            if oldest > self.last_delivered || self.pending.contains_key(&oldest) {
                break;
            }
            self.entries.remove(&oldest);
            dropped += 1;
        }
        dropped
    }
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<String, Stream>,
    /// The last id handed out (ids increase across all queues).
    last_id: EntryId,
    dead: VecDeque<(Delivery, String)>,
    completions: VecDeque<Completion>,
    /// Per-session completion channels, kept while someone listens.
    done_by_id: HashMap<String, broadcast::Sender<Completion>>,
    /// Prune `done_by_id` of channels nobody listens to when it grows past this.
    done_prune_at: usize,
    /// Per-session event streams.
    events: HashMap<String, EventLog>,
    /// When expired event streams are next looked for.
    next_event_sweep: Option<Instant>,
}

/// One session's event stream.
#[derive(Debug, Default)]
struct EventLog {
    entries: VecDeque<(EntryId, EventRecord)>,
    /// Set by `expire_events`; the stream is gone from then on.
    expires_at: Option<Instant>,
}

impl EventLog {
    fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

impl State {
    /// The live event stream of a session, dropping it first if it expired.
    fn events_of(&mut self, session_id: &str, now: Instant) -> Option<&EventLog> {
        if self.events.get(session_id).is_some_and(|l| l.expired(now)) {
            self.events.remove(session_id);
        }
        self.events.get(session_id)
    }

    /// Drop every expired event stream, at most once per [`EVENT_SWEEP_EVERY`].
    fn sweep_events(&mut self, now: Instant) {
        if self.next_event_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.events.retain(|_, l| !l.expired(now));
        self.next_event_sweep = Some(now + EVENT_SWEEP_EVERY);
    }

    fn next_id(&mut self) -> EntryId {
        let now = u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap_or(0);
        self.last_id = if now > self.last_id.ms {
            EntryId { ms: now, seq: 0 }
        } else {
            EntryId {
                ms: self.last_id.ms,
                seq: self.last_id.seq + 1,
            }
        };
        self.last_id
    }
}

/// The in-process [`crate::queue::Queue`]; see the module docs. Share it behind an `Arc`.
pub struct MemQueue {
    state: Mutex<State>,
    /// Woken on every enqueue; blocked reads wait on it.
    arrivals: Notify,
    /// Woken on every event append; blocked event reads wait on it.
    event_arrivals: Notify,
    done_all: broadcast::Sender<Completion>,
    cancels: broadcast::Sender<WorkerSignal>,
}

impl std::fmt::Debug for MemQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("MemQueue")
            .field("queues", &state.queues.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for MemQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl MemQueue {
    pub fn new() -> Self {
        MemQueue {
            state: Mutex::new(State {
                done_prune_at: 1024,
                ..State::default()
            }),
            arrivals: Notify::new(),
            event_arrivals: Notify::new(),
            done_all: broadcast::channel(BROADCAST_CAPACITY).0,
            cancels: broadcast::channel(BROADCAST_CAPACITY).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section leaves the state half-updated on a panic worth refusing.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Dead-lettered entries with their reasons, oldest first.
    pub fn dead_letters(&self) -> Vec<(Delivery, String)> {
        self.lock().dead.iter().cloned().collect()
    }

    /// Every completion published (the `agentq:completions` stream), oldest first.
    pub fn completions(&self) -> Vec<Completion> {
        self.lock().completions.iter().cloned().collect()
    }

    /// Every completion from now on (the `agentq:done` channel).
    pub fn subscribe_all_completions(&self) -> BoxStream<'static, Completion> {
        broadcast_stream(self.done_all.subscribe(), "completions")
    }

    /// Up to `count` events of a session after `after` (exclusive).
    fn events_after(&self, session_id: &str, after: EntryId, count: usize) -> Vec<EventRecord> {
        let mut state = self.lock();
        let Some(log) = state.events_of(session_id, Instant::now()) else {
            return Vec::new();
        };
        // Ids increase along the deque: binary search for the first one past `after`.
        let start = log.entries.partition_point(|(id, _)| *id <= after);
        log.entries
            .range(start..)
            .take(count.max(1))
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Take up to `count` new entries per queue for `consumer`, or none.
    fn take_new(&self, queues: &[String], consumer: &str, count: usize) -> Vec<Delivery> {
        let mut state = self.lock();
        let now = Instant::now();
        let mut out = Vec::new();
        for q in queues {
            // Reading a queue that does not exist creates it (as the Redis queue heals a
            // missing group), so a later enqueue is seen.
            let stream = state.queues.entry(q.clone()).or_default();
            use std::ops::Bound::{Excluded, Unbounded};
            let ids: Vec<EntryId> = stream
                .entries
                .range((Excluded(stream.last_delivered), Unbounded))
                .take(count.max(1))
                .map(|(id, _)| *id)
                .collect();
            for id in ids {
                stream.last_delivered = id;
                stream.pending.insert(
                    id,
                    Pending {
                        consumer: consumer.to_string(),
                        delivered_at: now,
                        deliveries: 1,
                    },
                );
                if let Some(d) = stream.delivery(q, id) {
                    out.push(d);
                }
            }
        }
        out
    }
}

/// A broadcast receiver as a stream that ends when the sender is gone; a receiver that
/// fell behind skips what it missed.
fn broadcast_stream<T: Clone + Send + 'static>(
    rx: broadcast::Receiver<T>,
    what: &'static str,
) -> BoxStream<'static, T> {
    futures::stream::unfold(rx, move |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(v) => return Some((v, rx)),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(what, skipped = n, "in-process subscriber fell behind");
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

#[async_trait]
impl WorkQueue for MemQueue {
    async fn ensure_queue(&self, queue: &str) -> Result<()> {
        self.lock().queues.entry(queue.to_string()).or_default();
        Ok(())
    }

    async fn enqueue(&self, queue: &str, session_id: &str, reason: EnqueueReason) -> Result<()> {
        self.enqueue_many(queue, &[(session_id.to_string(), reason)])
            .await
    }

    async fn enqueue_many(&self, queue: &str, items: &[(String, EnqueueReason)]) -> Result<()> {
        if items.is_empty() {
            return Ok(());
        }
        {
            let mut state = self.lock();
            let ids: Vec<EntryId> = items.iter().map(|_| state.next_id()).collect();
            let stream = state.queues.entry(queue.to_string()).or_default();
            for (id, (session_id, reason)) in ids.into_iter().zip(items) {
                stream.entries.insert(
                    id,
                    Entry {
                        session_id: session_id.clone(),
                        reason: *reason,
                    },
                );
            }
            stream.trim(QUEUE_MAXLEN);
        }
        self.arrivals.notify_waiters();
        Ok(())
    }

    async fn read(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        let deadline = Instant::now() + block;
        loop {
            // Register for the wake-up before looking, so an enqueue between the look
            // and the wait is not missed.
            let arrived = self.arrivals.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let got = self.take_new(queues, consumer, count);
            if !got.is_empty() {
                return Ok(got);
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn read_own_pending(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
    ) -> Result<Vec<Delivery>> {
        let state = self.lock();
        let mut out = Vec::new();
        for q in queues {
            let Some(stream) = state.queues.get(q) else {
                continue;
            };
            out.extend(
                stream
                    .pending
                    .iter()
                    .filter(|(_, p)| p.consumer == consumer)
                    .filter_map(|(id, _)| stream.delivery(q, *id))
                    .take(count.max(1)),
            );
        }
        Ok(out)
    }

    async fn touch(&self, queue: &str, consumer: &str, entry_ids: &[String]) -> Result<()> {
        let mut state = self.lock();
        let Some(stream) = state.queues.get_mut(queue) else {
            return Ok(());
        };
        let now = Instant::now();
        for id in entry_ids.iter().filter_map(|s| EntryId::parse(s)) {
            if let Some(p) = stream.pending.get_mut(&id) {
                // As `XCLAIM <min-idle 0> JUSTID`: ours now, idle from now, count unchanged.
                p.consumer = consumer.to_string();
                p.delivered_at = now;
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
        let mut state = self.lock();
        let Some(stream) = state.queues.get_mut(queue) else {
            return Ok(Vec::new());
        };
        let now = Instant::now();
        let idle: Vec<EntryId> = stream
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.delivered_at) >= min_idle)
            .map(|(id, _)| *id)
            .take(count)
            .collect();
        let mut out = Vec::with_capacity(idle.len());
        for id in idle {
            if let Some(p) = stream.pending.get_mut(&id) {
                p.consumer = consumer.to_string();
                p.delivered_at = now;
                p.deliveries = p.deliveries.saturating_add(1);
            }
            if let Some(d) = stream.delivery(queue, id) {
                out.push(d);
            }
        }
        Ok(out)
    }

    async fn ack(&self, queue: &str, entry_ids: &[String]) -> Result<()> {
        let mut state = self.lock();
        if let Some(stream) = state.queues.get_mut(queue) {
            for id in entry_ids.iter().filter_map(|s| EntryId::parse(s)) {
                stream.pending.remove(&id);
            }
            stream.trim(QUEUE_MAXLEN);
        }
        Ok(())
    }

    async fn trim(&self, queue: &str, max_len: u64) -> Result<u64> {
        let max_len = usize::try_from(max_len).unwrap_or(usize::MAX);
        Ok(match self.lock().queues.get_mut(queue) {
            Some(stream) if stream.entries.len() > max_len => stream.trim(0),
            _ => 0,
        })
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<()> {
        let mut state = self.lock();
        state.dead.push_back((delivery.clone(), reason.to_string()));
        while state.dead.len() > HISTORY_MAXLEN {
            state.dead.pop_front();
        }
        if let Some(stream) = state.queues.get_mut(&delivery.queue)
            && let Some(id) = EntryId::parse(&delivery.entry_id)
        {
            stream.pending.remove(&id);
        }
        Ok(())
    }
}

#[async_trait]
impl Signals for MemQueue {
    async fn publish_completion(&self, completion: &Completion) -> Result<()> {
        let mut state = self.lock();
        state.completions.push_back(completion.clone());
        while state.completions.len() > HISTORY_MAXLEN {
            state.completions.pop_front();
        }
        if let Some(tx) = state.done_by_id.get(&completion.session_id) {
            // An error only means nobody listens any more.
            if tx.send(completion.clone()).is_err() {
                state.done_by_id.remove(&completion.session_id);
            }
        }
        let _ = self.done_all.send(completion.clone());
        Ok(())
    }

    async fn publish_signal(&self, signal: &WorkerSignal) -> Result<()> {
        // No receiver is not an error: no worker runs, nobody to tell.
        let _ = self.cancels.send(signal.clone());
        Ok(())
    }

    async fn subscribe_signals(&self) -> Result<BoxStream<'static, WorkerSignal>> {
        Ok(broadcast_stream(self.cancels.subscribe(), "cancels"))
    }

    async fn subscribe_completion(
        &self,
        session_id: &str,
    ) -> Result<BoxStream<'static, Completion>> {
        let mut state = self.lock();
        // Channels of abandoned subscriptions (their session never finished) are
        // dropped here, with a threshold that doubles so pruning stays amortised O(1).
        if state.done_by_id.len() >= state.done_prune_at {
            state.done_by_id.retain(|_, tx| tx.receiver_count() > 0);
            state.done_prune_at = (state.done_by_id.len() * 2).max(1024);
        }
        let rx = match state.done_by_id.get(session_id) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = broadcast::channel(PER_SESSION_CAPACITY);
                state.done_by_id.insert(session_id.to_string(), tx);
                rx
            }
        };
        Ok(broadcast_stream(rx, "completion"))
    }
}

#[async_trait]
impl EventStreams for MemQueue {
    async fn append_events(&self, events: &[EventRecord]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        {
            let mut state = self.lock();
            let now = Instant::now();
            state.sweep_events(now);
            for e in events {
                let id = state.next_id();
                // An expired stream is gone: appending starts a new one without a TTL.
                if state.events_of(&e.session_id, now).is_none() {
                    state
                        .events
                        .insert(e.session_id.clone(), EventLog::default());
                }
                if let Some(log) = state.events.get_mut(&e.session_id) {
                    let mut stored = e.clone();
                    stored.id = id.to_string();
                    log.entries.push_back((id, stored));
                    while log.entries.len() > EVENTS_MAXLEN {
                        log.entries.pop_front();
                    }
                }
            }
        }
        self.event_arrivals.notify_waiters();
        Ok(())
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let after = if after == "$" {
            // Only what arrives from now on.
            let mut state = self.lock();
            state
                .events_of(session_id, Instant::now())
                .and_then(|l| l.entries.back().map(|(id, _)| *id))
                .unwrap_or(state.last_id)
        } else {
            EntryId::parse(after).ok_or_else(|| {
                Error::invalid("after", format!("{after:?} is not a stream entry id"))
            })?
        };
        let deadline = block.filter(|b| !b.is_zero()).map(|b| Instant::now() + b);
        loop {
            let arrived = self.event_arrivals.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let got = self.events_after(session_id, after, count);
            let Some(deadline) = deadline else {
                return Ok(got);
            };
            if !got.is_empty() || Instant::now() >= deadline {
                return Ok(got);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn read_events_many(
        &self,
        from: &[(String, String)],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let mut cursors = Vec::with_capacity(from.len());
        for (session_id, after) in from {
            let id = EntryId::parse(after).ok_or_else(|| {
                Error::invalid("after", format!("{after:?} is not a stream entry id"))
            })?;
            cursors.push((session_id.as_str(), id));
        }
        let deadline = block.filter(|b| !b.is_zero()).map(|b| Instant::now() + b);
        loop {
            let arrived = self.event_arrivals.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let got: Vec<EventRecord> = cursors
                .iter()
                .flat_map(|(session_id, after)| self.events_after(session_id, *after, count))
                .collect();
            let Some(deadline) = deadline else {
                return Ok(got);
            };
            if !got.is_empty() || Instant::now() >= deadline {
                return Ok(got);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }

    async fn last_events(&self, session_id: &str, count: usize) -> Result<Vec<EventRecord>> {
        let mut state = self.lock();
        let Some(log) = state.events_of(session_id, Instant::now()) else {
            return Ok(Vec::new());
        };
        Ok(log
            .entries
            .iter()
            .rev()
            .take(count.max(1))
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn expire_events(&self, session_id: &str, ttl: Duration) -> Result<()> {
        let mut state = self.lock();
        let now = Instant::now();
        state.sweep_events(now);
        // As PEXPIRE: a stream that is gone (or expired) stays gone.
        if state.events_of(session_id, now).is_some()
            && let Some(log) = state.events.get_mut(session_id)
        {
            log.expires_at = Some(now + ttl);
        }
        Ok(())
    }
}

#[async_trait]
impl QueueHealth for MemQueue {
    /// Never: the entries live exactly as long as this queue, in the process that uses
    /// them, and an embedded process re-adds every runnable session from its store when it
    /// starts (`agentq_core::sqlite::requeue_runnable`), before anything reads the queue.
    async fn check_lost(&self, _queue: &str) -> Result<bool> {
        Ok(false)
    }

    /// Nothing to remember: [`QueueHealth::check_lost`] cannot become true for a queue
    /// in process.
    async fn mark_queue(&self, _queue: &str) -> Result<()> {
        Ok(())
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let state = self.lock();
        let Some(stream) = state.queues.get(queue) else {
            return Ok(QueueStats::default());
        };
        Ok(QueueStats {
            length: u64::try_from(stream.entries.len()).unwrap_or(u64::MAX),
            pending: u64::try_from(stream.pending.len()).unwrap_or(u64::MAX),
            lag: Some(stream.lag()),
        })
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}
