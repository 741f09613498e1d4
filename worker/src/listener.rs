//! The signal listener: cancel, wake-up and interrupt signals for sessions, from the
//! queue's notification channel, delivered to the runs they concern. A wake-up for a
//! session with no run here is remembered for a run that may be between its claim and
//! its registration (see [`crate::runs::Runs::register`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use agentq_core::protocol::WorkerSignal;

use crate::inner::Inner;

pub(crate) async fn signal_listener(inner: Arc<Inner>, stop: CancellationToken) {
    let mut stream = loop {
        match inner.queue.subscribe_signals().await {
            Ok(s) => break s,
            Err(e) => {
                warn!(error = %e, "subscribing to cancels failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    };
    loop {
        let msg = tokio::select! {
            m = stream.next() => match m { Some(msg) => msg, None => return },
            _ = stop.cancelled() => return,
        };
        deliver(&inner, msg);
    }
}

fn deliver(inner: &Inner, signal: WorkerSignal) {
    let id = signal.session_id();
    let active = inner.runs.lock();
    if let Some(a) = active.get(id) {
        match signal {
            WorkerSignal::Wake(_) => a.inbox.mark_dirty(),
            WorkerSignal::Interrupt(_) => {
                info!(session_id = %id, "interrupted by a new message");
                a.inbox.mark_dirty();
                a.interrupter.interrupt();
            }
            WorkerSignal::Cancel(_) => {
                info!(session_id = %id, "cancel requested");
                a.cancel.cancel();
            }
        }
    } else if !matches!(signal, WorkerSignal::Cancel(_)) {
        // Under the `active` lock, as `Runs::register` requires.
        inner.runs.note_missed_wake(id);
    }
}
