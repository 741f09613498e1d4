//! The fan-out of live events: a few readers per scheduler, each following many
//! sessions' streams with one blocking read (`read_events_many`, one `XREAD` over all of
//! its subscribers' keys), instead of a connection per client.
//!
//! Subscribers are spread over [`READERS`] shards by session id; each shard has one
//! reader task, started with its first subscriber and gone once it has none. A reader
//! reads every session of its shard from the lowest position any of its subscribers
//! holds, and hands each subscriber what lies past its own position over a bounded
//! channel. When the subscriber set changes while the reader is blocked, the reader is
//! woken by an entry appended to a stream of its own (a process-unique key that it
//! follows along with the sessions'), so a new subscriber is read at once.
//!
//! A subscriber that does not take its events (its client is slower than the session)
//! is never waited for: once its channel is full it is dropped from the shard, its
//! channel closes, and the relay catches up from where it stopped with reads of its own
//! through the shared command connection, at its own pace, then subscribes again. A
//! failed read lets every subscriber of the shard go the same way.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentq_core::Queue;
use agentq_core::queue::EventRecord;

use super::ids::StreamId;

/// Reader tasks (so blocking connections to Redis) per scheduler at most.
pub const READERS: usize = 2;
/// Entries per session per read.
const COUNT: usize = 500;
/// How long one read blocks; a new subscriber wakes it earlier.
const BLOCK: Duration = Duration::from_secs(5);
/// Pages buffered per subscriber before it counts as lagging and is dropped.
const SUBSCRIBER_PAGES: usize = 64;
/// Pause after a failed read (Redis away).
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(500);
/// The wake-up stream of a reader expires this long after its last wake-up, so a
/// scheduler that went away leaves nothing behind.
const WAKE_TTL: Duration = Duration::from_secs(3600);

/// The shards: cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct Hub {
    shards: Arc<Vec<Arc<Shard>>>,
}

impl Default for Hub {
    fn default() -> Self {
        let instance = uuid::Uuid::new_v4();
        Hub {
            shards: Arc::new(
                (0..READERS)
                    .map(|i| {
                        Arc::new(Shard {
                            wake_id: format!("scheduler-wake-{instance}-{i}"),
                            state: Mutex::new(ShardState::default()),
                        })
                    })
                    .collect(),
            ),
        }
    }
}

struct Shard {
    /// The session id of this reader's wake-up stream.
    wake_id: String,
    state: Mutex<ShardState>,
}

#[derive(Default)]
struct ShardState {
    subs: HashMap<u64, Sub>,
    next_id: u64,
    /// A reader task is running.
    running: bool,
    /// The reader is in a read that did not include every current subscriber.
    reading: bool,
    /// A wake-up was already appended for the current read.
    woken: bool,
}

struct Sub {
    session_id: String,
    after: StreamId,
    tx: mpsc::Sender<Vec<EventRecord>>,
}

/// One subscriber's live events; leaving (drop) takes it out of its shard.
pub(crate) struct Subscription {
    shard: Arc<Shard>,
    id: u64,
    rx: mpsc::Receiver<Vec<EventRecord>>,
}

impl Subscription {
    /// The next page of events; `None` when the hub let this subscriber go (it lagged
    /// or the scheduler is stopping): catch up from the last event taken.
    pub(crate) async fn next(&mut self) -> Option<Vec<EventRecord>> {
        self.rx.recv().await
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shard.lock().subs.remove(&self.id);
    }
}

impl Shard {
    fn lock(&self) -> std::sync::MutexGuard<'_, ShardState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Hub {
    fn shard(&self, session_id: &str) -> Arc<Shard> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        session_id.hash(&mut h);
        let n = self.shards.len().max(1);
        let i = usize::try_from(h.finish() % n as u64).unwrap_or(0);
        self.shards[i].clone()
    }

    /// Follow `session_id` from entry `after` on (the caller has everything up to it).
    /// Starts the shard's reader if it is not running; it stops on `stop`.
    pub(crate) async fn subscribe(
        &self,
        queue: &Arc<dyn Queue>,
        session_id: &str,
        after: StreamId,
        stop: &CancellationToken,
    ) -> Subscription {
        let shard = self.shard(session_id);
        let (tx, rx) = mpsc::channel(SUBSCRIBER_PAGES);
        let (id, start, wake) = {
            let mut st = shard.lock();
            let id = st.next_id;
            st.next_id = st.next_id.wrapping_add(1);
            st.subs.insert(
                id,
                Sub {
                    session_id: session_id.to_string(),
                    after,
                    tx,
                },
            );
            let start = !st.running;
            st.running = true;
            let wake = st.reading && !st.woken;
            st.woken |= wake;
            (id, start, wake)
        };
        if start {
            tokio::spawn(read_loop(shard.clone(), queue.clone(), stop.clone()));
        } else if wake {
            wake_reader(queue.as_ref(), &shard.wake_id).await;
        }
        Subscription { shard, id, rx }
    }
}

