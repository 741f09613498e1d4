//! The console's summaries: `GET /v1/sessions/counts` (a listing's filter counted per
//! status), `GET /v1/admin/costs` (tokens and dollars per tenant, model and day) and
//! `GET /v1/admin/operations` (queues, waits and workers).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Longest `q` (text search) of `GET /v1/sessions` and its counts, in characters.
pub const MAX_SEARCH_CHARS: usize = 200;

/// The query parameters `GET /v1/sessions/counts` accepts: the filters of
/// `GET /v1/sessions` ([`crate::LIST_PARAMS`]), without its paging (`limit`, `cursor`).
pub const COUNT_PARAMS: &[&str] = crate::sessions::LIST_PARAMS.split_at(2).1;

/// `GET /v1/sessions/counts`: how many sessions the same filter of `GET /v1/sessions`
/// selects, per status and, waiting, per reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionCounts {
    /// Every session counted.
    pub total: u64,
    /// Sessions per status (`queued`, `running`, …); a status without any is left out.
    pub by_status: BTreeMap<String, u64>,
    /// Sessions waiting (`waiting` or `awaiting_approval`) per reason (`children`,
    /// `approval`, `rate_limit`, `budget`); a reason without any is left out.
    pub by_wait_reason: BTreeMap<String, u64>,
    /// `false` when a `metadata` or cost condition made the count read rows, and it
    /// stopped at the bound on rows read: the counts are then of the newest sessions
    /// only, a lower bound.
    pub complete: bool,
}

/// The query parameters `GET /v1/admin/costs` accepts.
pub const COSTS_PARAMS: &[&str] = &["since", "until", "tenant"];

/// The longest range of `GET /v1/admin/costs`, in days.
pub const MAX_COST_DAYS: i64 = 366;

/// The most rows one `GET /v1/admin/costs` answers.
pub const MAX_COST_ROWS: u32 = 10_000;

/// `GET /v1/admin/costs`: usage and its cost per tenant, model and day.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostReport {
    /// Sessions created at or after this time are counted.
    pub since: DateTime<Utc>,
    /// Sessions created before this time are counted.
    pub until: DateTime<Utc>,
    /// The most recent day first; within a day by tenant, then model.
    pub rows: Vec<CostEntry>,
    /// What the rows cost together (those with a price).
    pub cost_usd: f64,
    /// `true` when there were more rows than one answer holds (10,000): narrow the range
    /// or name a `tenant`.
    pub truncated: bool,
}

/// The sessions of one tenant and model created on one day (UTC): what they used, their
/// sub-agents each counted as sessions of their own, every attempt of a retried one
/// included.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CostEntry {
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    pub tenant: String,
    /// The model the worker called, else the one the sessions named; `null`: neither.
    pub model: Option<String>,
    pub sessions: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    pub reasoning_tokens: u64,
    pub web_search_requests: u64,
    /// At the configured prices; `null` when the model has no price.
    pub cost_usd: Option<f64>,
}

/// `GET /v1/admin/operations`: what waits where, and who works on it. The rate limiter's
/// state is `GET /v1/admin/limits`, the tenants' budgets `GET /v1/admin/budgets`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Operations {
    pub queues: Vec<QueueOps>,
    /// Sessions waiting (`waiting` or `awaiting_approval`) per reason, every reason named
    /// (0 when none waits for it).
    pub waiting: BTreeMap<String, u64>,
    /// The workers holding leases on running sessions, by name.
    pub workers: Vec<WorkerView>,
    /// `true` when more workers hold leases than the answer lists (1,000).
    pub workers_truncated: bool,
}

/// One queue's stream and the sessions the dispatcher holds back from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueueOps {
    pub name: String,
    /// What waits for a worker: entries not yet delivered plus those delivered and not
    /// acknowledged; `null` when the queue cannot be read now (see `error`).
    pub length: Option<u64>,
    /// Entries delivered to a worker and not acknowledged.
    pub pending: Option<u64>,
    /// Entries not yet delivered; `null` when the stream cannot tell.
    pub lag: Option<u64>,
    /// Queued sessions the dispatcher holds back (a batch's `max_running`, a tenant's
    /// cap): not in the stream until released.
    pub held: u64,
    /// Why the stream could not be read, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A worker as the store knows it: the lease owner of running sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerView {
    /// The name the worker claims leases as.
    pub worker: String,
    /// Running sessions it holds a lease on.
    pub sessions: u64,
    /// When its first lease expires unless it heartbeats.
    pub first_lease_expiry: Option<DateTime<Utc>>,
    /// When its last lease expires: its latest heartbeat was one lease TTL before.
    pub last_lease_expiry: Option<DateTime<Utc>>,
}
