//! Creating, reading, listing and cancelling sessions.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_types::model::SessionStatus;
use agentq_types::wait::WaitReason;

use crate::de::struct_fields;
use crate::files::FileContent;

/// `POST /v1/sessions`, and each item of `POST /v1/sessions/batch`: a session to run.
///
/// The spec's fields (`SessionSpec`: `prompt`, `mode`, `max_iterations`, …) sit at the
/// top level beside `queue` and `idempotency_key`. Any other field is refused rather than
/// ignored (a typo such as `max_iteration` would otherwise run the session with the
/// default silently), and fields named like credentials are refused anywhere in the body:
/// provider keys belong to the workers' configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreateSession {
    #[serde(flatten)]
    pub spec: SessionSpec,
    /// The queue to run on: 1 to 64 of `A-Z a-z 0-9 _ . -`; `default` when absent or `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// A repeat with the same key answers with the existing session (200) instead of
    /// creating another: 1 to 256 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// 0 (lowest) to 9; 5 when absent. Among sessions waiting for a queue, higher
    /// priorities are handed to workers first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    /// Files the session's workspace starts with, by path (relative, `/`-separated):
    /// bounded by the tenant's policy (`max_input_files`, `max_input_bytes`,
    /// `max_path_bytes`, `max_path_depth`); a bad one is named `files["../x"]`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, FileContent>,
    /// Start from the committed files of this session (of the same tenant): a fork of its
    /// workspace; `files` then replace what they name. Later changes of either do not
    /// reach the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_from: Option<String>,
}

impl CreateSession {
    /// The fields about the request rather than the session's work.
    pub const ENVELOPE_FIELDS: &'static [&'static str] = &[
        "queue",
        "idempotency_key",
        "priority",
        "files",
        "workspace_from",
    ];

    /// The fields that map onto [`SessionSpec`].
    pub fn spec_fields() -> &'static [&'static str] {
        struct_fields::<SessionSpec>()
    }

    /// Whether a body may have a field of this name.
    pub fn accepts(field: &str) -> bool {
        Self::ENVELOPE_FIELDS.contains(&field) || Self::spec_fields().contains(&field)
    }
}

/// `POST /v1/sessions/batch`: 1 to `max_batch` sessions (10,000 by default), created all
/// or none: one bad item refuses the batch, naming it (`[17].mode`).
pub type BatchRequest = Vec<CreateSession>;

/// A session's id and status: the answer to `POST /v1/sessions` (201 when created, 200
/// for a repeat of an idempotency key, with the existing session's status) and each item
/// of `BatchResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionRef {
    pub id: String,
    pub status: SessionStatus,
}

/// `POST /v1/sessions/batch`: the sessions in the order of the request (201 when any was
/// created, 200 when all were repeats), and the batch they belong to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchResponse {
    pub sessions: Vec<SessionRef>,
    /// The batch's id: a new one, or the one the request joined (`?batch_id=`). Absent
    /// from a server that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
}

/// A session as the API shows it: its spec's fields at the top level beside its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    #[serde(flatten)]
    pub spec: SessionSpec,
    pub id: String,
    pub status: SessionStatus,
    /// Why it ended; `null` until it has.
    pub finish_reason: Option<ExitReason>,
    pub result: Option<String>,
    pub error: Option<String>,
    /// Model calls made so far.
    pub iterations: u32,
    pub usage: Usage,
    /// The session that spawned this one; `null` for a root.
    pub parent_id: Option<String>,
    /// The root of its tree (its own id for a root).
    pub root_id: String,
    /// 0 for a root, 1 for its children, …
    pub depth: u32,
    pub queue: String,
    /// A cancel was asked for and its worker has not stopped it yet.
    pub cancel_requested: bool,
    /// Claims since it last ran cleanly.
    pub attempts: u32,
    /// Times a worker took it over from one that died holding it: 0 for a session that
    /// ran without a crash.
    #[serde(default)]
    pub takeovers: u32,
    /// The worker running it, if one is.
    pub lease_owner: Option<String>,
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// While `waiting` or `awaiting_approval`: what for (`children`, `approval`,
    /// `rate_limit`, `budget`); `null` otherwise (and from a server that predates it).
    #[serde(default)]
    pub wait_reason: Option<WaitReason>,
    /// While waiting for a rate limit: when it goes back on the queue by itself.
    #[serde(default)]
    pub wake_at: Option<DateTime<Utc>>,
    /// A fork's origin (`POST /v1/sessions/{id}/fork`): the session whose first
    /// `fork_at` messages begin this one's history. Absent on other sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_at: Option<u32>,
    /// 0 (lowest) to 9.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// The `POST /v1/sessions/batch` request that created it; `null` for one created alone.
    #[serde(default)]
    pub batch_id: Option<String>,
}

