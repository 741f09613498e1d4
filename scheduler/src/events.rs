//! `GET /v1/sessions/{id}/events`: a session's events as server-sent events, replayed from
//! the session's stream `agentq:events:<id>` and then tailed live, resumable with
//! `Last-Event-ID`.
//!
//! Every event carries `id:` = its Redis stream entry id, `event:` = its `type`, and
//! `data:` = the event's JSON with `seq` (the history position it belongs to) added.
//!
//! Worker handovers. When the worker running a session dies mid-step, the next run (a
//! higher lease epoch) redoes the uncommitted step from the committed history length: the
//! stream then holds events of work that was thrown away. Those are *abandoned* and never
//! sent ([`abandoned`]): an event (seq `s`, epoch `e`) is abandoned when a later epoch's
//! first event has a seq ≤ `s`, and so is any event of an older epoch stored after a newer
//! epoch began (a paused "zombie" worker that woke up). A replay is therefore exactly the
//! stream an uninterrupted run would have produced.
//!
//! Live, an abandoned step may already have been sent when the next run begins. The
//! server then sends `event: reset` with `data: {"seq": s0}` (and no `id`): the client
//! must discard what it received for positions ≥ `s0`; the redone step follows. The same
//! happens on a reconnect whose `Last-Event-ID` lies after events that have since been
//! abandoned.
//!
//! Without a stream (expired 24 h after the session ended, or lost with Redis), the events
//! are rebuilt from the stored transcript, with ids `t-<seq>-<k>`, and the live tail
//! follows for a session still running. A stream trimmed by its cap (`MAXLEN ~ 20000`)
//! replays from its oldest retained event; `/messages` has the full history.
//!
//! The stream ends after `session_completed` once the session is terminal in the store
//! (or, for a terminal session whose worker never wrote that event, after a short grace
//! with one rebuilt from the row), and when the scheduler shuts down.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentq_agent::schema::{Message, Role};
use agentq_core::protocol::EventKind;
use agentq_core::queue::EventRecord;
use agentq_core::{SessionRow, Store};

use crate::Scheduler;
use crate::api::check_id;
use crate::error::ApiError;

/// Entries per `XREAD` while replaying.
const PAGE: usize = 1000;
/// Replay at most this many stored events (the stream's cap is ~20,000).
const MAX_REPLAY: usize = 40_000;
/// Entries per blocking `XREAD` while tailing.
const TAIL_COUNT: usize = 500;
/// How long one tail read blocks (then the session's row is checked).
const TAIL_BLOCK: Duration = Duration::from_secs(5);
/// Tail reads once the session is terminal: its last events may still be on their way.
const TERMINAL_BLOCK: Duration = Duration::from_millis(500);
/// How long a terminal session may go without its `session_completed` event before one
/// is rebuilt from the row (the worker died between the commit and the append, or the
/// session was dead-lettered).
const TERMINAL_GRACE: Duration = Duration::from_secs(2);
/// Consecutive failed tail reads before the stream is closed (the client reconnects).
const MAX_TAIL_ERRORS: u32 = 10;
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events buffered for a slow client before the reader waits for it.
const CHANNEL: usize = 256;

// ---------------------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------------------

/// A Redis stream entry id `<ms>-<n>`, ordered numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId(pub u64, pub u64);

impl StreamId {
    pub fn parse(s: &str) -> Option<StreamId> {
        let (ms, n) = s.split_once('-').unwrap_or((s, "0"));
        Some(StreamId(ms.parse().ok()?, n.parse().ok()?))
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Where a reconnecting client stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastId {
    /// An entry of the session's stream.
    Stream(StreamId),
    /// An event rebuilt from the transcript: `t-<seq>-<k>`.
    Transcript(u64, u64),
}

impl LastId {
    pub fn parse(s: &str) -> Option<LastId> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("t-") {
            let (seq, k) = rest.split_once('-')?;
            return Some(LastId::Transcript(seq.parse().ok()?, k.parse().ok()?));
        }
        StreamId::parse(s).map(LastId::Stream)
    }
}

// ---------------------------------------------------------------------------------------
// The abandoned-event filter
// ---------------------------------------------------------------------------------------

/// The position and run of one stored event, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKey {
    pub seq: u64,
    pub epoch: i64,
}

