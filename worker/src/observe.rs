//! The worker's side of observability: a per-session `Observer` that feeds the Prometheus
//! metrics, and the event writer that appends every loop event to the session's stream
//! in batches.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use agentq_agent::event::{AgentEvent, EventSink};
use agentq_agent::observe::{LlmCallInfo, Observer};
use agentq_core::metrics::Metrics;
use agentq_core::protocol::EventKind;
use agentq_core::queue::EventRecord;
use agentq_core::{Queue, WaitReason};

mod coalesce;

/// Metrics of one session run. Labels: queue, provider, model (a configured one, else
/// `other`), tool — never the session.
pub struct SessionObserver {
    pub metrics: &'static Metrics,
    pub queue: String,
    /// The previous run died during an LLM call (or before committing its response): the
    /// next successful call re-issues it.
    pub reissue_pending: AtomicBool,
}

impl Observer for SessionObserver {
    fn llm_call(&self, info: &LlmCallInfo<'_>) {
        let m = self.metrics;
        let model = m.model_label(info.model);
        m.llm_requests
            .with_label_values(&[info.provider, model, info.outcome])
            .inc();
        m.llm_request_duration
            .with_label_values(&[info.provider, model])
            .observe(info.duration.as_secs_f64());
        if let Some(t) = info.time_to_first_token {
            m.llm_ttft
                .with_label_values(&[info.provider, model])
                .observe(t.as_secs_f64());
        }
        if let Some(u) = &info.usage {
            for (kind, n) in [
                ("input", u.input_tokens),
                ("output", u.output_tokens),
                ("cache_read", u.cache_read_tokens),
                ("cache_write", u.cache_write_tokens),
                ("reasoning", u.reasoning_tokens),
            ] {
                if n > 0 {
                    m.llm_tokens
                        .with_label_values(&[info.provider, model, kind])
                        .inc_by(n);
                }
            }
            if u.web_search_requests > 0 {
                m.llm_web_searches
                    .with_label_values(&[info.provider, model])
                    .inc_by(u.web_search_requests);
            }
            if self.reissue_pending.swap(false, Ordering::SeqCst) {
                m.llm_reissued.inc();
                m.llm_reissued_tokens
                    .inc_by(u.input_tokens.saturating_add(u.output_tokens));
            }
        }
    }

    fn llm_rate_limited(&self, provider: &str, model: &str) {
        let m = self.metrics;
        m.llm_rate_limited
            .with_label_values(&[provider, m.model_label(model)])
            .inc();
    }

    fn admission_wait(&self, provider: &str, model: &str, waited: Duration) {
        let m = self.metrics;
        m.admission_wait
            .with_label_values(&[provider, m.model_label(model)])
            .observe(waited.as_secs_f64());
    }

    fn admission_late(&self, provider: &str, model: &str) {
        let m = self.metrics;
        m.admission_late
            .with_label_values(&[provider, m.model_label(model)])
            .inc();
    }

    fn llm_retry(&self, provider: &str, reason: &str) {
        self.metrics
            .llm_retries
            .with_label_values(&[provider, reason])
            .inc();
    }

    fn tool_call(&self, tool: &str, outcome: &str, duration: Duration) {
        let tool = self.metrics.tool_label(tool);
        self.metrics
            .tool_calls
            .with_label_values(&[tool, outcome])
            .inc();
        if outcome != "denied" {
            self.metrics
                .tool_duration
                .with_label_values(&[tool])
                .observe(duration.as_secs_f64());
        }
    }

    fn iteration(&self, provider: &str, model: &str) {
        self.metrics
            .iterations
            .with_label_values(&[&self.queue, provider, self.metrics.model_label(model)])
            .inc();
    }

    fn iteration_overhead(&self, overhead: Duration) {
        self.metrics
            .iteration_overhead
            .observe(overhead.as_secs_f64());
        overhead_tap().record(overhead);
    }
}

/// Exact per-iteration overhead samples for `agentq bench` (the histogram only has
/// buckets). Process-wide like the metrics registry; off unless enabled, so a production
/// worker pays one atomic load per iteration.
pub struct OverheadTap {
    enabled: AtomicBool,
    samples: std::sync::Mutex<Vec<Duration>>,
}

