//! The delivery loop: claims due outbox rows (a lease per row, so any number of
//! schedulers run it side by side without sending a row twice at once), sends each as a
//! signed POST within bounds (attempts in flight overall and per endpoint, one timeout
//! from connecting to the end of the answer, a capped read of the answer, no redirects,
//! the destination checked again and the connection pinned to it), and records what
//! happened: delivered, or due again after an exponential backoff with jitter, or, past
//! the retry window, a dead letter. It also settles the batch checks the store's triggers
//! leave, and prunes old deliveries.
//!
//! Time comes from a [`Clock`], so tests move it instead of waiting; the loop's own
//! pauses between polls are tokio's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::Url;
use reqwest::header::{CONTENT_TYPE, HeaderValue, USER_AGENT};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use agentq_agent::spec::ExitReason;
use agentq_api::{BatchChange, SessionChange, SessionWaitingChange, WebhookPayload};
use agentq_core::webhook::{AttemptOutcome, DeliveryRow, RetryRule, WebhookEvent, WebhookRow};
use agentq_core::{SessionStatus, Store};

use super::WebhookSettings;
use super::sign::signature_header;
use crate::http::pending_approval;

/// "Now", for the store side of deliveries (leases, backoff, retry windows, disabling).
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told (tests).
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock(Mutex::new(start))
    }

    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *t += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::zero());
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Batch checks settled per pass.
const CHECKS_PER_PASS: u32 = 200;
/// Finished deliveries deleted per prune, and passes between prunes.
const PRUNE_BATCH: u32 = 1_000;
const PASSES_PER_PRUNE: u32 = 60;
/// The first retry's wait; each later one doubles it (up to `max_backoff`).
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest error text kept with a delivery.
const MAX_ERROR_CHARS: usize = 500;

/// The delivery loop of one process (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Deliverer {
    store: Arc<dyn Store>,
    settings: WebhookSettings,
    clock: Arc<dyn Clock>,
    in_flight: Arc<Semaphore>,
    per_endpoint: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