/// For events in stream order, whether each is abandoned (see the module docs): it is
/// from an older epoch than one already seen earlier in the stream (a zombie), or a later
/// epoch started at a position at or before its own (the step was redone).
pub fn abandoned(events: &[EventKey]) -> Vec<bool> {
    let mut out = vec![false; events.len()];
    // Zombies first; the starts of epochs are taken among the remaining events only, so
    // a zombie cannot make a live run's events look abandoned.
    let mut max_epoch = i64::MIN;
    let mut start: BTreeMap<i64, u64> = BTreeMap::new();
    for (i, e) in events.iter().enumerate() {
        if e.epoch < max_epoch {
            out[i] = true;
            continue;
        }
        max_epoch = e.epoch;
        start.entry(e.epoch).or_insert(e.seq);
    }
    // For each epoch, the lowest start among later epochs.
    let mut min_later: HashMap<i64, u64> = HashMap::with_capacity(start.len());
    let mut running = u64::MAX;
    for (epoch, s) in start.iter().rev() {
        min_later.insert(*epoch, running);
        running = running.min(*s);
    }
    for (i, e) in events.iter().enumerate() {
        if !out[i] && min_later.get(&e.epoch).is_some_and(|m| *m <= e.seq) {
            out[i] = true;
        }
    }
    out
}

/// What a reconnecting client must be told after catching up: the position to reset
/// from (if some events it received before `last` are abandoned now).
pub fn reset_after(events: &[(StreamId, EventKey)], last: StreamId) -> Option<u64> {
    let keys: Vec<EventKey> = events.iter().map(|(_, k)| *k).collect();
    let now = abandoned(&keys);
    let n_prefix = events.iter().take_while(|(id, _)| *id <= last).count();
    let then = abandoned(&keys[..n_prefix]);
    (0..n_prefix)
        .filter(|i| !then[*i] && now[*i])
        .map(|i| keys[i].seq)
        .min()
}

// ---------------------------------------------------------------------------------------
// Events as SSE
// ---------------------------------------------------------------------------------------

/// A parsed stored event, ready to send.
struct Out {
    id: Option<String>,
    /// `None` for a type this process does not know (a newer worker's): sent as a plain
    /// message rather than risk a malformed `event:` line.
    kind: Option<EventKind>,
    data: Value,
}

