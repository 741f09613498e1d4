//! The writers every run of a worker hands work to: the group commit (checkpoints) and
//! the event writer (events to the sessions' streams). Started once, by the first of
//! [`crate::Worker::run`] and [`crate::Worker::process`]; stopped by the run loop's drain
//! in two steps (checkpoints once the sessions are done with them, events last). A
//! worker that is dropped without a drain stops them too: their channels close.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use agentq_core::metrics::Metrics;
use agentq_core::{Queue, Store};

use crate::group_commit::{self, GroupCommit, JobReceiver};
use crate::observe::{self, EventSender};

pub(crate) struct Pipeline {
    pub commits: GroupCommit,
    pub events: EventSender,
    metrics: &'static Metrics,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The receivers, until the writers take them.
    idle: Option<(JobReceiver, tokio::sync::mpsc::Receiver<observe::Outgoing>)>,
    committer: Option<Writer>,
    events: Option<Writer>,
}

struct Writer {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Writer {
    async fn stop(self, within: Duration) {
        self.stop.cancel();
        let _ = tokio::time::timeout(within, self.task).await;
    }
}

impl Pipeline {
    /// `event_buffer`: event records waiting for the writer at most (see
    /// [`observe::event_channel`]).
    pub fn new(event_buffer: usize, metrics: &'static Metrics) -> Self {
        let (commits, commits_rx) = GroupCommit::channel();
        let (events, events_rx) = observe::event_channel(event_buffer, metrics);
        Pipeline {
            commits,
            events,
            metrics,
            state: Mutex::new(State {
                idle: Some((commits_rx, events_rx)),
                ..State::default()
            }),
        }
    }

    /// Start both writers; nothing if they run already or have been stopped. `event_ttl`:
    /// how long a finished session's stream is kept.
    pub fn start(
        &self,
        store: Arc<dyn Store>,
        queue: Arc<dyn Queue>,
        limits: group_commit::Limits,
        event_ttl: Duration,
    ) {
        let mut state = self.lock();
        let Some((commits, events)) = state.idle.take() else {
            return;
        };
        let commits_stop = CancellationToken::new();
        state.committer = Some(Writer {
            task: tokio::spawn(group_commit::writer(
                store,
                commits,
                limits,
                self.metrics,
                commits_stop.clone(),
            )),
            stop: commits_stop,
        });
        let events_stop = CancellationToken::new();
        state.events = Some(Writer {
            task: tokio::spawn(observe::event_writer(
                queue,
                events,
                events_stop.clone(),
                event_ttl,
            )),
            stop: events_stop,
        });
    }

    /// Stop taking checkpoints; the commits in flight finish (`within` at most).
    pub async fn stop_commits(&self, within: Duration) {
        let committer = self.lock().committer.take();
        if let Some(c) = committer {
            c.stop(within).await;
        }
    }

    /// Stop the event writer after it has appended what it holds (`within` at most).
    pub async fn stop_events(&self, within: Duration) {
        let events = self.lock().events.take();
        if let Some(e) = events {
            e.stop(within).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
