//! agentq-scheduler: the front door of the distributed deployment. It owns the HTTP API
//! (`/v1/sessions…`, `/v1/batches…`, `/healthz`, `/readyz`: [`router`]; its bodies are the types of
//! `agentq-api`), enqueueing (insert the row, then `XADD`), the consumer groups of the
//! configured queues (created at start so KEDA's lag scaler sees them before the first
//! session) and the sweeper that repairs a crash between insert and `XADD` ([`sweeper`]),
//! the session event streams over SSE ([`events`]), the same session routes as MCP tools
//! at `/mcp` (`routes::mcp`), API keys checked on every route (`http::auth`), the API's
//! OpenAPI document derived from its route table ([`openapi_document`], served at
//! `/openapi.json`) and `/metrics` on a listener of its own ([`metrics`]). It holds
//! no state of its own: Postgres is the truth, Redis carries the work, so any number of
//! schedulers can run side by side.

mod actions;
mod batches;
pub mod dispatch;
pub mod error;
pub mod events;
mod http;
mod inputs;
pub mod metrics;
mod queues;
pub mod request;
pub mod retention;
mod routes;
mod run;
pub mod schedules;
pub mod serve;
mod settings;
mod state;
pub mod sweeper;
pub mod webhooks;
pub mod workspace_gc;

pub use batches::MAX_UPLOAD_BYTES;
pub use error::ApiError;
pub use events::StreamLimits;
pub use http::auth::{Access, AuthSettings, is_loopback_host};
pub use http::refused_body::{DEFAULT_BODY_LIMIT, DRAIN_BYTES};
pub use queues::QueueRegistry;
pub use request::LIST_MAX_BYTES;
pub use routes::openapi::{
    SECURITY_SCHEME, STREAM_EVENT, WEBHOOK_HEADERS, document as openapi_document,
    document_json as openapi_json, sse_events, webhook_bodies,
};
pub use routes::{body_limit, metrics_router, route_table, router};
pub use run::{RunError, run};
pub use serve::{ServeLimits, serve};
pub use settings::{LimitsAdmin, SchedulerSettings};
pub use state::{BATCH_BODY_LIMIT, Scheduler};