impl Out {
    fn from_record(r: &EventRecord) -> Option<Out> {
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

    fn is_completion(&self) -> bool {
        self.kind == Some(EventKind::SessionCompleted)
    }

    fn into_event(self) -> Event {
        let kind = self.kind.map_or("message", EventKind::as_str);
        let mut ev = Event::default().event(kind).data(self.data.to_string());
        if let Some(id) = self.id.filter(|i| !i.contains(['\n', '\r'])) {
            ev = ev.id(id);
        }
        ev
    }
}

fn reset_event(seq: u64) -> Event {
    Event::default()
        .event("reset")
        .data(json!({ "seq": seq }).to_string())
}

/// The `session_completed` event of a terminal row.
fn completion_from_row(row: &SessionRow, seq: u64) -> Value {
    json!({
        "type": EventKind::SessionCompleted,
        "finish_reason": row.finish_reason,
        "result": row.result,
        "error": row.error,
        "iterations": row.iteration,
        "usage": row.usage,
        "seq": seq,
    })
}

/// The events a run would have emitted for a stored history: per assistant message its
/// iteration, text, tool calls and completion; per tool message its result; then the
/// completion of a terminal session. Ids `t-<seq>-<k>`.
pub fn transcript_events(messages: &[Message], row: Option<&SessionRow>) -> Vec<(u64, u64, Value)> {
    let mut out = Vec::new();
    let mut iteration = 0u32;
    for (seq, m) in messages.iter().enumerate() {
        let seq = seq as u64;
        let mut evs: Vec<Value> = Vec::new();
        match m.role {
            Role::Assistant => {
                iteration += 1;
                evs.push(json!({"type": EventKind::IterationStarted, "iteration": iteration}));
                for t in m.thinking.iter().filter(|t| !t.text.is_empty()) {
                    evs.push(json!({"type": EventKind::ThinkingDelta, "text": t.text}));
                }
                if !m.content.is_empty() {
                    evs.push(json!({"type": EventKind::TextDelta, "text": m.content}));
                }
                for c in &m.tool_calls {
                    evs.push(json!({"type": EventKind::ToolCall, "id": c.id, "name": c.name, "arguments": c.arguments}));
                }
                evs.push(json!({
                    "type": EventKind::IterationCompleted,
                    "iteration": iteration,
                    "usage": m.usage.unwrap_or_default(),
                }));
            }
            Role::Tool => evs.push(json!({
                "type": EventKind::ToolResult,
                "id": m.tool_call_id,
                "name": m.name,
                "content": m.content,
                "is_error": m.is_error,
            })),
            _ => {}
        }
        for (k, mut v) in evs.into_iter().enumerate() {
            if let Some(o) = v.as_object_mut() {
                o.insert("seq".into(), json!(seq));
            }
            out.push((seq, k as u64, v));
        }
    }
    if let Some(row) = row.filter(|r| r.status.is_terminal()) {
        let seq = messages.len() as u64;
        out.push((seq, 0, completion_from_row(row, seq)));
    }
    out
}

// ---------------------------------------------------------------------------------------
// The handler
// ---------------------------------------------------------------------------------------

pub(crate) async fn events(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let id = check_id(id)?;
    let last = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(LastId::parse).ok_or_else(|| {
            ApiError::invalid(
                "Last-Event-ID",
                "is not an event id of this API (`<ms>-<n>` or `t-<seq>-<k>`)",
            )
        })?),
    };
    if s.store.get(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("session {id} not found")));
    }
    let (tx, rx) = mpsc::channel(CHANNEL);
    let follower = Follower {
        store: s.store.clone(),
        queue: s.queue.clone(),
        session_id: id,
        tx,
        stop: s.draining.clone(),
    };
    tokio::spawn(follower.run(last));
    Ok(Sse::new(receiver_stream(rx))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

fn receiver_stream(mut rx: mpsc::Receiver<Event>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)))
}

/// One client's stream: replay, then tail. Ends when the client goes away (the channel
/// closes), the session is over, or the scheduler shuts down.
struct Follower {
    store: std::sync::Arc<dyn Store>,
    queue: std::sync::Arc<dyn agentq_core::Queue>,
    session_id: String,
    tx: mpsc::Sender<Event>,
    stop: CancellationToken,
}

/// Where the tail starts and what the client holds.
struct TailState {
    /// The last stream entry read.
    after: String,
    /// The newest epoch seen: events of older ones are zombies.
    max_epoch: i64,
    /// The highest position the client holds an event for.
    held_max_seq: Option<u64>,
    /// Events below this position are covered by a transcript replay.
    min_seq: u64,
    /// A visible `session_completed` was sent or is held by the client.
    completed: bool,
}

/// The client went away or the scheduler is stopping.
struct Gone;

