//! Test doubles and waits shared by the agent crate's integration tests. Each test binary
//! uses a part of them.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentq_agent::driver::{Admit, BackgroundResult, BackgroundSource};
use agentq_agent::provider::LlmRequest;
use agentq_agent::schema::Message;
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

/// How long a test waits for something that should happen at once: generous, because a
/// loaded machine is slow, and free, because a wait that succeeds ends at the event. On a
/// paused clock it is virtual: a test that waits for what never comes fails as soon as
/// nothing else is left to run.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// What the test doubles record, announced: each double that records something bumps it,
/// and [`Changes::until`] checks its condition again at each bump, so a test waits for
/// the event itself instead of sleeping and looking.
#[derive(Clone)]
pub struct Changes(Arc<tokio::sync::watch::Sender<u64>>);

impl Default for Changes {
    fn default() -> Self {
        Changes(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Changes {
    /// Something was recorded.
    pub fn bump(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wait until `cond` holds: checked now and after every bump from now on, so a bump
    /// between the check and the wait is not missed. Panics naming `what` after
    /// [`WAIT_LIMIT`].
    pub async fn until(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let mut rx = self.0.subscribe();
        tokio::time::timeout(WAIT_LIMIT, rx.wait_for(|_| cond()))
            .await
            .unwrap_or_else(|_| panic!("timed out after {WAIT_LIMIT:?} waiting for {what}"))
            .expect("the sender lives as long as this handle");
    }
}

/// Poll `cond` until it holds, for what announces nothing (a child process, a file);
/// panics naming `what` after [`WAIT_LIMIT`]. Not for a paused clock: it sleeps between
/// checks.
pub async fn wait_until<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    let mut pause = Duration::from_millis(1);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {WAIT_LIMIT:?} waiting for {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// One user message, no tools: a request for tests about how a call travels, not what
/// it says.
pub fn hello_request() -> LlmRequest<'static> {
    LlmRequest {
        model: "m".into(),
        system: None,
        messages: vec![Message::user("hello").into()],
        tools: Vec::new().into(),
        temperature: 0.0,
        max_tokens: 64,
        session_id: "s".into(),
        web_search: None,
    }
}

/// The scripted answers of a test's admission: each ask takes the next one (none left:
/// the admission's own default), after the delay queued for it (a slow round trip, a
/// starved worker; taken on the paused clock, which a test queuing delays runs on), and
/// a `Go` gets the latest start a limiter would stamp on it, counted from when it was
/// asked.
#[derive(Default)]
pub struct AdmissionScript {
    pub answers: Mutex<VecDeque<Admit>>,
    pub slow: Mutex<VecDeque<Duration>>,
    /// How long after its booked start each call let through may still start.
    pub late_after: Mutex<Option<Duration>>,
}

impl AdmissionScript {
    pub fn new(answers: Vec<Admit>) -> Self {
        AdmissionScript {
            answers: Mutex::new(answers.into()),
            ..Default::default()
        }
    }

    /// The next scripted answer, once its delay is over.
    pub async fn next(&self) -> Option<Admit> {
        let asked = tokio::time::Instant::now();
        let slow = self.slow.lock().unwrap().pop_front();
        if let Some(d) = slow {
            // The answer's round trip takes `d` of the test's paused clock.
            tokio::time::advance(d).await;
        }
        let late_after = *self.late_after.lock().unwrap();
        let mut answer = self.answers.lock().unwrap().pop_front()?;
        if let (Admit::Go(p), Some(l)) = (&mut answer, late_after) {
            p.start_by = Some(asked + p.start_after + l);
        }
        Some(answer)
    }
}
