//! `GET /v1/approvals`: the tool calls the caller's sessions hold for a human decision,
//! across sessions, oldest session first.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The query parameters `GET /v1/approvals` accepts.
pub const APPROVALS_PARAMS: &[&str] =
    &["queue", "batch_id", "tool", "session_id", "limit", "cursor"];

/// Approvals per page when `limit` is absent.
pub const DEFAULT_APPROVALS_LIMIT: u32 = 50;

/// One held call waiting for `POST /v1/sessions/{session_id}/approvals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalItem {
    pub session_id: String,
    /// What the decision names as `tool_call_id`.
    pub tool_call_id: String,
    pub tool: String,
    /// The arguments as the model sent them.
    pub arguments: serde_json::Value,
    /// When the session stopped to wait for the decision.
    pub requested_at: DateTime<Utc>,
    /// When an unanswered call counts as denied (`timeout`); `null` when unknown.
    pub deadline: Option<DateTime<Utc>>,
    pub queue: String,
    pub batch_id: Option<String>,
    /// The session's `metadata`.
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// `GET /v1/approvals?queue=&batch_id=&tool=&session_id=&limit=&cursor=`: a page of the
/// calls the caller's sessions hold, oldest session first and each session's calls in the
/// order the model made them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalList {
    pub approvals: Vec<ApprovalItem>,
    /// Pass as `cursor` for the next page (opaque); `null` on the last one.
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn a_page_reads_as_written() {
        let wire = json!({"approvals": [{"session_id": "s1", "tool_call_id": "c1",
            "tool": "write_file", "arguments": {"path": "a"},
            "requested_at": "2026-12-01T08:36:45.123456Z", "deadline": null,
            "queue": "default", "batch_id": null, "metadata": {"user": "u1"}}],
            "next_cursor": null});
        let page: ApprovalList = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(page.approvals[0].tool, "write_file");
        assert_eq!(serde_json::to_value(&page).unwrap(), wire);
    }
}
