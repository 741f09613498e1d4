//! One client's relay: the [`Follower`] that replays what is stored (`replay`), then
//! tails the stream live (`tail`), sending each event it may see as SSE.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::Event;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentq_api::events::{self, ResetEvent};
use agentq_core::protocol::EventKind;
use agentq_core::queue::EventRecord;
use agentq_core::{Queue, SessionRow, Store};

use super::caps::StreamPermit;
use super::hub::Hub;
use super::ids::LastId;

/// Events buffered for a slow client before the reader waits for it.
const CHANNEL: usize = 256;

/// Relay a session's events to one client from `last` on: replay, then tail. The stream
/// ends when the client goes away, the session is over, or `stop` is cancelled.
pub(crate) fn follow(
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    hub: Hub,
    session_id: String,
    last: Option<LastId>,
    stop: CancellationToken,
    permit: StreamPermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let (tx, rx) = mpsc::channel(CHANNEL);
    let follower = Follower {
        store,
        queue,
        hub,
        session_id,
        tx,
        stop,
        _permit: permit,
    };
    tokio::spawn(follower.run(last));
    receiver_stream(rx)
}

fn receiver_stream(mut rx: mpsc::Receiver<Event>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)))
}

/// One client's stream: replay, then tail. Ends when the client goes away (the channel
/// closes), the session is over, or the scheduler shuts down.
pub(super) struct Follower {
    pub(super) store: Arc<dyn Store>,
    pub(super) queue: Arc<dyn Queue>,
    pub(super) hub: Hub,
    pub(super) session_id: String,
    pub(super) tx: mpsc::Sender<Event>,
    pub(super) stop: CancellationToken,
    /// Held while the stream is open (the caps count it).
    pub(super) _permit: StreamPermit,
}

/// Where the tail starts and what the client holds.
pub(super) struct TailState {
    /// The last stream entry read.
    pub(super) after: String,
    /// The newest epoch seen: events of older ones are zombies.
    pub(super) max_epoch: i64,
    /// The highest position the client holds an event for.
    pub(super) held_max_seq: Option<u64>,
    /// Events below this position are covered by a transcript replay.
    pub(super) min_seq: u64,
    /// A visible `session_completed` was sent or is held by the client.
    pub(super) completed: bool,
    /// The calls whose `approval_requested` the client holds. A call held after a
    /// transcript replay read the history announces itself at the position of the step
    /// that made it, below `min_seq`: it is passed on once, as it is news to the client.
    pub(super) announced: Vec<String>,
}

impl TailState {
    /// Whether `out`, an event below `min_seq`, is an approval request the client has
    /// not seen (recorded as seen from now on).
    pub(super) fn late_approval(&mut self, out: &Out) -> bool {
        let Some(id) = out.approval_id() else {
            return false;
        };
        if self.announced.iter().any(|a| a == id) {
            return false;
        }
        self.announced.push(id.to_string());
        true
    }
}

/// The client went away or the scheduler is stopping.
pub(super) struct Gone;

impl Follower {
    pub(super) async fn send(&self, ev: Event) -> Result<(), Gone> {
        tokio::select! {
            r = self.tx.send(ev) => r.map_err(|_| Gone),
            _ = self.stop.cancelled() => Err(Gone),
        }
    }

    async fn run(self, last: Option<LastId>) {
        let tail = match self.replay(last).await {
            Ok(Some(t)) => t,
            Ok(None) | Err(Gone) => return,
        };
        let _ = self.tail(tail).await;
    }

    pub(super) async fn is_terminal(&self) -> Option<SessionRow> {
        match self.store.get(&self.session_id).await {
            Ok(Some(row)) if row.status.is_terminal() => Some(row),
            _ => None,
        }
    }
}

/// A parsed stored event, ready to send.
pub(super) struct Out {
    pub(super) id: Option<String>,
    /// `None` for a type this process does not know (a newer worker's): sent as a plain
    /// message rather than risk a malformed `event:` line.
    pub(super) kind: Option<EventKind>,
    pub(super) data: Value,
}

impl Out {
    pub(super) fn from_record(r: &EventRecord) -> Option<Out> {
        let mut data: Value = serde_json::from_str(&r.data).ok()?;
        let obj = data.as_object_mut()?;
        let kind = EventKind::parse(obj.get("type")?.as_str()?);
        obj.insert("seq".into(), json!(r.seq));
        Some(Out {
            id: Some(r.id.clone()),
            kind,
            data,
        })
    }

    /// The call an `approval_requested` event holds for approval.
    pub(super) fn approval_id(&self) -> Option<&str> {
        if self.kind != Some(EventKind::ApprovalRequested) {
            return None;
        }
        self.data.get("id").and_then(Value::as_str)
    }

    pub(super) fn is_completion(&self) -> bool {
        self.kind == Some(EventKind::SessionCompleted)
    }

    pub(super) fn into_event(self) -> Event {
        let kind = self.kind.map_or("message", EventKind::as_str);
        let mut ev = Event::default().event(kind).data(self.data.to_string());
        if let Some(id) = self.id.filter(|i| !i.contains(['\n', '\r'])) {
            ev = ev.id(id);
        }
        ev
    }
}

/// `event: reset` from position `seq` (no `id`: it is not an event of the stream).
pub(super) fn reset_event(seq: u64) -> Event {
    // A number only: encoding cannot fail.
    let data = serde_json::to_string(&ResetEvent { seq }).unwrap_or_default();
    Event::default().event(events::RESET).data(data)
}