impl OverheadTap {
    /// Start (or restart) collecting, dropping what was collected.
    pub fn start(&self) {
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.enabled.store(true, Ordering::SeqCst);
    }

    /// Stop collecting and return the samples.
    pub fn stop(&self) -> Vec<Duration> {
        self.enabled.store(false, Ordering::SeqCst);
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn record(&self, d: Duration) {
        if self.enabled.load(Ordering::Relaxed) {
            self.samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(d);
        }
    }
}

/// The process's overhead tap.
pub fn overhead_tap() -> &'static OverheadTap {
    static TAP: std::sync::OnceLock<OverheadTap> = std::sync::OnceLock::new();
    TAP.get_or_init(|| OverheadTap {
        enabled: AtomicBool::new(false),
        samples: std::sync::Mutex::new(Vec::new()),
    })
}

/// Event records a worker holds for its event writer at most. Text and thinking deltas
/// are refused once a quarter of this room is left; every other event may use it all.
/// Sized for a few seconds of deltas from every session of a busy worker: the writer
/// appends batches of up to 512 records, so the buffer only fills when Redis is slow or
/// down.
pub const EVENT_BUFFER: usize = 16_384;

/// The sessions' side of the event channel. [`EventSink::emit`] must not block the agent
/// loop, so a full channel never waits: when the writer is behind, what does not fit is
/// dropped and counted (`agentq_events_dropped_total{kind}` and
/// [`crate::Worker::events_dropped`]). Deltas go first, while room is kept for the events
/// a follower needs to make sense of a session (tool calls and results, iteration and
/// completion events); those are dropped only when the channel is completely full.
/// Nothing is lost for the session itself: its transcript is in the store, and the
/// event stream is for following it live.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::Sender<Outgoing>,
    metrics: &'static Metrics,
    dropped: Arc<AtomicU64>,
}

/// What the sessions hand the event writer, in the order they hand it.
pub enum Outgoing {
    Event(EventRecord),
    /// A finished session's stream is to expire, once every event of it handed over
    /// before is appended.
    Expire(String),
}

/// How long a finished session waits for room in a full channel to hand over its
/// stream's expiry, before it sets the expiry itself.
const EXPIRE_WAIT: Duration = Duration::from_secs(1);

/// A bounded event channel of `capacity` records (at least 4).
pub fn event_channel(
    capacity: usize,
    metrics: &'static Metrics,
) -> (EventSender, mpsc::Receiver<Outgoing>) {
    let (tx, rx) = mpsc::channel(capacity.max(4));
    (
        EventSender {
            tx,
            metrics,
            dropped: Arc::new(AtomicU64::new(0)),
        },
        rx,
    )
}

impl EventSender {
    /// Hand `record` (an event of `kind`) to the writer without waiting; whether it went.
    pub fn send(&self, record: EventRecord, kind: EventKind) -> bool {
        let delta = matches!(kind, EventKind::TextDelta | EventKind::ThinkingDelta);
        if delta && self.tx.capacity() <= self.tx.max_capacity() / 4 {
            self.drop_one(kind);
            return false;
        }
        match self.tx.try_send(Outgoing::Event(record)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.drop_one(kind);
                false
            }
            // The writer has stopped: the worker is shutting down.
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Have the writer let `session_id`'s stream expire after the events of it handed
    /// over before (waiting up to [`EXPIRE_WAIT`] for room); whether it went. A stream
    /// does not expire unless it exists when its expiry is set, and an event still in the
    /// channel makes it only when appended.
    pub async fn expire(&self, session_id: &str) -> bool {
        self.tx
            .send_timeout(Outgoing::Expire(session_id.to_string()), EXPIRE_WAIT)
            .await
            .is_ok()
    }

    /// Events dropped so far because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn drop_one(&self, kind: EventKind) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .events_dropped
            .with_label_values(&[kind.as_str()])
            .inc();
    }
}

/// The `EventSink` of one run: stamps events with the session and the run's lease epoch
/// and hands them to the worker's writer.
pub struct StreamSink {
    pub session_id: String,
    pub epoch: i64,
    pub tx: EventSender,
}

