//! Retention rules (admin): `GET /v1/admin/retention` (the rules in force, configured and
//! stored), `PUT`/`DELETE /v1/admin/retention/tenants/{tenant}` and
//! `/v1/admin/retention/queues/{queue}` (a stored rule, replacing the configured override
//! of that tenant or queue).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /v1/admin/retention/tenants/{tenant}` or `…/queues/{queue}` (admin): the
/// finished trees of that tenant or queue go `days` after their last session finished,
/// keeping `keep` of them. Any other field is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRetention {
    /// Days a finished tree is kept: 1 to 36,500.
    #[schema(minimum = 1, maximum = 36500)]
    pub days: u32,
    /// `none` (everything goes) or `result` (the session rows and their final answers
    /// stay); `none` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<String>,
}

/// One tenant's or one queue's rule in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RetentionRuleView {
    /// `tenant` or `queue`.
    pub kind: String,
    /// The tenant or queue.
    pub name: String,
    /// Days a finished tree is kept; `null`: kept (a configured override without days
    /// and no global days).
    pub days: Option<u32>,
    /// `none` or `result`.
    pub keep: String,
    /// `stored` (set through this API) or `config` (`[retention.tenants.*]`,
    /// `[retention.queues.*]`).
    pub source: String,
    /// When a stored rule was set.
    pub updated_at: Option<DateTime<Utc>>,
}

/// `GET /v1/admin/retention`: the global rule and every tenant's and queue's in force.
/// A tenant's rule wins over a queue's, and a queue's over the global one; a stored rule
/// replaces the configured one of its tenant or queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RetentionRules {
    /// `[retention] days`: `null` keeps the trees no other rule covers.
    pub days: Option<u32>,
    /// `[retention] keep`.
    pub keep: String,
    pub tenants: Vec<RetentionRuleView>,
    pub queues: Vec<RetentionRuleView>,
}
