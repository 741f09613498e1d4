//! Batches as objects, scoped by tenant like sessions: `POST /v1/batches` creates one
//! from a JSON body ([`CreateBatch`]) or a JSON Lines upload (one [`BatchRequestItem`] a
//! line, the options in the query: [`CREATE_PARAMS`]); `GET /v1/batches/{id}` shows it
//! ([`BatchView`]: counts by status and finish reason, tokens, cost, times, the time
//! left); `GET /v1/batches` lists a tenant's ([`BatchList`]); `POST
//! /v1/batches/{id}/cancel` cancels what has not finished; `GET /v1/batches/{id}/results`
//! answers the finished items as JSON Lines ([`BatchResult`]), a page at a time
//! ([`NEXT_HEADER`], [`RESULTS_HEADER`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use agentq_agent::schema::Usage;
use agentq_agent::spec::ExitReason;
use agentq_types::model::SessionStatus;

use crate::sessions::CreateSession;

/// The content type of a JSON Lines upload and of the results.
pub const JSONL_CONTENT_TYPE: &str = "application/x-ndjson";

/// The query parameters of `POST /v1/batches` (a JSON Lines upload's options; a JSON body
/// carries them as fields): `max_running`, and `metadata` as a JSON object.
pub const CREATE_PARAMS: &[&str] = &["max_running", "metadata"];
/// The query parameters of `GET /v1/batches`.
pub const LIST_BATCHES_PARAMS: &[&str] = &["limit", "cursor"];
/// The query parameters of `GET /v1/batches/{id}/results`.
pub const RESULTS_PARAMS: &[&str] = &["after", "limit"];

/// Longest `custom_id` (bytes).
pub const MAX_CUSTOM_ID: usize = 256;
/// Largest `max_running` of a batch.
pub const MAX_BATCH_RUNNING: u32 = 1_000_000;
/// Batches a page of `GET /v1/batches` holds when `limit` is absent, and at most.
pub const DEFAULT_BATCH_LIST: u32 = 20;
pub const MAX_BATCH_LIST: u32 = 100;
/// Results a page of `GET /v1/batches/{id}/results` holds when `limit` is absent, and at
/// most (fewer when they hold more than 16 MiB of text).
pub const DEFAULT_RESULTS: u32 = 1_000;
pub const MAX_RESULTS: u32 = 10_000;

/// Response header of the results: the `after` of the next page, present when more
/// results may follow.
pub const NEXT_HEADER: &str = "agentq-next";
/// Response header of the results: why the page ends, one of [`ResultsEnd`].
pub const RESULTS_HEADER: &str = "agentq-results";

/// `POST /v1/batches` with a JSON body. Any other field is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CreateBatch {
    /// The sessions: 1 to `max_batch` (10,000 by default). A larger batch is uploaded as
    /// JSON Lines.
    #[schema(min_items = 1)]
    pub requests: Vec<BatchRequestItem>,
    /// At most this many of its sessions running (or buffered for a worker) at once: 1 to
    /// 1,000,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_running: Option<u32>,
    /// Kept with the batch and shown with it: a JSON object of at most 64 KiB.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
}

/// One item of a batch (an element of `requests`, or a line of an upload): a session
/// request as `POST /v1/sessions` takes it, checked the same way, and the client's name
/// for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchRequestItem {
    /// The client's name of the item, given back with its result: a string of 1 to 256
    /// bytes, unique within the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256)]
    pub custom_id: Option<String>,
    #[serde(flatten)]
    pub request: CreateSession,
}

/// Where a batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    /// Some of its sessions have not finished.
    InProgress,
    /// Every session has finished (completed, failed or cancelled).
    Completed,
    /// Cancelled; some sessions have not stopped yet.
    Cancelling,
    /// Cancelled, and every session has finished.
    Cancelled,
}

/// A batch's sessions per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchCounts {
    pub queued: u64,
    pub running: u64,
    pub waiting: u64,
    pub awaiting_approval: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
}

