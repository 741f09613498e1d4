//! agentq-api: the bodies of the HTTP API as plain serde types. The scheduler decodes
//! requests into them and answers with them; the CLI client sends and reads the same
//! types, so a route and its client cannot drift apart.
//!
//! Types only: no HTTP framework and no storage. Every type names the route it belongs
//! to and says what its fields mean, and derives its OpenAPI schema (`utoipa::ToSchema`,
//! its doc comments the descriptions): the scheduler's document (`/openapi.json`, the
//! committed `api/openapi.json`) is built from them. The JSON forms are the ones deployed
//! clients already read: field names, and which fields are `null` rather than left out,
//! are part of the contract.
//!
//! Session events (`GET /v1/sessions/{id}/events`) are the agent's own events
//! ([`agentq_agent::event::AgentEvent`], tagged by [`agentq_types::protocol::EventKind`])
//! with their position added; [`events`] has what the scheduler adds itself.

mod approvals;
mod batches;
pub mod bounds;
mod budgets;
mod bulk;
pub mod de;
mod error;
pub mod events;
pub mod files;
mod forks;
mod health;
mod limits;
mod queues;
mod reports;
mod retention;
mod schedules;
mod sessions;
mod steer;
mod webhooks;

pub use approvals::{APPROVALS_PARAMS, ApprovalItem, ApprovalList, DEFAULT_APPROVALS_LIMIT};
pub use batches::{
    BatchCounts, BatchList, BatchRequestItem, BatchResult, BatchStatus, BatchView, CREATE_PARAMS,
    CreateBatch, DEFAULT_BATCH_LIST, DEFAULT_RESULTS, JSONL_CONTENT_TYPE, LIST_BATCHES_PARAMS,
    MAX_BATCH_LIST, MAX_BATCH_RUNNING, MAX_CUSTOM_ID, MAX_RESULTS, NEXT_HEADER, RESULTS_HEADER,
    RESULTS_PARAMS, ResultsEnd,
};
pub use budgets::{
    BudgetLedger, BudgetList, BudgetSet, BudgetView, SetBudget, SpendView, TenantSpend, TreeCost,
};
pub use bulk::{BULK_LIMIT, BulkCancelResponse, BulkRetryResponse, SessionFilter};
pub use error::{ErrorBody, ErrorDetail};
pub use events::{CompletionEvent, ResetEvent, SessionEvent};
pub use files::{FileContent, FileEntry, FileList};
pub use forks::{ForkRequest, ForkResponse};
pub use health::{Readiness, ReadyChecks, ReadyStatus};
pub use limits::LimitsView;
pub use queues::{CreateQueue, QueueCreated, QueueList};
pub use reports::{
    COSTS_PARAMS, COUNT_PARAMS, CostEntry, CostReport, MAX_COST_DAYS, MAX_COST_ROWS,
    MAX_SEARCH_CHARS, Operations, QueueOps, SessionCounts, WorkerView,
};
pub use retention::{RetentionRuleView, RetentionRules, SetRetention};
pub use schedules::{
    CreateSchedule, DEFAULT_CATCHUP_WINDOW_SECS, DEFAULT_SCHEDULE_LIST, FireList, FireOutcomeView,
    FireView, MAX_CATCHUP_WINDOW_SECS, MAX_CRON, MAX_EVERY_SECS, MAX_SCHEDULE_DESCRIPTION,
    MAX_SCHEDULE_LIST, MIN_EVERY_SECS, SCHEDULE_LIST_PARAMS, ScheduleList, ScheduleOverlap,
    ScheduleView,
};
pub use sessions::{
    BatchRequest, BatchResponse, CancelResponse, CreateSession, LIST_PARAMS, ListResponse,
    MessagesResponse, PendingApproval, RetryResponse, SessionDetail, SessionRef, SessionView,
    TreeNode,
};
pub use steer::{ApprovalRequest, ApprovalResponse, Delivery, PostMessage, PostMessageResponse};
pub use webhooks::{
    BatchChange, CreateWebhook, DEFAULT_DELIVERIES, DEFAULT_OVERLAP_SECS, DELIVERY_PARAMS,
    DeliveryCountsView, DeliveryList, DeliveryStateView, DeliveryView, MAX_DELIVERIES,
    MAX_OVERLAP_SECS, MAX_WEBHOOK_DESCRIPTION, MAX_WEBHOOK_URL, Redriven, RotateWebhook,
    SessionChange, SessionWaitingChange, WEBHOOK_EVENTS, WebhookFailure, WebhookList,
    WebhookPayload, WebhookStatus, WebhookView,
};
