//! Acting on many sessions at once: `POST /v1/sessions/cancel` and
//! `POST /v1/sessions/retry` take a filter instead of an id and act on the caller's
//! sessions that match, a bounded number per call, with a cursor to the rest.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentq_types::model::SessionStatus;

use crate::sessions::{CancelResponse, RetryResponse};

/// Sessions examined by one call when `limit` is absent, and at most.
pub const BULK_LIMIT: u32 = 1_000;

/// `POST /v1/sessions/cancel` and `POST /v1/sessions/retry`: which of the caller's
/// sessions to act on. Any other field is refused.
///
/// Cancel requires `batch_id` and cancels the batch's sessions that have not finished.
/// Retry redrives the sessions that failed with an error (as `POST
/// /v1/sessions/{id}/retry` does), narrowed by every field given; with none, every such
/// session of the caller's tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionFilter {
    /// Only the sessions of this batch (`batch_id` of a session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
    /// Retry only: sessions whose error contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// Retry only: sessions that finished at or after this time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_since: Option<DateTime<Utc>>,
    /// Retry only: sessions in this status; only `failed` (with an error) can be
    /// retried, any other status is refused (422 naming `status`). `failed` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SessionStatus>,
    /// Continue after this session id: the `next_cursor` of the previous answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Sessions examined by this call: 1 to 1000 (`BULK_LIMIT`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `POST /v1/sessions/cancel`: the sessions cancelled (or asked to stop, when running),
/// newest first, and where to continue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BulkCancelResponse {
    pub sessions: Vec<CancelResponse>,
    /// More sessions may match: call again with this as `cursor`. `null` when done.
    pub next_cursor: Option<String>,
}

/// `POST /v1/sessions/retry`: the sessions queued again, newest first, and where to
/// continue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BulkRetryResponse {
    pub sessions: Vec<RetryResponse>,
    /// More sessions may match: call again with this as `cursor`. `null` when done.
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::de::struct_fields;

    #[test]
    fn filters_and_answers() {
        let f: SessionFilter = serde_json::from_value(json!({"batch_id": "b1",
            "finished_since": "2026-01-31T12:00:00Z", "limit": 10}))
        .unwrap();
        assert_eq!(f.batch_id.as_deref(), Some("b1"));
        assert_eq!(f.limit, Some(10));
        assert_eq!(
            serde_json::to_value(SessionFilter::default()).unwrap(),
            json!({})
        );
        assert_eq!(
            struct_fields::<SessionFilter>(),
            [
                "batch_id",
                "error_contains",
                "finished_since",
                "status",
                "cursor",
                "limit"
            ]
        );
        let r: BulkCancelResponse = serde_json::from_value(json!({"sessions": [
            {"id": "s1", "status": "cancelled"},
            {"id": "s2", "status": "running", "cancel_requested": true}],
            "next_cursor": null}))
        .unwrap();
        assert!(r.sessions[1].cancel_requested);
        let r: BulkRetryResponse = serde_json::from_value(
            json!({"sessions": [{"id": "s1", "status": "queued"}], "next_cursor": "s1"}),
        )
        .unwrap();
        assert_eq!(r.next_cursor.as_deref(), Some("s1"));
    }
}