/// Append to the reader's wake-up stream: its blocked read returns. A failure only
/// delays the new subscriber to the end of the current read.
async fn wake_reader(queue: &dyn Queue, wake_id: &str) {
    let entry = EventRecord {
        session_id: wake_id.to_string(),
        id: String::new(),
        seq: 0,
        epoch: 0,
        data: "{}".into(),
    };
    let woken = async {
        queue.append_events(std::slice::from_ref(&entry)).await?;
        queue.expire_events(wake_id, WAKE_TTL).await
    };
    if let Err(e) = woken.await {
        tracing::debug!(error = %e, "cannot wake the event reader");
    }
}

/// One shard's reader: read every subscribed session past the lowest position held,
/// hand out, repeat; ends when the shard has no subscribers or on `stop`.
async fn read_loop(shard: Arc<Shard>, queue: Arc<dyn Queue>, stop: CancellationToken) {
    let mut wake_after = StreamId(0, 0);
    loop {
        let Some(cursors) = shard.lock().start_read(stop.is_cancelled()) else {
            return;
        };
        let mut from: Vec<(String, String)> = cursors
            .iter()
            .map(|(s, a)| (s.clone(), a.to_string()))
            .collect();
        from.push((shard.wake_id.clone(), wake_after.to_string()));
        let read = tokio::select! {
            r = queue.read_events_many(&from, COUNT, Some(BLOCK)) => r,
            _ = stop.cancelled() => continue,
        };
        let records = match read {
            Ok(r) => r,
            Err(e) => {
                // The subscribers go back to reads of their own, which count failures
                // and close a stream after too many (its client reconnects and is
                // replayed), as without the fan-out.
                tracing::debug!(error = %e, "event reader: read failed");
                {
                    let mut st = shard.lock();
                    st.reading = false;
                    st.subs.clear();
                }
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_AFTER_ERROR) => {}
                    _ = stop.cancelled() => {}
                }
                continue;
            }
        };
        let by_session = by_session(&records, &shard.wake_id, &mut wake_after);
        shard.lock().hand_out(&cursors, &by_session);
    }
}

/// A read's records by session, each with its parsed position; the reader's own wake-up
/// entries only move `wake_after`.
fn by_session<'a>(
    records: &'a [EventRecord],
    wake_id: &str,
    wake_after: &mut StreamId,
) -> HashMap<&'a str, Vec<(StreamId, &'a EventRecord)>> {
    let mut by_session: HashMap<&str, Vec<(StreamId, &EventRecord)>> = HashMap::new();
    for r in records {
        let Some(id) = StreamId::parse(&r.id) else {
            continue;
        };
        if r.session_id == wake_id {
            *wake_after = (*wake_after).max(id);
            continue;
        }
        by_session
            .entry(r.session_id.as_str())
            .or_default()
            .push((id, r));
    }
    by_session
}

impl ShardState {
    /// The position to read each subscribed session from (the lowest any subscriber
    /// holds), marking the shard as reading; `None` when the reader is to end (no
    /// subscribers left, or `stopping`).
    fn start_read(&mut self, stopping: bool) -> Option<HashMap<String, StreamId>> {
        if self.subs.is_empty() || stopping {
            self.running = false;
            self.reading = false;
            // Subscribers left behind by a stop see their channel close.
            self.subs.clear();
            return None;
        }
        self.reading = true;
        self.woken = false;
        let mut lowest: HashMap<&str, StreamId> = HashMap::new();
        for sub in self.subs.values() {
            let e = lowest.entry(sub.session_id.as_str()).or_insert(sub.after);
            *e = (*e).min(sub.after);
        }
        Some(
            lowest
                .into_iter()
                .map(|(s, a)| (s.to_string(), a))
                .collect(),
        )
    }

    /// Hand each subscriber what a read (from `cursors`) found past its own position,
    /// dropping the ones whose channel is full (lagging) or closed.
    fn hand_out(
        &mut self,
        cursors: &HashMap<String, StreamId>,
        by_session: &HashMap<&str, Vec<(StreamId, &EventRecord)>>,
    ) {
        self.reading = false;
        self.subs.retain(|_, sub| {
            // A subscriber that joined during the read, after a position the read started
            // past, is read from its own position next time.
            let read_from = cursors.get(&sub.session_id);
            if read_from.is_none_or(|c| *c > sub.after) {
                return !sub.tx.is_closed();
            }
            let Some(page) = by_session.get(sub.session_id.as_str()) else {
                return !sub.tx.is_closed();
            };
            let fresh: Vec<EventRecord> = page
                .iter()
                .filter(|(id, _)| *id > sub.after)
                .map(|(_, r)| (*r).clone())
                .collect();
            let Some(last) = page.iter().map(|(id, _)| *id).max() else {
                return true;
            };
            if fresh.is_empty() {
                return true;
            }
            match sub.tx.try_send(fresh) {
                Ok(()) => {
                    sub.after = sub.after.max(last);
                    true
                }
                // Full: lagging, let it catch up by itself; closed: gone.
                Err(_) => false,
            }
        });
    }
}