impl StreamSink {
    /// The session gave its slot up to wait without a lease (`session_waiting`): the
    /// reason stays the store's type up to here, where the event names it on the wire.
    pub fn waiting(
        &self,
        seq: usize,
        reason: WaitReason,
        wake_at: Option<chrono::DateTime<chrono::Utc>>,
    ) {
        self.emit(
            seq,
            AgentEvent::SessionWaiting {
                reason: reason.as_str().into(),
                wake_at,
            },
        );
    }
}

impl EventSink for StreamSink {
    fn emit(&self, seq: usize, event: AgentEvent) {
        let kind = EventKind::of(&event);
        let Ok(data) = serde_json::to_string(&event) else {
            return;
        };
        self.tx.send(
            EventRecord {
                session_id: self.session_id.clone(),
                id: String::new(),
                seq: seq as u64,
                epoch: self.epoch,
                data,
            },
            kind,
        );
    }
}

/// One task per worker drains the event channel and appends in batches: text deltas
/// arrive by the hundred per second per session, one round trip each would dominate, and
/// a batch's run of one session's deltas is one entry ([`coalesce::coalesce_deltas`]).
/// Events are for following sessions live; losing some while Redis is down is accepted
/// (the store holds the transcript). The finished sessions' expiries handed over with
/// the events are set after the batch they came in (`ttl` each).
pub async fn event_writer(
    queue: Arc<dyn Queue>,
    mut rx: mpsc::Receiver<Outgoing>,
    stop: CancellationToken,
    ttl: Duration,
) {
    let mut out = Batch::default();
    loop {
        let first = tokio::select! {
            e = rx.recv() => e,
            _ = stop.cancelled() => None,
        };
        let Some(first) = first else {
            // Flush whatever is left, then stop.
            while let Ok(o) = rx.try_recv() {
                out.take(o);
            }
            out.flush(queue.as_ref(), ttl).await;
            return;
        };
        out.take(first);
        while out.len() < 512 {
            match rx.try_recv() {
                Ok(o) => out.take(o),
                Err(_) => break,
            }
        }
        out.flush(queue.as_ref(), ttl).await;
    }
}

/// What the writer took from the channel for one round trip.
#[derive(Default)]
struct Batch {
    events: Vec<EventRecord>,
    /// Sessions whose streams are to expire once `events` are appended.
    expiring: Vec<String>,
}

impl Batch {
    fn take(&mut self, o: Outgoing) {
        match o {
            Outgoing::Event(e) => self.events.push(e),
            Outgoing::Expire(id) => self.expiring.push(id),
        }
    }

    fn len(&self) -> usize {
        self.events.len().saturating_add(self.expiring.len())
    }

    /// Append the events, then set the expiries: after the appends, because an append
    /// makes a stream that does not exist yet, without an expiry, and one made after its
    /// expiry was set would never expire.
    async fn flush(&mut self, queue: &dyn Queue, ttl: Duration) {
        if !self.events.is_empty() {
            coalesce::coalesce_deltas(&mut self.events);
            if let Err(e) = queue.append_events(&self.events).await {
                debug!(error = %e, dropped = self.events.len(), "appending events failed");
            }
            self.events.clear();
        }
        // At once: a multiplexed connection sends them in one write.
        let set = join_all(self.expiring.iter().map(|id| queue.expire_events(id, ttl))).await;
        for (id, result) in self.expiring.iter().zip(set) {
            if let Err(e) = result {
                warn!(session_id = %id, error = %e, "setting the event stream's expiry failed");
            }
        }
        self.expiring.clear();
    }
}