fn default_priority() -> u8 {
    5
}

/// `POST /v1/sessions/{id}/retry`: the session queued again from its last checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RetryResponse {
    pub id: String,
    pub status: SessionStatus,
}

/// `GET /v1/sessions/{id}`: the session, the ids of its children (newest first, at
/// most 1000) and the tool calls it holds for a human decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub session: SessionView,
    pub children: Vec<String>,
    /// The calls waiting for `POST /v1/sessions/{id}/approvals`, in the order the model
    /// made them: held by a run and not decided yet. Empty for a session that holds none
    /// (and from a server that predates the field).
    #[serde(default)]
    pub pending_approvals: Vec<PendingApproval>,
    /// What the session's own usage cost at the configured prices; left out when its
    /// model has no price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The spend of the tree the session belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_cost: Option<crate::budgets::TreeCost>,
    /// Its part of the tree's token budget; left out without a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budgets::BudgetLedger>,
}

/// A sensitive tool call held until someone approves or denies it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PendingApproval {
    /// What `POST /v1/sessions/{id}/approvals` names as `tool_call_id`.
    pub tool_call_id: String,
    pub tool: String,
    pub arguments: serde_json::Value,
    /// When an unanswered call counts as denied (`timeout`); `null` until the session has
    /// suspended for it.
    pub deadline: Option<DateTime<Utc>>,
}

/// `GET /v1/sessions/{id}/tree`: the session and its descendants, nested, oldest child
/// first (at most 10,000 sessions in all).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TreeNode {
    #[serde(flatten)]
    pub session: SessionView,
    // Named by reference: the derived schema list must not recurse into itself.
    #[schema(no_recursion)]
    pub children: Vec<TreeNode>,
}

/// `GET /v1/sessions?status=&limit=&cursor=&parent_id=&batch_id=&…`: a page of sessions,
/// newest first, narrowed by every filter given. Any other query parameter, or a value a
/// filter cannot take, is refused (422 naming it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ListResponse {
    pub sessions: Vec<SessionView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
    /// What the page's sessions cost together at the configured prices; left out when
    /// none of them has a price (a client adds the pages up for a batch's cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// The query parameters `GET /v1/sessions` accepts (`metadata` may be repeated, each
/// `key=value`, all of them required).
pub const LIST_PARAMS: &[&str] = &[
    // The paging first: the rest is the filter, which `COUNT_PARAMS` is.
    "limit",
    "cursor",
    "status",
    "parent_id",
    "batch_id",
    "finish_reason",
    "wait_reason",
    "queue",
    "metadata",
    "created_after",
    "created_before",
    "min_cost_usd",
    "max_cost_usd",
    "q",
    "tenant",
];

/// `GET /v1/sessions/{id}/messages`: the session's history, parallel tool results in the
/// order of their calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MessagesResponse {
    pub messages: Vec<Message>,
}

