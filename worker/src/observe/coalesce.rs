//! Coalescing a batch of events before it is written: text and thinking deltas are only
//! pieces of one text, so a run of them from one session, at one position of one run,
//! goes out as one event holding the pieces joined. A provider streams a delta per token;
//! under load the writer's batches hold many of each session's, and each was a stream
//! entry of its own. A reader sees the same text, in fewer pieces.

use std::collections::HashMap;

use agentq_agent::event::AgentEvent;
use agentq_core::protocol::EventKind;
use agentq_core::queue::EventRecord;

/// Join, in place, every delta with the session's previous event of the batch when that
/// one is a delta of the same kind at the same position (`seq`) of the same run (`epoch`).
/// The order of each session's events is kept; other sessions' events between two of its
/// deltas do not separate them (each session has a stream of its own). A record whose
/// data cannot be read is left as it is.
pub(super) fn coalesce_deltas(batch: &mut Vec<EventRecord>) {
    if batch.len() < 2 {
        return;
    }
    // Per session: the index (in `kept`) of its last event, when that is a delta, with
    // its kind and the text gathered so far.
    let mut open: HashMap<String, (usize, EventKind, String)> = HashMap::new();
    let mut kept: Vec<EventRecord> = Vec::with_capacity(batch.len());
    let mut joined: Vec<(usize, EventKind, String)> = Vec::new();
    for record in batch.drain(..) {
        let delta = delta_of(&record);
        match (delta, open.get_mut(record.session_id.as_str())) {
            (Some((kind, text)), Some((at, open_kind, gathered)))
                if *open_kind == kind
                    && kept[*at].seq == record.seq
                    && kept[*at].epoch == record.epoch =>
            {
                gathered.push_str(&text);
            }
            (delta, _) => {
                if let Some(done) = open.remove(record.session_id.as_str()) {
                    joined.push(done);
                }
                if let Some((kind, text)) = delta {
                    open.insert(record.session_id.clone(), (kept.len(), kind, text));
                }
                kept.push(record);
            }
        }
    }
    joined.extend(open.into_values());
    for (at, kind, text) in joined {
        let event = match kind {
            EventKind::ThinkingDelta => AgentEvent::ThinkingDelta { text },
            _ => AgentEvent::TextDelta { text },
        };
        if let Ok(data) = serde_json::to_string(&event) {
            kept[at].data = data;
        }
    }
    *batch = kept;
}

/// The kind and text of a delta; `None` for any other event. The events are the
/// worker's own serialization, tag first, so any other event is told by its first bytes
/// without being parsed (the writer sees every event of the worker).
fn delta_of(record: &EventRecord) -> Option<(EventKind, String)> {
    let kind = if record.data.starts_with(r#"{"type":"text_delta""#) {
        EventKind::TextDelta
    } else if record.data.starts_with(r#"{"type":"thinking_delta""#) {
        EventKind::ThinkingDelta
    } else {
        return None;
    };
    match serde_json::from_str(&record.data).ok()? {
        AgentEvent::TextDelta { text } | AgentEvent::ThinkingDelta { text } => Some((kind, text)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn record(session: &str, seq: u64, epoch: i64, event: &AgentEvent) -> EventRecord {
        EventRecord {
            session_id: session.into(),
            id: String::new(),
            seq,
            epoch,
            data: serde_json::to_string(event).unwrap(),
        }
    }

    fn text(t: &str) -> AgentEvent {
        AgentEvent::TextDelta { text: t.into() }
    }

    fn thinking(t: &str) -> AgentEvent {
        AgentEvent::ThinkingDelta { text: t.into() }
    }

    fn started(iteration: u32) -> AgentEvent {
        AgentEvent::IterationStarted { iteration }
    }

    fn events(batch: &[EventRecord]) -> Vec<(String, u64, i64, AgentEvent)> {
        batch
            .iter()
            .map(|r| {
                let e: AgentEvent = serde_json::from_str(&r.data).unwrap();
                (r.session_id.clone(), r.seq, r.epoch, e)
            })
            .collect()
    }

    #[test]
    fn a_sessions_run_of_deltas_goes_out_as_one_in_its_place() {
        let mut batch = vec![
            record("a", 1, 1, &started(1)),
            record("a", 1, 1, &text("Hel")),
            record("b", 4, 2, &text("other ")),
            record("a", 1, 1, &text("lo, ")),
            record("b", 4, 2, &text("session")),
            record("a", 1, 1, &text("wörld \"quoted\"")),
            record("a", 1, 1, &thinking("hmm")),
            record("a", 1, 1, &thinking(" so")),
            record("a", 1, 1, &text("!")),
        ];
        coalesce_deltas(&mut batch);
        assert_eq!(
            events(&batch),
            vec![
                ("a".into(), 1, 1, started(1)),
                ("a".into(), 1, 1, text("Hello, wörld \"quoted\"")),
                ("b".into(), 4, 2, text("other session")),
                ("a".into(), 1, 1, thinking("hmm so")),
                ("a".into(), 1, 1, text("!")),
            ]
        );
    }

    #[test]
    fn deltas_of_different_positions_runs_or_separated_by_an_event_stay_apart() {
        let mut batch = vec![
            record("a", 1, 1, &text("x")),
            record("a", 2, 1, &text("y")),
            record("a", 2, 2, &text("z")),
            record("a", 2, 2, &started(3)),
            record("a", 2, 2, &text("w")),
            record(
                "a",
                2,
                2,
                &AgentEvent::TextDelta {
                    text: String::new(),
                },
            ),
        ];
        coalesce_deltas(&mut batch);
        let texts: Vec<(u64, i64, AgentEvent)> = events(&batch)
            .into_iter()
            .map(|(_, s, e, ev)| (s, e, ev))
            .collect();
        assert_eq!(
            texts,
            vec![
                (1, 1, text("x")),
                (2, 1, text("y")),
                (2, 2, text("z")),
                (2, 2, started(3)),
                (2, 2, text("w")),
            ]
        );
    }

    #[test]
    fn unreadable_records_and_lone_events_are_left_as_they_are() {
        let garbage = EventRecord {
            session_id: "a".into(),
            id: String::new(),
            seq: 1,
            epoch: 1,
            data: "{not json".into(),
        };
        let mut batch = vec![
            record("a", 1, 1, &text("x")),
            garbage.clone(),
            record("a", 1, 1, &text("y")),
        ];
        coalesce_deltas(&mut batch);
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[1], garbage);
        let mut one = vec![record("a", 1, 1, &text("x"))];
        coalesce_deltas(&mut one);
        assert_eq!(events(&one), vec![("a".into(), 1, 1, text("x"))]);
    }
}
