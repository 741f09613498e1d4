//! The `Queue`: work to do and news. Implemented on Redis Streams
//! ([`crate::redis_queue::RedisQueue`]) and, for the embedded mode, in process.
//! Entries carry only a session id and a reason; the store's lease decides who runs what,
//! so duplicate entries are harmless.
//!
//! The operations are split by what they carry: [`WorkQueue`] (entries for workers),
//! [`Signals`] (completions and cancel requests), [`EventStreams`] (each session's live
//! events) and [`QueueHealth`] (readiness, metrics, lost-data detection). [`Queue`] is
//! all of them.

use std::time::Duration;

use async_trait::async_trait;

use agentq_error::Result;
use agentq_types::model::{Completion, EnqueueReason};
use agentq_types::protocol::WorkerSignal;

/// Consumer group every worker reads with.
pub const GROUP: &str = "agentq-workers";
/// Stream of dead-lettered entries.
pub const DEAD_STREAM: &str = "agentq:dead";
/// Stream of completions, for consumers that were not listening.
pub const COMPLETIONS_STREAM: &str = "agentq:completions";
/// Pub/sub channel of all completions (`agentq:done:<id>` per session).
pub const DONE_CHANNEL: &str = "agentq:done";
/// Pub/sub channel on which cancel requests are broadcast to workers.
pub const CANCEL_CHANNEL: &str = "agentq:cancel";

pub fn queue_stream(queue: &str) -> String {
    format!("agentq:queue:{queue}")
}

/// The per-session event stream: every event the loop emits, in order, so that a client
/// can follow a session live and replay what it missed.
pub fn events_stream(session_id: &str) -> String {
    // Built once per event appended: joined, not formatted.
    ["agentq:events:", session_id].concat()
}

/// One event of a session's stream. `seq` is the history position the event belongs to
/// and `epoch` the lease epoch of the run that emitted it: a reader drops events of an
/// older epoch at or after the position where a newer run started (work that was never
/// committed and was redone), which makes a replay equal an uninterrupted stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub session_id: String,
    /// The stream entry id; empty until stored.
    pub id: String,
    pub seq: u64,
    pub epoch: i64,
    /// The event as JSON.
    pub data: String,
}

pub fn done_channel(session_id: &str) -> String {
    format!("{DONE_CHANNEL}:{session_id}")
}

/// One entry handed to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub queue: String,
    /// The stream entry id, for ack and claim.
    pub entry_id: String,
    pub session_id: String,
    pub reason: EnqueueReason,
}

/// The whole queue: every narrow trait below. Implemented for every type that implements
/// them all, so `Arc<dyn Queue>` is what the processes hold and a backend only implements
/// the parts.
pub trait Queue: WorkQueue + Signals + EventStreams + QueueHealth {}

impl<T: WorkQueue + Signals + EventStreams + QueueHealth> Queue for T {}

/// Work to do: queue entries, handed to one consumer of the group at a time until acked.
#[async_trait]
pub trait WorkQueue: Send + Sync {
    /// Create the stream and consumer group if missing (idempotent).
    async fn ensure_queue(&self, queue: &str) -> Result<()>;

    async fn enqueue(&self, queue: &str, session_id: &str, reason: EnqueueReason) -> Result<()>;

    /// Many entries in one round trip.
    async fn enqueue_many(&self, queue: &str, items: &[(String, EnqueueReason)]) -> Result<()>;

