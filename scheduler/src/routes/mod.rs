//! The HTTP API's routes. Each module serves one part of the API and imports only the
//! shared helpers of [`crate::http`], never another route module.

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::error::ApiError;
use crate::{BATCH_BODY_LIMIT, Scheduler};

mod events;
mod health;
mod sessions;
mod steer;

/// The API on `state`. Serve it with `axum::serve` (the tests bind port 0).
pub fn router(state: Scheduler) -> Router {
    // Room for a prompt and a system prompt at their limit, plus metadata and escaping;
    // the handler reports an oversize prompt by name before this limit is reached.
    let single_limit = state
        .cfg
        .max_prompt_bytes
        .saturating_mul(2)
        .saturating_add(1024 * 1024);
    Router::new()
        .route(
            "/v1/sessions",
            post(sessions::create)
                .layer(DefaultBodyLimit::max(single_limit))
                .get(sessions::list),
        )
        .route(
            "/v1/sessions/batch",
            post(sessions::create_batch)
                .layer(DefaultBodyLimit::max(BATCH_BODY_LIMIT.max(single_limit))),
        )
        .route("/v1/sessions/{id}", get(sessions::get))
        .route(
            "/v1/sessions/{id}/messages",
            get(sessions::messages).post(steer::post_message),
        )
        .route("/v1/sessions/{id}/approvals", post(steer::approvals))
        .route("/v1/sessions/{id}/tree", get(steer::tree))
        .route("/v1/sessions/{id}/cancel", post(sessions::cancel))
        .route("/v1/sessions/{id}/events", get(events::events))
        .route("/metrics", get(health::metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
