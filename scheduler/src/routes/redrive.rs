//! Redrive: `POST /v1/sessions/{id}/retry` queues a session that failed with an error (or
//! was dead-lettered) again, to resume from its last checkpoint with a fresh allowance of
//! claims. What it already committed (model answers, tool results) is not redone.
//!
//! A parent is told of each outcome of a child once (the notification is keyed by the
//! child and its retry count), never of the same failure twice. A parent waiting for the
//! child (`spawn_agent` with `wait`) that had not run since the failure reads the child
//! again when it runs, waits for the retry and is woken by its outcome. A parent that
//! already took the failure keeps it in its history; a background child's new outcome
//! reaches it as a later message, a foreground one only wakes it (its call was answered).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use agentq_api::{ErrorBody, RetryResponse};
use agentq_core::{RetryResult, SessionRow};

use crate::error::ApiError;
use crate::http::{ApiResult, Auth, check_id, get_row, not_found, respond};
use crate::state::Scheduler;

/// Retry a failed session
///
/// Queue a session that failed with an error (or was dead-lettered) again, to resume
/// from its last checkpoint with a fresh allowance of claims. No body is read.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/retry",
    operation_id = "retry_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Queued again", body = RetryResponse),
        (status = 409, description = "`not_failed`: only a session that failed with an \
            error can be retried; `budget_exhausted`", body = ErrorBody),
    ),
)]
pub(super) async fn retry(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    // Scoped to the caller's tenant: another tenant's session is not found.
    get_row(&s, &caller, &id).await?;
    // With a dispatcher, a redriven session takes its turn like a new one (a mass retry
    // must not jump the fair share or a cap); without one it is enqueued now.
    let hold = s.dispatch().is_running();
    match s.store.retry(&id, hold).await? {
        RetryResult::Retried(row) => {
            tracing::info!(session_id = %row.id, held = row.held, "session retried");
            if requeue_retried(&s, &row).await {
                s.dispatch().nudge();
            }
            respond(
                StatusCode::OK,
                &RetryResponse {
                    id: row.id,
                    status: row.status,
                },
            )
        }
        RetryResult::NotRetryable(row) => Err(ApiError::Conflict {
            code: "not_failed",
            message: match row.finish_reason {
                Some(reason) if row.status.is_terminal() => format!(
                    "session {} is {} ({reason}); only a session that failed with an error \
                     can be retried",
                    row.id, row.status
                ),
                _ => format!(
                    "session {} is {}; only a session that failed with an error can be retried",
                    row.id, row.status
                ),
            },
        }),
        RetryResult::NotFound => Err(not_found(&id)),
    }
}

/// Put a session just retried back in line: on its queue now, or, held for the
/// dispatcher (`true`), left for the caller to nudge it (once for a whole page of them).
pub(super) async fn requeue_retried(s: &Scheduler, row: &SessionRow) -> bool {
    if !row.held {
        agentq_core::lifecycle::enqueue_woken(
            s.store.as_ref(),
            s.queue.as_ref(),
            &row.id,
            &row.queue,
        )
        .await;
    }
    row.held
}