/// Whether the run that held the session before died during an LLM call, or before the
/// response it got was committed (held while its read-only calls ran): its newest events
/// (at the first uncommitted position) show a call started and not committed.
pub async fn died_mid_llm_call(
    queue: &dyn Queue,
    session_id: &str,
    committed: usize,
    epoch: i64,
) -> bool {
    let Ok(events) = queue.last_events(session_id, 32).await else {
        return false;
    };
    let Some(prev_epoch) = events.iter().map(|e| e.epoch).filter(|e| *e < epoch).max() else {
        return false;
    };
    events
        .iter()
        .filter(|e| e.epoch == prev_epoch && e.seq == committed as u64)
        .any(|e| EventKind::of_json(&e.data).is_some_and(EventKind::marks_llm_call))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn sink(capacity: usize) -> (StreamSink, mpsc::Receiver<Outgoing>, &'static Metrics) {
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        let (tx, rx) = event_channel(capacity, metrics);
        let sink = StreamSink {
            session_id: "s".into(),
            epoch: 1,
            tx,
        };
        (sink, rx, metrics)
    }

    fn event(o: Outgoing) -> EventRecord {
        match o {
            Outgoing::Event(e) => e,
            Outgoing::Expire(id) => panic!("an expiry of {id} where an event was"),
        }
    }

    fn delta() -> AgentEvent {
        AgentEvent::TextDelta { text: "x".into() }
    }

    fn call() -> AgentEvent {
        AgentEvent::ToolCall {
            id: "c".into(),
            name: "read_file".into(),
            arguments: serde_json::json!({}).into(),
        }
    }

    /// With the writer stalled, `emit` never waits: deltas stop at three quarters of the
    /// buffer, other events fill the rest, and what does not fit is counted by kind.
    #[test]
    fn a_full_channel_drops_deltas_first_and_never_blocks() {
        let (sink, mut rx, metrics) = sink(8);
        for i in 0..20 {
            sink.emit(i, delta());
        }
        // 8 slots, a quarter (2) kept for events that are not deltas.
        assert_eq!(sink.tx.dropped(), 14);
        for i in 0..5 {
            sink.emit(20 + i, call());
        }
        assert_eq!(sink.tx.dropped(), 17, "2 tool calls fit, 3 did not");
        let dropped = |kind: &str| metrics.events_dropped.with_label_values(&[kind]).get();
        assert_eq!(dropped("text_delta"), 14);
        assert_eq!(dropped("tool_call"), 3);

        let mut got = Vec::new();
        while let Ok(o) = rx.try_recv() {
            got.push(EventKind::of_json(&event(o).data).unwrap());
        }
        assert_eq!(got.len(), 8);
        assert_eq!(got.iter().filter(|k| **k == EventKind::ToolCall).count(), 2);

        // Drained, deltas flow again.
        sink.emit(30, delta());
        assert_eq!(event(rx.try_recv().unwrap()).seq, 30);
        assert_eq!(sink.tx.dropped(), 17);

        // A stopped writer is a shutdown, not a drop.
        drop(rx);
        sink.emit(31, call());
        assert_eq!(sink.tx.dropped(), 17);
    }

    /// A finished session's expiry goes through the writer behind the session's events,
    /// so a stream the writer makes late expires too. Set at once instead (as the run's
    /// settling did), it found no stream while the events waited in the channel, and the
    /// stream their append made then never expired.
    #[tokio::test(start_paused = true)]
    async fn a_streams_expiry_is_set_after_the_events_before_it() {
        use agentq_core::EventStreams;

        let queue = Arc::new(agentq_core::mem_queue::MemQueue::new());
        let ttl = Duration::from_secs(60);
        let (sink, rx, _) = sink(16);
        sink.emit(1, call());
        assert!(sink.tx.expire("s").await);
        // Set at once, before its events are appended: lost.
        let late = StreamSink {
            session_id: "t".into(),
            epoch: 1,
            tx: sink.tx.clone(),
        };
        late.emit(1, call());
        queue.expire_events("t", ttl).await.unwrap();

        let stop = CancellationToken::new();
        stop.cancel();
        event_writer(queue.clone(), rx, stop, ttl).await;
        assert_eq!(queue.last_events("s", 10).await.unwrap().len(), 1);
        assert_eq!(queue.last_events("t", 10).await.unwrap().len(), 1);

        tokio::time::advance(ttl + Duration::from_secs(1)).await;
        assert!(
            queue.last_events("s", 10).await.unwrap().is_empty(),
            "expired"
        );
        assert_eq!(
            queue.last_events("t", 10).await.unwrap().len(),
            1,
            "an expiry set before the stream existed never applies"
        );
    }
}
