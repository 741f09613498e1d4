//! Test doubles shared by the agent crate's integration tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentq_agent::driver::{BackgroundResult, BackgroundSource};
use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

/// An in-process inbox: anything can push results; the loop drains them.
#[derive(Default)]
pub struct BackgroundInbox {
    results: std::sync::Mutex<Vec<BackgroundResult>>,
    outstanding: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl BackgroundInbox {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A child was started.
    pub fn started(&self) {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
    }

    /// A child finished with this result.
    pub fn push(&self, r: BackgroundResult) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(r);
        let _ = self
            .outstanding
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            });
        self.notify.notify_one();
    }
}

#[async_trait]
impl BackgroundSource for BackgroundInbox {
    async fn take(&self) -> Vec<BackgroundResult> {
        std::mem::take(&mut *self.results.lock().unwrap_or_else(|e| e.into_inner()))
    }
    fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }
    async fn wait(&self, cancel: &CancellationToken) -> bool {
        if !self
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return true;
        }
        tokio::select! {
            _ = self.notify.notified() => true,
            _ = cancel.cancelled() => false,
        }
    }
}