    /// New entries for `consumer` on any of `queues`, blocking up to `block`. Must use a
    /// connection of its own (a blocking read stalls a shared one).
    async fn read(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>>;

    /// Entries delivered to `consumer` earlier and not acked (after a restart or a read
    /// dropped mid-flight).
    async fn read_own_pending(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
    ) -> Result<Vec<Delivery>>;

    /// Reset the idle time of entries `consumer` is working on, so the reclaimer leaves
    /// them alone.
    async fn touch(&self, queue: &str, consumer: &str, entry_ids: &[String]) -> Result<()>;

    /// Take entries idle longer than `min_idle` (their worker is presumably dead).
    async fn reclaim(
        &self,
        queue: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<Delivery>>;

    async fn ack(&self, queue: &str, entry_ids: &[String]) -> Result<()>;

    /// When the queue holds more than `max_len` entries, drop its acked history: the
    /// entries before the oldest one that is still pending (delivered and not acked,
    /// however long its session runs) or not yet delivered. Trimming never drops those, so
    /// it can strand no session. Returns how many entries were dropped.
    async fn trim(&self, queue: &str, max_len: u64) -> Result<u64>;

    /// Move an entry to the dead-letter stream with the reason, and ack it.
    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<()>;
}

/// News between processes: completions and cancel requests, fire-and-forget.
#[async_trait]
pub trait Signals: Send + Sync {
    /// Publish on `agentq:done:<id>` and `agentq:done`, append to `agentq:completions`.
    async fn publish_completion(&self, completion: &Completion) -> Result<()>;

    /// Broadcast a signal (cancel, wake, interrupt) to the workers; the one running the
    /// session acts on it.
    async fn publish_signal(&self, signal: &WorkerSignal) -> Result<()>;

    /// Receive the signals published from now on, until the stream ends.
    async fn subscribe_signals(&self) -> Result<futures::stream::BoxStream<'static, WorkerSignal>>;

    /// Receive the completion of one session (subscribe before submitting).
    async fn subscribe_completion(
        &self,
        session_id: &str,
    ) -> Result<futures::stream::BoxStream<'static, Completion>>;
}

/// Each session's event stream, for following it live (the stored history is the record).
#[async_trait]
pub trait EventStreams: Send + Sync {
    /// Append events to their sessions' streams (capped), in order, in one round trip.
    async fn append_events(&self, events: &[EventRecord]) -> Result<()>;

    /// Events of a session stored after entry `after` (`0` for all, `$` for only those
    /// appended from now on), up to `count`, waiting up to `block` for new ones when there
    /// are none.
    async fn read_events(
        &self,
        session_id: &str,
        after: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>>;

    /// Events of many sessions in one read: for each `(session id, after)` of `from`, the
    /// events stored after `after` (as [`EventStreams::read_events`]; `$` is not
    /// accepted), up to `count` per session, in stream order per session; waiting up to
    /// `block` when none of them has any. One round trip however many sessions are
    /// named, so one connection follows them all (the scheduler's event relay).
    async fn read_events_many(
        &self,
        from: &[(String, String)],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>>;

    /// The newest `count` events of a session, newest first.
    async fn last_events(&self, session_id: &str, count: usize) -> Result<Vec<EventRecord>>;

    /// Let a finished session's event stream expire after `ttl`.
    async fn expire_events(&self, session_id: &str, ttl: Duration) -> Result<()>;
}

/// The queue's own state, for readiness, metrics and the sweeper.
#[async_trait]
pub trait QueueHealth: Send + Sync {
    /// Whether the queue's backing data was lost since [`QueueHealth::mark_queue`] (a
    /// Redis restarted without persistence): its entries are gone and must be re-added
    /// from the store.
    async fn check_lost(&self, queue: &str) -> Result<bool>;

    /// Remember that the queue's entries are all accounted for (see `check_lost`).
    async fn mark_queue(&self, queue: &str) -> Result<()>;

    /// Length, pending count and lag of a queue's stream, for readiness and metrics.
    async fn stats(&self, queue: &str) -> Result<QueueStats>;

    async fn ping(&self) -> Result<()>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Entries in the stream, acknowledged history included (`XLEN`).
    pub length: u64,
    pub pending: u64,
    pub lag: Option<u64>,
}

impl QueueStats {
    /// What waits for a worker: entries not delivered to the group yet (the lag) and
    /// those delivered and not acknowledged (pending). The stream keeps acknowledged
    /// entries as history, so its length says how much ever came, not how much waits;
    /// only when the lag is unknown (entries deleted mid-stream) is it the bound left.
    pub fn waiting(&self) -> u64 {
        match self.lag {
            Some(lag) => lag.saturating_add(self.pending),
            None => self.length,
        }
    }
}
