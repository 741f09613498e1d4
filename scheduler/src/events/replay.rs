//! The replay: what the client is missing of the stored events (abandoned ones left out),
//! or, without a stream, of the events rebuilt from the transcript.

use agentq_core::protocol::EventKind;
use agentq_core::queue::EventRecord;

use super::handover::{EventKey, abandoned, reset_after};
use super::ids::{LastId, StreamId};
use super::relay::{Follower, Gone, Out, TailState, reset_event};
use super::transcript::transcript_events;

/// Entries per `XREAD` while replaying.
const PAGE: usize = 1000;
/// Replay at most this many stored events (the stream's cap is ~20,000).
const MAX_REPLAY: usize = 40_000;

impl Follower {
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

    /// Send what the client is missing; `None` when the stream is complete already.
    pub(super) async fn replay(&self, last: Option<LastId>) -> Result<Option<TailState>, Gone> {
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
            announced: Vec::new(),
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
        let mut announced = Vec::new();
        for (seq, k, data) in rebuilt {
            let out = Out {
                id: Some(format!("t-{seq}-{k}")),
                kind: data["type"].as_str().and_then(EventKind::parse),
                data,
            };
            completed |= out.is_completion();
            if let Some(id) = out.approval_id() {
                // Held by the client whether sent now or before its reconnect.
                announced.push(id.to_string());
            }
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
            announced,
        }))
    }
}
