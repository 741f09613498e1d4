//! Acting on many sessions by a filter: `POST /v1/sessions/cancel` (a batch's unfinished
//! sessions) and `POST /v1/sessions/retry` (sessions that failed with an error, by batch,
//! error text and finish time). One call examines at most `limit` of the caller's
//! sessions (newest first) and answers with a cursor to the rest, so its cost is bounded
//! however large the batch; each session is cancelled or redriven exactly as its own
//! route does it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use agentq_agent::spec::ExitReason;
use agentq_api::{
    BULK_LIMIT, BulkCancelResponse, BulkRetryResponse, CancelResponse, RetryResponse, SessionFilter,
};
use agentq_core::auth::Caller;
use agentq_core::{CancelResult, ListFilter, RetryResult, SessionRow, SessionStatus};

use crate::error::ApiError;
use crate::http::{ApiResult, Auth, JsonBody, MAX_ID_LEN, decode_object, respond};
use crate::state::Scheduler;

/// The filter of a body, checked: its store filter (the caller's tenant, the batch,
/// `status`) and the number of sessions to examine.
fn checked(
    f: &SessionFilter,
    caller: &Caller,
    status: Option<SessionStatus>,
) -> ApiResult<(ListFilter, u32)> {
    for (field, v) in [("batch_id", &f.batch_id), ("cursor", &f.cursor)] {
        if v.as_ref()
            .is_some_and(|v| v.is_empty() || v.len() > MAX_ID_LEN)
        {
            return Err(ApiError::invalid(field, "is not an id"));
        }
    }
    let limit = match f.limit {
        None => BULK_LIMIT,
        Some(l) if (1..=BULK_LIMIT).contains(&l) => l,
        Some(l) => {
            return Err(ApiError::invalid(
                "limit",
                format!("must be an integer between 1 and {BULK_LIMIT}, got {l}"),
            ));
        }
    };
    let filter = ListFilter {
        tenant: caller.tenant_filter(),
        status,
        batch_id: f.batch_id.clone(),
        // One more than asked tells whether more may match.
        limit: limit.saturating_add(1),
        cursor: f.cursor.clone(),
        ..Default::default()
    };
    Ok((filter, limit))
}

/// The rows to act on (at most `limit`) and the cursor past them when more remain.
async fn page(
    s: &Scheduler,
    filter: &ListFilter,
    limit: u32,
) -> ApiResult<(Vec<SessionRow>, Option<String>)> {
    let mut rows = s.store.list(filter).await?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.id.clone())
    } else {
        None
    };
    Ok((rows, next))
}

/// Cancel a batch
///
/// The unfinished sessions of `batch_id` (required; `error_contains` and
/// `finished_since` are refused), at most `limit` examined per call, newest first.
#[utoipa::path(
    post,
    path = "/v1/sessions/cancel",
    operation_id = "cancel_sessions",
    request_body = SessionFilter,
    responses((status = 200, description = "The sessions cancelled or asked to stop, and \
        where to continue", body = BulkCancelResponse)),
)]
pub(super) async fn cancel(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let f: SessionFilter = decode_object(body)?;
    if f.batch_id.is_none() {
        return Err(ApiError::invalid(
            "batch_id",
            "is required: cancel takes the batch to cancel",
        ));
    }
    for (field, given) in [
        ("error_contains", f.error_contains.is_some()),
        ("finished_since", f.finished_since.is_some()),
        ("status", f.status.is_some()),
    ] {
        if given {
            return Err(ApiError::invalid(
                field,
                "applies to retry only: cancel acts on unfinished sessions",
            ));
        }
    }
    let (filter, limit) = checked(&f, &caller, None)?;
    let (rows, next_cursor) = page(&s, &filter, limit).await?;
    let mut sessions = Vec::new();
    for row in rows.iter().filter(|r| !r.status.is_terminal()) {
        let result = s.store.request_cancel(&row.id).await?;
        s.announce_cancel(&result).await;
        let (row, requested) = match result {
            CancelResult::CancelledNow(row) => (row, false),
            CancelResult::Requested(row) => (row, true),
            // It finished meanwhile, or went: nothing to cancel.
            CancelResult::AlreadyFinished(_) | CancelResult::NotFound => continue,
        };
        s.cancel_descendants(&row.id).await;
        sessions.push(CancelResponse {
            id: row.id,
            status: row.status,
            cancel_requested: requested,
        });
    }
    tracing::info!(
        batch_id = f.batch_id.as_deref().unwrap_or_default(),
        cancelled = sessions.len(),
        more = next_cursor.is_some(),
        "batch cancel"
    );
    respond(
        StatusCode::OK,
        &BulkCancelResponse {
            sessions,
            next_cursor,
        },
    )
}

/// Whether a failed session is one the filter's retry asks for.
fn retryable(row: &SessionRow, f: &SessionFilter) -> bool {
    row.finish_reason == Some(ExitReason::Error)
        && f.finished_since
            .is_none_or(|t| row.finished_at.is_some_and(|done| done >= t))
        && f.error_contains
            .as_deref()
            .is_none_or(|text| row.error.as_deref().is_some_and(|e| e.contains(text)))
}

/// Retry failed sessions
///
/// Queue again, from their last checkpoint, the caller's sessions that failed with an
/// error (`status` may only be `failed`) and match every field given, at most `limit` examined per call, newest first.
#[utoipa::path(
    post,
    path = "/v1/sessions/retry",
    operation_id = "retry_sessions",
    request_body = SessionFilter,
    responses((status = 200, description = "The sessions queued again, and where to \
        continue", body = BulkRetryResponse)),
)]
pub(super) async fn retry(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let f: SessionFilter = decode_object(body)?;
    // What a retry can redrive: a session that failed (with an error). Any other status
    // would match nothing, which a caller would read as "nothing to retry".
    if let Some(st) = f.status
        && st != SessionStatus::Failed
    {
        return Err(ApiError::invalid(
            "status",
            format!("only failed sessions can be retried, not {st}"),
        ));
    }
    let (filter, limit) = checked(&f, &caller, Some(SessionStatus::Failed))?;
    let (rows, next_cursor) = page(&s, &filter, limit).await?;
    // As for one session: with a dispatcher, a redriven session takes its turn like a
    // new one (a mass retry must not jump the fair share or a cap).
    let hold = s.dispatch().is_running();
    let mut sessions = Vec::new();
    let mut held = false;
    for row in rows.iter().filter(|r| retryable(r, &f)) {
        let RetryResult::Retried(row) = s.store.retry(&row.id, hold).await? else {
            // Retried or changed by someone else meanwhile.
            continue;
        };
        held |= super::redrive::requeue_retried(&s, &row).await;
        sessions.push(RetryResponse {
            id: row.id,
            status: row.status,
        });
    }
    if held {
        s.dispatch().nudge();
    }
    tracing::info!(
        batch_id = f.batch_id.as_deref().unwrap_or_default(),
        retried = sessions.len(),
        more = next_cursor.is_some(),
        "bulk retry"
    );
    respond(
        StatusCode::OK,
        &BulkRetryResponse {
            sessions,
            next_cursor,
        },
    )
}
