//! Webhooks as objects of the API, scoped by tenant (scope `webhooks`): `POST
//! /v1/webhooks` registers an endpoint ([`CreateWebhook`]; the answer, a
//! [`WebhookView`], holds its signing `secret` once), `GET /v1/webhooks` lists them
//! ([`WebhookList`]), `GET`/`DELETE /v1/webhooks/{id}`, `POST /v1/webhooks/{id}/rotate`
//! ([`RotateWebhook`]: a new secret, the old one signing too for an overlap), `POST
//! /v1/webhooks/{id}/enable`, `GET /v1/webhooks/{id}/deliveries` ([`DeliveryList`],
//! paged) and `POST /v1/webhooks/{id}/redrive` ([`Redriven`]).
//!
//! Deliveries follow the Standard Webhooks specification: headers `webhook-id`,
//! `webhook-timestamp` and `webhook-signature` (`v1,<base64 HMAC-SHA256>`, one per
//! secret in force, space-separated), and a [`WebhookPayload`] body.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentq_agent::spec::ExitReason;
use agentq_types::model::SessionStatus;

use crate::sessions::PendingApproval;

/// The query parameters of `GET /v1/webhooks/{id}/deliveries`.
pub const DELIVERY_PARAMS: &[&str] = &["state", "limit", "cursor"];
/// Deliveries a page holds when `limit` is absent, and at most.
pub const DEFAULT_DELIVERIES: u32 = 50;
pub const MAX_DELIVERIES: u32 = 500;
/// Longest `url` of an endpoint (bytes).
pub const MAX_WEBHOOK_URL: usize = 2_048;
/// Longest `description` (bytes).
pub const MAX_WEBHOOK_DESCRIPTION: usize = 1_024;
/// The overlap of a rotation when `overlap_secs` is absent (a day), and at most (a week).
pub const DEFAULT_OVERLAP_SECS: u64 = 86_400;
pub const MAX_OVERLAP_SECS: u64 = 604_800;

/// The event types an endpoint may subscribe to.
pub const WEBHOOK_EVENTS: &[&str] = &[
    "session.completed",
    "session.failed",
    "session.waiting",
    "batch.completed",
];

/// `POST /v1/webhooks`. Any other field is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhook {
    /// Where deliveries are POSTed: an `http` or `https` URL of at most 2,048 bytes, with
    /// no credentials in it, whose host resolves to public addresses only (or is in the
    /// operator's `[webhooks] allowed_hosts`). Redirects are not followed.
    #[schema(max_length = 2048)]
    pub url: String,
    /// The event types to send: `session.completed`, `session.failed` (failed or
    /// cancelled), `session.waiting` (awaiting approval, with the held calls),
    /// `batch.completed`. At least one, no repeats.
    #[schema(min_items = 1)]
    pub events: Vec<String>,
    /// Only sessions of this queue (and batches whose sessions are in it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Only this batch's sessions and its completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
    /// The caller's note, at most 1,024 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub description: Option<String>,
}

/// `POST /v1/webhooks/{id}/rotate`. Any other field is refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateWebhook {
    /// Seconds the previous secret keeps signing beside the new one (both signatures in
    /// `webhook-signature`): 0 to 604,800, a day when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 604800)]
    pub overlap_secs: Option<u64>,
}

/// Whether an endpoint is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebhookStatus {
    Enabled,
    /// Deliveries failed continuously for too long (`disabled_reason` says since when and
    /// the last error); `POST /v1/webhooks/{id}/enable` starts again.
    Disabled,
}

/// An endpoint's deliveries per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryCountsView {
    /// To send, or being retried.
    pub pending: u64,
    pub delivered: u64,
    /// Out of retries (dead letters), until a redrive.
    pub dead: u64,
}

/// The last failed attempt of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookFailure {
    pub at: DateTime<Utc>,
    pub error: String,
}

/// An endpoint: `GET /v1/webhooks/{id}`, and the answer of its creation and rotation,
/// which alone hold `secret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookView {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    pub queue: Option<String>,
    pub batch_id: Option<String>,
    pub description: Option<String>,
    pub status: WebhookStatus,
    pub disabled_at: Option<DateTime<Utc>>,
    pub disabled_reason: Option<String>,
    /// Since when every attempt failed; `null` after a success.
    pub failing_since: Option<DateTime<Utc>>,
    pub last_failure: Option<WebhookFailure>,
    pub last_success_at: Option<DateTime<Utc>>,
    pub counts: DeliveryCountsView,
    pub created_at: DateTime<Utc>,
    /// Until when the secret before the last rotation signs too.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    /// The signing secret (`whsec_…`), only in the answer of the creation and of a
    /// rotation: it is never shown again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// `GET /v1/webhooks`: the caller's endpoints, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStateView {
    /// To send, or being retried.
    Pending,
    Delivered,
    /// Out of retries: a dead letter, until `POST /v1/webhooks/{id}/redrive`.
    Dead,
}

