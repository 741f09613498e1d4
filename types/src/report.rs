//! What the console's summaries read from the store: sessions counted by status (for the
//! filters of a listing), tokens per tenant, model and day, and the workers holding leases.

use chrono::{DateTime, Utc};

use agentq_agent::schema::Usage;

use crate::model::SessionStatus;
use crate::wait::WaitReason;

/// How many sessions of a filter are in one status (and, waiting, for one reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCount {
    pub status: SessionStatus,
    /// What a `waiting` or `awaiting_approval` session waits for, as the API shows it;
    /// `None` for any other status.
    pub wait_reason: Option<WaitReason>,
    pub sessions: u64,
}

/// Which sessions' usage [`CostRow`]s add up.
#[derive(Debug, Clone)]
pub struct CostFilter {
    /// Only this tenant's sessions; `None`: every tenant.
    pub tenant: Option<String>,
    /// Sessions created at or after this time.
    pub since: DateTime<Utc>,
    /// Sessions created before this time.
    pub until: DateTime<Utc>,
    /// At most this many rows (the most recent days first).
    pub limit: u32,
}

/// The usage of one tenant's sessions of one model created on one day (UTC).
#[derive(Debug, Clone, PartialEq)]
pub struct CostRow {
    pub tenant: String,
    /// The model its worker called, else the one the sessions named (`None`: neither).
    pub model: Option<String>,
    /// `YYYY-MM-DD`, the UTC day the sessions were created.
    pub day: String,
    pub sessions: u64,
    pub usage: Usage,
}

/// A worker as the store knows it: the running sessions it holds leases on.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerLeases {
    /// The lease owner a worker claims as.
    pub worker: String,
    pub sessions: u64,
    /// The lease that expires first (the worker must heartbeat before it).
    pub first_expiry: Option<DateTime<Utc>>,
    /// The lease that expires last: its last heartbeat was about one lease TTL before.
    pub last_expiry: Option<DateTime<Utc>>,
}