/// `POST /v1/sessions/{id}/cancel`: 200 when it was cancelled at once (it was not
/// running), 202 with `cancel_requested: true` when its worker stops it at its next
/// check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CancelResponse {
    pub id: String,
    pub status: SessionStatus,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_requested: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    use super::*;

    /// Decoding today's wire form and encoding it again gives it back unchanged.
    fn round_trip<T: Serialize + DeserializeOwned>(wire: Value) -> T {
        let t: T = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), wire);
        t
    }

    fn view_json(id: &str) -> Value {
        json!({
            "prompt": "hello", "mode": "think", "max_iterations": 3, "temperature": 0.5,
            "max_tokens": 4096, "tool_timeout_secs": 60, "approval_timeout_secs": 3600,
            "history_window": 200, "max_llm_retries": 3, "retry_delay_ms": 1000,
            "max_background_drain_rounds": 20, "tool_output_max_chars": 50000,
            "max_repeated_calls": 4, "warn_repeated_calls": 3,
            "tools": ["read_file", "grep"], "metadata": {"user": "u1"},
            "id": id, "status": "queued", "finish_reason": null, "result": null,
            "error": null, "iterations": 0,
            "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                      "cache_write_tokens": 0, "reasoning_tokens": 0},
            "parent_id": null, "root_id": id, "depth": 0, "queue": "default",
            "cancel_requested": false, "attempts": 0, "takeovers": 0, "lease_owner": null,
            "idempotency_key": null, "created_at": "2026-12-01T08:36:45.123456Z",
            "updated_at": "2026-12-01T08:36:45.123456Z", "finished_at": null,
            "priority": 5, "batch_id": null,
            "wait_reason": null, "wake_at": null,
        })
    }

    #[test]
    fn create_session_fields() {
        let req: CreateSession = round_trip(
            json!({"prompt": "p", "mode": "plan-act", "queue": "batch.v2",
            "idempotency_key": "k1", "max_iterations": 3, "temperature": 0.5,
            "max_tokens": 4096, "tool_timeout_secs": 60, "approval_timeout_secs": 3600,
            "history_window": 200, "max_llm_retries": 3, "retry_delay_ms": 1000,
            "max_background_drain_rounds": 20, "tool_output_max_chars": 50000,
            "max_repeated_calls": 4, "warn_repeated_calls": 3,
            "metadata": {"user": "u"}}),
        );
        assert_eq!(req.queue.as_deref(), Some("batch.v2"));
        assert_eq!(req.spec.max_iterations, 3);
        let min: CreateSession = serde_json::from_value(json!({"prompt": "p"})).unwrap();
        assert_eq!(min.queue, None);
        assert_eq!(min.spec, SessionSpec::new("p"));
        let batch: BatchRequest =
            serde_json::from_value(json!([{"prompt": "a"}, {"prompt": "b", "queue": "bulk"}]))
                .unwrap();
        assert_eq!(batch[1].queue.as_deref(), Some("bulk"));
        let files = json!({"a.txt": "hi", "b.bin": {"base64": "AAE="}});
        let with_files: CreateSession =
            serde_json::from_value(json!({"prompt": "p", "files": files, "workspace_from": "s0"}))
                .unwrap();
        let back = serde_json::to_value(&with_files).unwrap();
        assert_eq!(
            (&back["files"], &back["workspace_from"]),
            (&files, &json!("s0"))
        );
        assert_eq!(with_files.files["a.txt"], FileContent::Text("hi".into()));
        assert_eq!(with_files.workspace_from.as_deref(), Some("s0"));
        assert!(min.files.is_empty() && min.workspace_from.is_none());

        for f in [
            "prompt",
            "system",
            "mode",
            "tools",
            "metadata",
            "queue",
            "idempotency_key",
            "priority",
            "files",
            "workspace_from",
        ] {
            assert!(CreateSession::accepts(f), "{f}");
        }
        assert!(!CreateSession::accepts("max_iteration"));
        assert!(!CreateSession::accepts("id"));
    }

    #[test]
    fn refs_batches_and_cancels() {
        let r: SessionRef = round_trip(json!({"id": "s1", "status": "queued"}));
        assert_eq!(r.status, SessionStatus::Queued);
        let b: BatchResponse = round_trip(json!({"sessions": [
            {"id": "s1", "status": "queued"}, {"id": "s2", "status": "cancelled"}]}));
        assert_eq!(b.sessions.len(), 2);
        let b: BatchResponse = round_trip(json!({"sessions": [], "batch_id": "b1"}));
        assert_eq!(b.batch_id.as_deref(), Some("b1"));
        let c: CancelResponse = round_trip(json!({"id": "s1", "status": "cancelled"}));
        assert!(!c.cancel_requested);
        let c: CancelResponse =
            round_trip(json!({"id": "s1", "status": "running", "cancel_requested": true}));
        assert!(c.cancel_requested);
        let r: RetryResponse = round_trip(json!({"id": "s1", "status": "queued"}));
        assert_eq!(r.status, SessionStatus::Queued);
    }

    #[test]
    fn views_details_trees_and_pages() {
        let v: SessionView = round_trip(view_json("s1"));
        assert_eq!(v.spec.prompt, "hello");
        assert_eq!(
            v.spec.tools.as_deref(),
            Some(&["read_file".to_string(), "grep".into()][..])
        );
        assert_eq!(v.iterations, 0);
        assert_eq!((v.priority, v.batch_id.as_deref()), (5, None));
        // An older server's answer, without the scheduling fields, reads with defaults.
        let mut older = view_json("s1");
        older.as_object_mut().unwrap().remove("priority");
        older.as_object_mut().unwrap().remove("batch_id");
        let old: SessionView = serde_json::from_value(older).unwrap();
        assert_eq!((old.priority, old.batch_id), (5, None));
        // A session waiting for a rate limit says so, and when it wakes.
        let mut waiting = view_json("s1");
        waiting["status"] = json!("waiting");
        waiting["wait_reason"] = json!("rate_limit");
        waiting["wake_at"] = json!("2026-12-01T08:37:45.123456Z");
        let w: SessionView = round_trip(waiting);
        assert_eq!(w.wait_reason, Some(WaitReason::RateLimit));
        assert!(w.wake_at.is_some());
        // A server that predates the fields: none.
        let mut old2 = view_json("s1");
        old2.as_object_mut().unwrap().remove("wait_reason");
        old2.as_object_mut().unwrap().remove("wake_at");
        let o: SessionView = serde_json::from_value(old2).unwrap();
        assert_eq!((o.wait_reason, o.wake_at), (None, None));

        let mut detail = view_json("s1");
        detail["children"] = json!(["c1", "c2"]);
        detail["pending_approvals"] = json!([]);
        let d: SessionDetail = round_trip(detail.clone());
        assert_eq!(d.children, ["c1", "c2"]);
        detail["status"] = json!("awaiting_approval");
        detail["pending_approvals"] = json!([
            {"tool_call_id": "call_1", "tool": "write_file",
             "arguments": {"path": "out.txt", "content": "hi"},
             "deadline": "2026-12-01T08:41:45.123456Z"},
            {"tool_call_id": "call_2", "tool": "shell", "arguments": {"command": "ls"},
             "deadline": null},
        ]);
        let d: SessionDetail = round_trip(detail.clone());
        assert_eq!(d.pending_approvals[0].tool_call_id, "call_1");
        assert_eq!(d.pending_approvals[0].arguments["path"], "out.txt");
        assert!(d.pending_approvals[1].deadline.is_none());
        // Cost and budget, when the server has them.
        let mut costed = detail.clone();
        costed["cost_usd"] = json!(0.435);
        costed["tree_cost"] = json!({"root_id": "r", "sessions": 2, "input_tokens": 10,
                                     "output_tokens": 5, "cost_usd": 0.5});
        costed["budget"] = json!({"allowance": 1000, "spent": 100, "held": 400,
                                  "children_spent": 50, "remaining": 450});
        let c: SessionDetail = round_trip(costed);
        assert_eq!(c.tree_cost.unwrap().sessions, 2);
        assert_eq!(c.budget.unwrap().remaining, 450);
        // An older server's answer, without the field, reads as holding nothing.
        detail.as_object_mut().unwrap().remove("pending_approvals");
        let old: SessionDetail = serde_json::from_value(detail).unwrap();
        assert!(old.pending_approvals.is_empty());

        let mut leaf = view_json("c1");
        leaf["children"] = json!([]);
        let mut root = view_json("s1");
        root["children"] = json!([leaf]);
        let t: TreeNode = round_trip(root);
        assert_eq!(t.children[0].session.id, "c1");

        let page: ListResponse =
            round_trip(json!({"sessions": [view_json("s1")], "next_cursor": "s1"}));
        assert_eq!(page.next_cursor.as_deref(), Some("s1"));
        let last: ListResponse = round_trip(json!({"sessions": [], "next_cursor": null}));
        assert!(last.next_cursor.is_none());
        let costed: ListResponse =
            round_trip(json!({"sessions": [], "next_cursor": null, "cost_usd": 0.25}));
        assert_eq!(costed.cost_usd, Some(0.25));
    }

    #[test]
    fn messages() {
        let m: MessagesResponse = round_trip(json!({"messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "name": "grep", "arguments": {"q": "x"}}]},
            {"role": "tool", "content": "ok", "tool_call_id": "c1", "name": "grep"},
        ]}));
        assert_eq!(m.messages.len(), 3);
    }
}