/// One message to one endpoint and its attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryView {
    /// The `webhook-id` every attempt carries.
    pub id: String,
    pub event: String,
    pub session_id: Option<String>,
    pub batch_id: Option<String>,
    pub state: DeliveryStateView,
    pub attempts: u32,
    pub occurred_at: DateTime<Utc>,
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// The next attempt, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The HTTP status of the last attempt, when there was an answer.
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub delivered_at: Option<DateTime<Utc>>,
}

/// `GET /v1/webhooks/{id}/deliveries?state=&limit=&cursor=`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryList {
    pub deliveries: Vec<DeliveryView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

/// The answer of `POST /v1/webhooks/{id}/redrive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Redriven {
    /// Dead letters queued again.
    pub requeued: u64,
}

/// The body of a delivery: `{"type", "timestamp", "data"}`, with `type` the event and
/// `data` its own shape. One variant per event an endpoint can subscribe to, so that the
/// document's `webhooks` (built from this type) and the bytes sent (serialized from it)
/// are the same thing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type")]
pub enum WebhookPayload {
    /// A session finished with `completed`.
    #[serde(rename = "session.completed")]
    SessionCompleted {
        /// When the change happened.
        timestamp: DateTime<Utc>,
        data: SessionChange,
    },
    /// A session finished `failed` or `cancelled` (`data.status` says which).
    #[serde(rename = "session.failed")]
    SessionFailed {
        timestamp: DateTime<Utc>,
        data: SessionChange,
    },
    /// A session suspended awaiting a human decision on the calls it holds.
    #[serde(rename = "session.waiting")]
    SessionWaiting {
        timestamp: DateTime<Utc>,
        data: SessionWaitingChange,
    },
    /// Every session of a batch finished.
    #[serde(rename = "batch.completed")]
    BatchCompleted {
        timestamp: DateTime<Utc>,
        data: BatchChange,
    },
}

impl WebhookPayload {
    /// The event type, as `type` and an endpoint's `events` name it.
    pub fn event(&self) -> &'static str {
        match self {
            WebhookPayload::SessionCompleted { .. } => "session.completed",
            WebhookPayload::SessionFailed { .. } => "session.failed",
            WebhookPayload::SessionWaiting { .. } => "session.waiting",
            WebhookPayload::BatchCompleted { .. } => "batch.completed",
        }
    }
}

/// The `data` of `session.completed` and `session.failed`: the session as the change left
/// it (`GET /v1/sessions/{session_id}` has the rest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionChange {
    pub session_id: String,
    pub queue: String,
    /// The batch it belongs to; `null` for a session created alone.
    pub batch_id: Option<String>,
    pub status: SessionStatus,
    /// Why it ended; `null` when it did not run to an end (cancelled before it ran).
    pub finish_reason: Option<ExitReason>,
}

/// The `data` of `session.waiting`: the session and the calls it holds, each decided by
/// `POST /v1/sessions/{session_id}/approvals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionWaitingChange {
    pub session_id: String,
    pub queue: String,
    pub batch_id: Option<String>,
    /// `awaiting_approval`.
    pub status: SessionStatus,
    /// The calls still held when the delivery was sent (a call decided meanwhile is left
    /// out), in the order the model made them.
    pub calls: Vec<PendingApproval>,
}

/// The `data` of `batch.completed` (`GET /v1/batches/{batch_id}` has its counts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchChange {
    pub batch_id: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn wire_shapes() {
        let c: CreateWebhook = serde_json::from_value(
            json!({"url": "https://x.test/h", "events": ["session.completed"]}),
        )
        .unwrap();
        assert_eq!(c.queue, None);
        assert!(
            serde_json::from_value::<CreateWebhook>(json!({"url": "u", "events": [], "x": 1}))
                .is_err()
        );
        let r: RotateWebhook = serde_json::from_value(json!({})).unwrap();
        assert_eq!(r.overlap_secs, None);
        assert_eq!(
            serde_json::to_value(Redriven { requeued: 2 }).unwrap(),
            json!({"requeued": 2})
        );
        assert_eq!(
            serde_json::to_value(WebhookStatus::Disabled).unwrap(),
            json!("disabled")
        );
    }

    #[test]
    fn a_payload_is_type_timestamp_and_data() {
        let p = WebhookPayload::SessionWaiting {
            timestamp: "2026-12-01T08:00:00Z".parse().unwrap(),
            data: SessionWaitingChange {
                session_id: "s1".into(),
                queue: "default".into(),
                batch_id: None,
                status: SessionStatus::AwaitingApproval,
                calls: vec![PendingApproval {
                    tool_call_id: "c1".into(),
                    tool: "write_file".into(),
                    arguments: json!({"path": "a"}),
                    deadline: None,
                }],
            },
        };
        let wire = serde_json::to_value(&p).unwrap();
        assert_eq!(
            wire,
            json!({"type": "session.waiting", "timestamp": "2026-12-01T08:00:00Z",
                   "data": {"session_id": "s1", "queue": "default", "batch_id": null,
                            "status": "awaiting_approval",
                            "calls": [{"tool_call_id": "c1", "tool": "write_file",
                                       "arguments": {"path": "a"}, "deadline": null}]}})
        );
        assert_eq!(p.event(), "session.waiting");
        assert_eq!(serde_json::from_value::<WebhookPayload>(wire).unwrap(), p);
    }
}
