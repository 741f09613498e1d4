//! The live tail: the stream's events after the replay, live from the hub (`hub`) once
//! caught up, a `reset` when a new run redoes a step the client holds events of, and the
//! end once the session is over.

use std::time::{Duration, Instant};

use axum::response::sse::Event;

use agentq_core::protocol::EventKind;
use agentq_core::queue::EventRecord;

use super::hub::Subscription;
use super::ids::StreamId;
use super::relay::{Follower, Gone, Out, TailState, reset_event};
use super::transcript::completion_from_row;

/// Entries per catch-up read while tailing.
const TAIL_COUNT: usize = 500;
/// How long the tail waits for events before it checks the session's row.
const TAIL_BLOCK: Duration = Duration::from_secs(5);
/// Tail reads once the session is terminal: its last events may still be on their way.
const TERMINAL_BLOCK: Duration = Duration::from_millis(500);
/// How long a terminal session may go without its `session_completed` event before one
/// is rebuilt from the row (the worker died between the commit and the append, or the
/// session was dead-lettered).
const TERMINAL_GRACE: Duration = Duration::from_secs(2);
/// Consecutive failed catch-up reads before the stream is closed (the client reconnects).
const MAX_TAIL_ERRORS: u32 = 10;

impl Follower {
    /// The next events after `after`: caught up through the shared connection while
    /// there are stored ones, then live from the hub (subscribed here), or empty after
    /// `block` without any. A subscription the hub let go (the client lagged) is caught
    /// up the same way.
    async fn next_page(
        &self,
        live: &mut Option<Subscription>,
        after: &str,
        block: Duration,
    ) -> agentq_core::Result<Vec<EventRecord>> {
        let deadline = tokio::time::Instant::now() + block;
        loop {
            let sub = match live {
                Some(sub) => sub,
                None => {
                    let page = self
                        .queue
                        .read_events(&self.session_id, after, TAIL_COUNT, None)
                        .await?;
                    if !page.is_empty() {
                        return Ok(page);
                    }
                    let Some(pos) = StreamId::parse(after) else {
                        return Err(agentq_core::Error::invalid(
                            "after",
                            format!("{after:?} is not a stream entry id"),
                        ));
                    };
                    live.insert(
                        self.hub
                            .subscribe(&self.queue, &self.session_id, pos, &self.stop)
                            .await,
                    )
                }
            };
            match tokio::time::timeout_at(deadline, sub.next()).await {
                Ok(Some(page)) => return Ok(page),
                Ok(None) => *live = None,
                Err(_) => return Ok(Vec::new()),
            }
        }
    }

    /// Send what `page` holds that the client may see and does not hold, keeping `st`.
    async fn relay_page(&self, st: &mut TailState, page: &[EventRecord]) -> Result<(), Gone> {
        for r in page {
            st.after = r.id.clone();
            if r.seq < st.min_seq {
                // Covered by the transcript replay, except a call held since it read
                // the history: sent as it is, leaving the epoch bookkeeping alone (the
                // step it belongs to is not redone).
                if let Some(out) = Out::from_record(r)
                    && st.late_approval(&out)
                {
                    self.send(out.into_event()).await?;
                }
                continue;
            }
            if r.epoch < st.max_epoch {
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
        Ok(())
    }

    pub(super) async fn tail(&self, mut st: TailState) -> Result<(), Gone> {
        let mut errors = 0u32;
        let mut terminal_since: Option<Instant> = None;
        let mut live: Option<Subscription> = None;
        loop {
            let block = if terminal_since.is_some() {
                TERMINAL_BLOCK
            } else {
                TAIL_BLOCK
            };
            let asked = Instant::now();
            let read = tokio::select! {
                r = self.next_page(&mut live, &st.after, block) => r,
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
            self.relay_page(&mut st, &page).await?;
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