impl Follower {
    async fn send(&self, ev: Event) -> Result<(), Gone> {
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

    /// Every stored event, in stream order (capped).
    async fn read_all(&self) -> agentq_core::Result<Vec<EventRecord>> {
        let mut all: Vec<EventRecord> = Vec::new();
        let mut after = "0-0".to_string();
        loop {
            let page = self
                .queue
                .read_events(&self.session_id, &after, PAGE, None)
                .await?;
            let Some(last) = page.last() else { break };
            after = last.id.clone();
            let short = page.len() < PAGE;
            all.extend(page);
            if short || all.len() >= MAX_REPLAY {
                break;
            }
        }
        Ok(all)
    }

    async fn is_terminal(&self) -> Option<SessionRow> {
        match self.store.get(&self.session_id).await {
            Ok(Some(row)) if row.status.is_terminal() => Some(row),
            _ => None,
        }
    }

    /// Send what the client is missing; `None` when the stream is complete already.
    async fn replay(&self, last: Option<LastId>) -> Result<Option<TailState>, Gone> {
        let records = match self.read_all().await {
            Ok(r) => r,
            Err(e) => {
                // Nothing sent: the client retries, with the same Last-Event-ID.
                tracing::warn!(session_id = %self.session_id, error = %e, "cannot read the event stream");
                return Ok(None);
            }
        };
        if records.is_empty() {
            return self.replay_transcript(last).await;
        }
        let ids: Vec<StreamId> = records
            .iter()
            .map(|r| StreamId::parse(&r.id).unwrap_or(StreamId(0, 0)))
            .collect();
        let keys: Vec<EventKey> = records
            .iter()
            .map(|r| EventKey {
                seq: r.seq,
                epoch: r.epoch,
            })
            .collect();
        let dropped = abandoned(&keys);
        let from = match last {
            None => None,
            Some(LastId::Stream(l)) => {
                let pairs: Vec<(StreamId, EventKey)> =
                    ids.iter().copied().zip(keys.iter().copied()).collect();
                if let Some(seq) = reset_after(&pairs, l) {
                    self.send(reset_event(seq)).await?;
                }
                Some(l)
            }
            // The client followed a rebuilt transcript and the stream exists now: start
            // it over.
            Some(LastId::Transcript(..)) => {
                self.send(reset_event(0)).await?;
                None
            }
        };
        let mut state = TailState {
            after: records.last().map(|r| r.id.clone()).unwrap_or_default(),
            max_epoch: keys.iter().map(|k| k.epoch).max().unwrap_or(i64::MIN),
            held_max_seq: None,
            min_seq: 0,
            completed: false,
        };
        for (i, r) in records.iter().enumerate() {
            if dropped[i] {
                continue;
            }
            let Some(out) = Out::from_record(r) else {
                continue;
            };
            state.held_max_seq = state.held_max_seq.max(Some(r.seq));
            state.completed |= out.is_completion();
            if from.is_none_or(|l| ids[i] > l) {
                self.send(out.into_event()).await?;
            }
        }
        if state.completed && self.is_terminal().await.is_some() {
            return Ok(None);
        }
        Ok(Some(state))
    }

    /// No stream: rebuild the events from the stored history.
    async fn replay_transcript(&self, last: Option<LastId>) -> Result<Option<TailState>, Gone> {
        let (messages, row) = match tokio::try_join!(
            self.store.messages(&self.session_id),
            self.store.get(&self.session_id)
        ) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(session_id = %self.session_id, error = %e, "cannot read the transcript");
                return Ok(None);
            }
        };
        let rebuilt = transcript_events(&messages, row.as_ref());
        let after = match last {
            Some(LastId::Transcript(seq, k)) => Some((seq, k)),
            // Stream ids the client holds cannot be matched to rebuilt events: start over.
            Some(LastId::Stream(_)) => {
                self.send(reset_event(0)).await?;
                None
            }
            None => None,
        };
        let mut completed = false;
        for (seq, k, data) in rebuilt {
            let out = Out {
                id: Some(format!("t-{seq}-{k}")),
                kind: data["type"].as_str().and_then(EventKind::parse),
                data,
            };
            completed |= out.is_completion();
            if after.is_none_or(|a| (seq, k) > a) {
                self.send(out.into_event()).await?;
            }
        }
        if completed {
            return Ok(None);
        }
        let len = messages.len() as u64;
        Ok(Some(TailState {
            after: "0-0".into(),
            max_epoch: i64::MIN,
            held_max_seq: len.checked_sub(1),
            min_seq: len,
            completed: false,
        }))
    }

    async fn tail(&self, mut st: TailState) -> Result<(), Gone> {
        let mut errors = 0u32;
        let mut terminal_since: Option<Instant> = None;
        loop {
            let block = if terminal_since.is_some() {
                TERMINAL_BLOCK
            } else {
                TAIL_BLOCK
            };
            let asked = Instant::now();
            let read = tokio::select! {
                r = self.queue.read_events(&self.session_id, &st.after, TAIL_COUNT, Some(block)) => r,
                _ = self.tx.closed() => return Err(Gone),
                _ = self.stop.cancelled() => return Err(Gone),
            };
            let page = match read {
                Ok(p) => {
                    errors = 0;
                    p
                }
                Err(e) => {
                    errors += 1;
                    tracing::debug!(session_id = %self.session_id, error = %e, "tail read failed");
                    if errors >= MAX_TAIL_ERRORS {
                        return Ok(());
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        _ = self.tx.closed() => return Err(Gone),
                        _ = self.stop.cancelled() => return Err(Gone),
                    }
                    continue;
                }
            };
            let got_any = !page.is_empty();
            if !got_any && asked.elapsed() < block / 2 {
                // A backend without blocking reads (or without event streams) answers at
                // once: wait out the block here rather than spin on the store.
                tokio::select! {
                    _ = tokio::time::sleep(block.saturating_sub(asked.elapsed())) => {}
                    _ = self.tx.closed() => return Err(Gone),
                    _ = self.stop.cancelled() => return Err(Gone),
                }
            }
            for r in &page {
                st.after = r.id.clone();
                if r.seq < st.min_seq || r.epoch < st.max_epoch {
                    continue;
                }
                if r.epoch > st.max_epoch {
                    // A new run redoes the step at `r.seq`: whatever the client holds from
                    // there on was thrown away.
                    if st.held_max_seq.is_some_and(|h| h >= r.seq) {
                        self.send(reset_event(r.seq)).await?;
                        st.held_max_seq = r.seq.checked_sub(1);
                    }
                    st.max_epoch = r.epoch;
                }
                let Some(out) = Out::from_record(r) else {
                    continue;
                };
                st.held_max_seq = st.held_max_seq.max(Some(r.seq));
                st.completed |= out.is_completion();
                self.send(out.into_event()).await?;
            }
            if st.completed {
                if self.is_terminal().await.is_some() {
                    return Ok(());
                }
                continue;
            }
            if got_any {
                terminal_since = None;
                continue;
            }
            if let Some(row) = self.is_terminal().await {
                let since = *terminal_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= TERMINAL_GRACE {
                    let seq = st.held_max_seq.map_or(0, |s| s + 1).max(st.min_seq);
                    let data = completion_from_row(&row, seq);
                    self.send(
                        Event::default()
                            .event(EventKind::SessionCompleted.as_str())
                            .data(data.to_string()),
                    )
                    .await?;
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn keys(v: &[(u64, i64)]) -> Vec<EventKey> {
        v.iter()
            .map(|(seq, epoch)| EventKey {
                seq: *seq,
                epoch: *epoch,
            })
            .collect()
    }

    #[test]
    fn one_run_keeps_everything() {
        let k = keys(&[(1, 1), (1, 1), (2, 1), (3, 1), (3, 1)]);
        assert_eq!(abandoned(&k), vec![false; 5]);
    }

    #[test]
    fn a_redone_step_abandons_the_old_runs_events_from_its_start() {
        // Run 1 committed positions 1 and 2, was streaming 3 when it died; run 2 redoes 3.
        let k = keys(&[(1, 1), (2, 1), (3, 1), (3, 1), (3, 2), (3, 2), (4, 2)]);
        assert_eq!(
            abandoned(&k),
            vec![false, false, true, true, false, false, false]
        );
    }

    #[test]
    fn a_resume_after_a_commit_abandons_nothing() {
        // Run 1's tool calls at 1 are committed; run 2 starts with the results at 2.
        let k = keys(&[(1, 1), (1, 1), (2, 2), (3, 2)]);
        assert_eq!(abandoned(&k), vec![false; 4]);
    }

    #[test]
    fn several_handovers() {
        // Epoch 1 dies at 2; epoch 2 dies at 4 (its 2..3 committed); epoch 3 redoes 4.
        let k = keys(&[(1, 1), (2, 1), (2, 2), (3, 2), (4, 2), (4, 3), (5, 3)]);
        assert_eq!(
            abandoned(&k),
            vec![false, true, false, false, true, false, false]
        );
        // An epoch that starts lower than an earlier one abandons from there, even for
        // events of epochs in between.
        let k = keys(&[(1, 1), (5, 1), (3, 2), (6, 2), (2, 3)]);
        assert_eq!(abandoned(&k), vec![false, true, true, true, false]);
    }

    #[test]
    fn a_zombie_is_dropped_and_does_not_abandon_others() {
        // Epoch 1 was paused mid-step at 3; epoch 2 took over and redid 3; then epoch 1
        // woke up and appended more (at 3 and even at a fresh-looking 9).
        let k = keys(&[(3, 1), (3, 2), (4, 2), (3, 1), (9, 1), (5, 2)]);
        assert_eq!(abandoned(&k), vec![true, false, false, true, true, false]);
        // A zombie at a low position does not count as an epoch start.
        let k = keys(&[(5, 2), (6, 2), (1, 1)]);
        assert_eq!(abandoned(&k), vec![false, false, true]);
    }

    #[test]
    fn reconnecting_after_abandoned_events_resets() {
        let id = |n: u64| StreamId(n, 0);
        let ev = |n: u64, seq: u64, epoch: i64| (id(n), EventKey { seq, epoch });
        // The client saw up to entry 4 (run 1 streaming position 3); run 2 redid 3.
        let events = vec![
            ev(1, 1, 1),
            ev(2, 2, 1),
            ev(3, 3, 1),
            ev(4, 3, 1),
            ev(5, 3, 2),
            ev(6, 4, 2),
        ];
        assert_eq!(reset_after(&events, id(4)), Some(3));
        // It saw only committed work: no reset.
        assert_eq!(reset_after(&events, id(2)), None);
        // It saw the new run already.
        assert_eq!(reset_after(&events, id(5)), None);
    }

    #[test]
    fn ids_parse() {
        assert_eq!(StreamId::parse("17-3"), Some(StreamId(17, 3)));
        assert_eq!(StreamId::parse("17"), Some(StreamId(17, 0)));
        assert!(StreamId::parse("x-1").is_none());
        assert!(StreamId(2, 0) > StreamId(1, 99));
        assert_eq!(LastId::parse("t-4-2"), Some(LastId::Transcript(4, 2)));
        assert_eq!(
            LastId::parse(" 1700000000000-5 "),
            Some(LastId::Stream(StreamId(1_700_000_000_000, 5)))
        );
        assert!(LastId::parse("t-4").is_none());
        assert!(LastId::parse("").is_none());
    }

    #[test]
    fn transcript_rebuilds_the_live_events() {
        let mut a = Message::assistant("Fetching.");
        a.tool_calls.push(agentq_agent::schema::ToolCall {
            id: "c1".into(),
            name: "http_fetch".into(),
            arguments: json!({"url": "u"}),
        });
        let msgs = vec![
            Message::user("do it"),
            a,
            Message::tool_result("c1", "http_fetch", "ok", false),
            Message::assistant("Done."),
        ];
        let evs = transcript_events(&msgs, None);
        let kinds: Vec<(u64, u64, &str)> = evs
            .iter()
            .map(|(s, k, v)| (*s, *k, v["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (1, 0, "iteration_started"),
                (1, 1, "text_delta"),
                (1, 2, "tool_call"),
                (1, 3, "iteration_completed"),
                (2, 0, "tool_result"),
                (3, 0, "iteration_started"),
                (3, 1, "text_delta"),
                (3, 2, "iteration_completed"),
            ]
        );
        assert_eq!(evs[4].2["seq"], json!(2));
    }
}