/// `GET /v1/batches/{id}`, the answer to its creation (201) and its cancel: what the
/// batch's sessions did so far, counted from them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchView {
    pub id: String,
    pub status: BatchStatus,
    /// Its sessions.
    pub total: u64,
    pub counts: BatchCounts,
    /// Finished sessions per finish reason (`stop`, `error`, `max_iterations`, …); only
    /// the reasons some session ended with.
    pub finish_reasons: BTreeMap<String, u64>,
    /// The tokens its sessions used.
    pub usage: Usage,
    /// Their cost at the configured prices; `null` when none of them has a price.
    pub cost_usd: Option<f64>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub max_running: Option<u32>,
    pub created_at: DateTime<Utc>,
    /// When its first session started.
    pub started_at: Option<DateTime<Utc>>,
    /// When its last session finished, once every one has.
    pub finished_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
    /// Seconds until the rest finish at the rate the finished ones did since the first
    /// start; `null` before one finished and once all have.
    pub eta_secs: Option<u64>,
}

/// `GET /v1/batches?limit=&cursor=`: the caller's batches, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchList {
    pub batches: Vec<BatchView>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub next_cursor: Option<String>,
}

/// One line of `GET /v1/batches/{id}/results`: a finished item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchResult {
    /// The item's `custom_id`; `null` when it had none.
    pub custom_id: Option<String>,
    /// Its session.
    pub id: String,
    pub status: SessionStatus,
    pub finish_reason: Option<ExitReason>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub usage: Usage,
}

/// Why a page of results ends ([`RESULTS_HEADER`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultsEnd {
    /// Every item after the cursor has finished and is in the page: the batch's results
    /// are all read.
    Complete,
    /// The page is full: ask for the next at once (`after` = [`NEXT_HEADER`]).
    More,
    /// The next item in id order has not finished: ask again later (`after` =
    /// [`NEXT_HEADER`], absent when no result was read yet).
    Waiting,
}

impl ResultsEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            ResultsEnd::Complete => "complete",
            ResultsEnd::More => "more",
            ResultsEnd::Waiting => "waiting",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "complete" => ResultsEnd::Complete,
            "more" => ResultsEnd::More,
            "waiting" => ResultsEnd::Waiting,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::de::struct_fields;

    #[test]
    fn a_batch_body_and_its_items() {
        let b: CreateBatch = serde_json::from_value(json!({
            "requests": [{"prompt": "a", "custom_id": "c-1", "queue": "bulk"}, {"prompt": "b"}],
            "max_running": 5, "metadata": {"team": "x"}}))
        .unwrap();
        assert_eq!(b.requests[0].custom_id.as_deref(), Some("c-1"));
        assert_eq!(b.requests[0].request.spec.prompt, "a");
        assert_eq!(b.requests[0].request.queue.as_deref(), Some("bulk"));
        assert_eq!(b.requests[1].custom_id, None);
        assert_eq!(b.max_running, Some(5));
        assert_eq!(
            struct_fields::<CreateBatch>(),
            ["requests", "max_running", "metadata"]
        );
        let item = serde_json::to_value(&b.requests[1]).unwrap();
        assert_eq!(item["prompt"], "b");
        assert!(item.get("custom_id").is_none());
    }

    #[test]
    fn a_view_and_a_result_keep_their_shape() {
        let v = BatchView {
            id: "b1".into(),
            status: BatchStatus::InProgress,
            total: 3,
            counts: BatchCounts {
                completed: 1,
                running: 1,
                queued: 1,
                ..BatchCounts::default()
            },
            finish_reasons: BTreeMap::from([("stop".to_string(), 1)]),
            usage: Usage::default(),
            cost_usd: None,
            metadata: Map::new(),
            max_running: None,
            created_at: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            started_at: None,
            finished_at: None,
            cancelled_at: None,
            eta_secs: Some(12),
        };
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["status"], "in_progress");
        assert_eq!(j["counts"]["awaiting_approval"], 0);
        assert_eq!(j["finish_reasons"], json!({"stop": 1}));
        assert!(j["finished_at"].is_null() && j["cost_usd"].is_null());
        assert_eq!(serde_json::from_value::<BatchView>(j).unwrap(), v);
        let r: BatchResult = serde_json::from_value(json!({
            "custom_id": null, "id": "s1", "status": "failed", "finish_reason": "error",
            "result": null, "error": "boom", "usage": {"input_tokens": 3}}))
        .unwrap();
        assert_eq!(r.status, SessionStatus::Failed);
        assert_eq!(r.usage.input_tokens, 3);
        for end in [ResultsEnd::Complete, ResultsEnd::More, ResultsEnd::Waiting] {
            assert_eq!(ResultsEnd::parse(end.as_str()), Some(end));
        }
    }
}
