//! Webhooks as the store keeps them: a tenant's endpoint ([`WebhookRow`], created from a
//! [`NewWebhook`]), the event types it may subscribe to ([`WebhookEvent`]), and the outbox
//! row of one event for one endpoint ([`DeliveryRow`]), which is also that delivery's
//! state (attempts, next attempt, dead letter). What an attempt did is an
//! [`AttemptOutcome`]; the policy its recording follows is a [`RetryRule`].

use std::time::Duration;

use chrono::{DateTime, Utc};

/// An event type an endpoint subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WebhookEvent {
    /// A session finished with `completed`.
    SessionCompleted,
    /// A session finished `failed` or `cancelled`.
    SessionFailed,
    /// A session suspended awaiting a human's approval of held tool calls.
    SessionWaiting,
    /// Every session of a batch finished.
    BatchCompleted,
}

impl WebhookEvent {
    pub const ALL: [WebhookEvent; 4] = [
        WebhookEvent::SessionCompleted,
        WebhookEvent::SessionFailed,
        WebhookEvent::SessionWaiting,
        WebhookEvent::BatchCompleted,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            WebhookEvent::SessionCompleted => "session.completed",
            WebhookEvent::SessionFailed => "session.failed",
            WebhookEvent::SessionWaiting => "session.waiting",
            WebhookEvent::BatchCompleted => "batch.completed",
        }
    }

    pub fn parse(s: &str) -> Option<WebhookEvent> {
        WebhookEvent::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// The stored form of an endpoint's event list: the names between commas, with one at
/// each end, so that the database matches a type as `,type,`.
pub fn events_column(events: &[WebhookEvent]) -> String {
    let mut out = String::from(",");
    for e in events {
        out.push_str(e.as_str());
        out.push(',');
    }
    out
}

/// The events of a stored list (unknown names are skipped: a newer release's).
pub fn events_of_column(s: &str) -> Vec<WebhookEvent> {
    s.split(',').filter_map(WebhookEvent::parse).collect()
}

/// An endpoint to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewWebhook {
    pub id: String,
    pub tenant: String,
    pub url: String,
    pub events: Vec<WebhookEvent>,
    pub queue: Option<String>,
    pub batch_id: Option<String>,
    pub description: Option<String>,
    /// What its signing secret is derived from (with the operator's key).
    pub secret_salt: String,
    pub created_at: DateTime<Utc>,
}

/// An endpoint as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookRow {
    pub id: String,
    pub tenant: String,
    pub url: String,
    pub events: Vec<WebhookEvent>,
    pub queue: Option<String>,
    pub batch_id: Option<String>,
    pub description: Option<String>,
    pub secret_salt: String,
    /// The salt before the last rotation, signing too until `old_expires_at`.
    pub old_secret_salt: Option<String>,
    pub old_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub disabled_at: Option<DateTime<Utc>>,
    pub disabled_reason: Option<String>,
    /// Since when every attempt failed; `None` after a success.
    pub failing_since: Option<DateTime<Utc>>,
    pub last_failure_at: Option<DateTime<Utc>>,
    pub last_failure: Option<String>,
    pub last_success_at: Option<DateTime<Utc>>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryState {
    /// To send (due now or at its next attempt), or being sent.
    Pending,
    Delivered,
    /// Out of retries: a dead letter, until a redrive queues it again.
    Dead,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 3] = [
        DeliveryState::Pending,
        DeliveryState::Delivered,
        DeliveryState::Dead,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        DeliveryState::ALL.into_iter().find(|e| e.as_str() == s)
    }
}

/// One event for one endpoint: the outbox row and its delivery's state.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRow {
    /// The `webhook-id` of every attempt.
    pub id: String,
    pub endpoint_id: String,
    /// The event type's name (as [`WebhookEvent::as_str`] writes it).
    pub event: String,
    pub session_id: Option<String>,
    pub batch_id: Option<String>,
    pub queue: Option<String>,
    /// The session's status and finish reason as the announced change left them.
    pub status: Option<String>,
    pub finish_reason: Option<String>,
    /// `session.waiting`: the ids of the held calls.
    pub held: Vec<String>,
    pub occurred_at: DateTime<Utc>,
    pub state: DeliveryState,
    /// Attempts started (a claim counts one).
    pub attempts: u32,
    pub retry_from: DateTime<Utc>,
    pub next_attempt_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// An endpoint's deliveries per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub pending: u64,
    pub delivered: u64,
    pub dead: u64,
}

/// What one attempt did.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    /// The endpoint answered 2xx.
    Delivered { status: u16 },
    /// Anything else: another status, no answer in time, no connection, a refused
    /// address.
    Failed { status: Option<u16>, error: String },
}

/// How a failed attempt is recorded: when the next one is (`None`: out of retries, a
/// dead letter), and how long an endpoint may fail continuously before it is disabled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryRule {
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub disable_after: Duration,
}

/// What recording an attempt did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The claim still held (no other claimer took the delivery meanwhile).
    pub recorded: bool,
    /// The delivery became a dead letter.
    pub dead: bool,
    /// The endpoint was disabled by this failure.
    pub disabled: bool,
}