impl Deliverer {
    pub fn new(store: Arc<dyn Store>, settings: WebhookSettings, clock: Arc<dyn Clock>) -> Self {
        Deliverer {
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight)),
            per_endpoint: Arc::default(),
            store,
            settings,
            clock,
        }
    }

    /// Deliver until `cancel`; then wait (at most one attempt's timeout and a little) for
    /// the attempts in flight. An attempt cut short is sent again once its lease ends.
    pub async fn run(self, cancel: CancellationToken) {
        let tracker = TaskTracker::new();
        let mut passes: u32 = 0;
        while !cancel.is_cancelled() {
            if passes.is_multiple_of(PASSES_PER_PRUNE) {
                self.prune().await;
            }
            passes = passes.wrapping_add(1);
            let claimed = match self.pass(&tracker, &cancel).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook delivery pass failed; retrying");
                    0
                }
            };
            // A full claim means more may be due: go again as soon as a slot frees.
            let pause = if claimed > 0 && claimed == self.settings.max_in_flight {
                Duration::from_millis(10)
            } else {
                self.settings.poll_interval
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        tracker.close();
        let bound = self.settings.timeout + Duration::from_secs(5);
        if tokio::time::timeout(bound, tracker.wait()).await.is_err() {
            tracing::warn!("webhook attempts still in flight at shutdown; their leases will end");
        }
    }

    /// One pass, waiting for the attempts it started (tests drive the loop with it).
    /// How many deliveries it claimed.
    pub async fn tick(&self) -> agentq_core::Result<usize> {
        let tracker = TaskTracker::new();
        let n = self.pass(&tracker, &CancellationToken::new()).await?;
        tracker.close();
        tracker.wait().await;
        Ok(n)
    }

    /// Settle batch checks, then claim what is due, up to the free slots, and start it.
    async fn pass(
        &self,
        tracker: &TaskTracker,
        cancel: &CancellationToken,
    ) -> agentq_core::Result<usize> {
        let now = self.clock.now();
        self.store.announce_batches(now, CHECKS_PER_PASS).await?;
        let room = self.in_flight.available_permits();
        if room == 0 {
            return Ok(0);
        }
        let limit = u32::try_from(room).unwrap_or(u32::MAX);
        let claimed = self
            .store
            .claim_deliveries(now, self.lease(), limit)
            .await?;
        let n = claimed.len();
        for d in claimed {
            let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                break;
            };
            let this = self.clone();
            let cancel = cancel.clone();
            tracker.spawn(async move { this.deliver(d, permit, cancel).await });
        }
        Ok(n)
    }

    /// How long a claimed row is ours: the wait for its endpoint's slot and the attempt.
    fn lease(&self) -> Duration {
        self.settings
            .timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(30))
    }

    async fn prune(&self) {
        let retention =
            chrono::Duration::from_std(self.settings.retention).unwrap_or(chrono::Duration::MAX);
        let Some(before) = self.clock.now().checked_sub_signed(retention) else {
            return;
        };
        if let Err(e) = self.store.prune_deliveries(before, PRUNE_BATCH).await {
            tracing::warn!(error = %e, "pruning old webhook deliveries failed");
        }
    }

    /// Send one claimed delivery and record the outcome.
    async fn deliver(
        &self,
        d: DeliveryRow,
        _permit: OwnedSemaphorePermit,
        cancel: CancellationToken,
    ) {
        let endpoint = match self.store.webhook(&d.endpoint_id).await {
            Ok(Some(e)) if e.disabled_at.is_none() => e,
            // Deleted (its rows went with it) or disabled (its rows are dead letters).
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, delivery = %d.id, "reading a webhook endpoint failed");
                return;
            }
        };
        let Some(_slot) = self.endpoint_slot(&endpoint.id).await else {
            // The endpoint is busy past the lease's room: the row is due again then.
            return;
        };
        let outcome = match self.body(&d).await {
            Ok(Ok(body)) => tokio::select! {
                // Shutdown: the lease ends and another pass sends it again.
                _ = cancel.cancelled() => return,
                o = self.attempt(&endpoint, &d.id, &body) => o,
            },
            Ok(Err(error)) => AttemptOutcome::Failed {
                status: None,
                error,
            },
            Err(e) => {
                // The store is unreachable: the lease ends and another pass tries again.
                tracing::warn!(error = %e, delivery = %d.id, "building a webhook body failed");
                return;
            }
        };
        let now = self.clock.now();
        let rule = RetryRule {
            next_attempt_at: match outcome {
                AttemptOutcome::Delivered { .. } => None,
                AttemptOutcome::Failed { .. } => self.next_attempt(&d, now),
            },
            disable_after: self.settings.disable_after,
        };
        match self.store.record_attempt(&d, now, &outcome, &rule).await {
            Ok(rec) => {
                let m = agentq_core::metrics::global();
                let label = match (&outcome, rec.dead) {
                    (AttemptOutcome::Delivered { .. }, _) => "delivered",
                    (_, true) => "dead",
                    _ => "failed",
                };
                m.webhook_attempts.with_label_values(&[label]).inc();
                if rec.disabled {
                    m.webhook_endpoints_disabled.inc();
                    tracing::warn!(endpoint = %endpoint.id, tenant = %endpoint.tenant,
                        "webhook endpoint disabled after failing continuously");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, delivery = %d.id, "recording a webhook attempt failed");
            }
        }
    }

    /// A slot of the endpoint's, waited for at most as long as the lease leaves room.
    async fn endpoint_slot(&self, id: &str) -> Option<OwnedSemaphorePermit> {
        let sem = {
            let mut map = self.per_endpoint.lock().unwrap_or_else(|p| p.into_inner());
            // Forget idle endpoints' semaphores, so the map holds only busy ones.
            map.retain(|_, s| Arc::strong_count(s) > 1);
            map.entry(id.to_string())
                .or_insert_with(|| {
                    Arc::new(Semaphore::new(self.settings.max_in_flight_per_endpoint))
                })
                .clone()
        };
        let wait = self.settings.timeout + Duration::from_secs(15);
        tokio::time::timeout(wait, sem.acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// When a failed delivery is tried again: after 5 s, doubling per attempt up to
    /// `max_backoff`, less up to a quarter at random (so that a recovering endpoint is not
    /// hit by every retry at once), and never after the retry window ends; `None` once it
    /// has ended (a dead letter).
    fn next_attempt(&self, d: &DeliveryRow, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let window = chrono::Duration::from_std(self.settings.retry_for).ok()?;
        let deadline = d.retry_from.checked_add_signed(window)?;
        if now >= deadline {
            return None;
        }
        let doublings = d.attempts.saturating_sub(1).min(20);
        let backoff = FIRST_BACKOFF
            .saturating_mul(1u32 << doublings)
            .min(self.settings.max_backoff);
        let backoff = backoff.mul_f64(1.0 - 0.25 * jitter());
        let next = chrono::Duration::from_std(backoff)
            .ok()
            .and_then(|b| now.checked_add_signed(b))
            .unwrap_or(deadline);
        Some(next.min(deadline))
    }

    /// The delivery's body: the same bytes at every attempt but for `session.waiting`'s
    /// calls, read from the session's history (those still held). A row no payload can be
    /// made of (an event of a newer release, a session event without its session) is the
    /// inner `Err`: a failed attempt, so that it ends as a dead letter the owner can see
    /// rather than being claimed again forever.
    async fn body(&self, d: &DeliveryRow) -> agentq_core::Result<Result<Vec<u8>, String>> {
        let payload = match self.payload(d).await? {
            Ok(p) => p,
            Err(e) => return Ok(Err(format!("cannot build the body: {e}"))),
        };
        Ok(serde_json::to_vec(&payload).map_err(|e| format!("cannot encode the body: {e}")))
    }

    /// The typed body of `d` (see [`Deliverer::body`]).
    async fn payload(
        &self,
        d: &DeliveryRow,
    ) -> agentq_core::Result<Result<WebhookPayload, String>> {
        let Some(event) = WebhookEvent::parse(&d.event) else {
            return Ok(Err(format!("unknown event type `{}`", d.event)));
        };
        let timestamp = d.occurred_at;
        if event == WebhookEvent::BatchCompleted {
            let Some(batch_id) = d.batch_id.clone() else {
                return Ok(Err("a batch event without its batch".into()));
            };
            let data = BatchChange { batch_id };
            return Ok(Ok(WebhookPayload::BatchCompleted { timestamp, data }));
        }
        let (Some(session_id), Some(queue)) = (d.session_id.clone(), d.queue.clone()) else {
            return Ok(Err("a session event without its session or queue".into()));
        };
        let Some(status) = d.status.as_deref().and_then(SessionStatus::parse) else {
            return Ok(Err(format!("unknown session status {:?}", d.status)));
        };
        let finish_reason = match &d.finish_reason {
            None => None,
            Some(r) => match serde_json::from_value::<ExitReason>(Value::String(r.clone())) {
                Ok(r) => Some(r),
                Err(_) => return Ok(Err(format!("unknown finish reason `{r}`"))),
            },
        };
        let batch_id = d.batch_id.clone();
        Ok(Ok(match event {
            WebhookEvent::SessionWaiting => {
                let calls = match self.store.get(&session_id).await? {
                    Some(row) => self
                        .store
                        .pending_approvals(&session_id, &d.held)
                        .await?
                        .into_iter()
                        .map(|c| pending_approval(&row, c))
                        .collect(),
                    // Deleted since: nothing is held any more.
                    None => Vec::new(),
                };
                let data = SessionWaitingChange {
                    session_id,
                    queue,
                    batch_id,
                    status,
                    calls,
                };
                WebhookPayload::SessionWaiting { timestamp, data }
            }
            WebhookEvent::SessionCompleted | WebhookEvent::SessionFailed => {
                let data = SessionChange {
                    session_id,
                    queue,
                    batch_id,
                    status,
                    finish_reason,
                };
                if event == WebhookEvent::SessionCompleted {
                    WebhookPayload::SessionCompleted { timestamp, data }
                } else {
                    WebhookPayload::SessionFailed { timestamp, data }
                }
            }
            WebhookEvent::BatchCompleted => {
                return Ok(Err("a batch event handled as a session's".into()));
            }
        }))
    }

    /// One signed POST, within the timeout; what it did.
    async fn attempt(&self, endpoint: &WebhookRow, id: &str, body: &[u8]) -> AttemptOutcome {
        let failed = |status: Option<u16>, error: String| AttemptOutcome::Failed {
            status,
            error: error.chars().take(MAX_ERROR_CHARS).collect(),
        };
        let url = match Url::parse(&endpoint.url) {
            Ok(u) => u,
            Err(e) => return failed(None, format!("the endpoint's URL is invalid: {e}")),
        };
        let pinned = match self.settings.destinations.check(&url).await {
            Ok(p) => p,
            Err(refused) => return failed(None, format!("refused: {}", refused.0)),
        };
        let now = self.clock.now();
        let mut secrets = vec![
            self.settings
                .signer
                .secret(&endpoint.id, &endpoint.secret_salt),
        ];
        if let (Some(old), Some(until)) = (&endpoint.old_secret_salt, endpoint.old_expires_at)
            && until > now
        {
            secrets.push(self.settings.signer.secret(&endpoint.id, old));
        }
        // The wire's time is the wall clock's: receivers hold it to their own (a
        // tolerance of minutes), whatever clock decides the store's side.
        let timestamp = Utc::now().timestamp();
        let signature = signature_header(&secrets, id, timestamp, body);
        let client = match client(pinned.as_ref(), self.settings.timeout) {
            Ok(c) => c,
            Err(e) => return failed(None, format!("cannot build the HTTP client: {e}")),
        };
        let request = client
            .post(url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(USER_AGENT, HeaderValue::from_static("agentq-webhooks"))
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.to_vec());
        let cap = self.settings.max_response_bytes;
        let sent = tokio::time::timeout(self.settings.timeout, async move {
            let mut resp = request.send().await?;
            // Read a little of the answer (some servers wait for it to be read), never more.
            let mut read = 0usize;
            while read < cap {
                match resp.chunk().await? {
                    Some(c) => read = read.saturating_add(c.len()),
                    None => break,
                }
            }
            Ok::<_, reqwest::Error>(resp.status())
        })
        .await;
        let late = || {
            failed(
                None,
                format!("no answer within {} s", self.settings.timeout.as_secs()),
            )
        };
        match sent {
            Err(_) => late(),
            Ok(Err(e)) if e.is_timeout() => late(),
            Ok(Err(e)) => failed(None, format!("request failed: {}", error_chain(&e))),
            Ok(Ok(s)) if s.is_success() => AttemptOutcome::Delivered { status: s.as_u16() },
            Ok(Ok(s)) if s.is_redirection() => failed(
                Some(s.as_u16()),
                format!("HTTP {s} (redirects are not followed)"),
            ),
            Ok(Ok(s)) => failed(Some(s.as_u16()), format!("HTTP {s}")),
        }
    }
}

/// A client that follows no redirect, uses no proxy (a proxy would resolve the host
/// itself, undoing the check) and, when the host was vetted, connects only to the
/// addresses it was vetted at.
fn client(
    pinned: Option<&(String, Vec<std::net::SocketAddr>)>,
    timeout: Duration,
) -> reqwest::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some((host, addrs)) = pinned {
        b = b.resolve_to_addrs(host, addrs);
    }
    b.build()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// A number in [0, 1) from the system's randomness (0 when it is unavailable).
fn jitter() -> f64 {
    let mut b = [0u8; 4];
    match getrandom::fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0),
        Err(_) => 0.0,
    }
}
