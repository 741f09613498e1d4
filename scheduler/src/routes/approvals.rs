//! `GET /v1/approvals`: the calls the caller's sessions hold for a human decision, across
//! sessions (what it reads is in [`crate::actions::list_approvals`], shared with the MCP
//! tool `list_approvals`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use agentq_api::bounds::MAX_APPROVALS_LIMIT;
use agentq_api::{APPROVALS_PARAMS, ApprovalList, DEFAULT_APPROVALS_LIMIT, ErrorBody};

use crate::actions::{self, ApprovalQuery};
use crate::error::ApiError;
use crate::http::query::params;
use crate::http::{ApiResult, Auth, MAX_ID_LEN, respond};
use crate::state::Scheduler;

/// List pending approvals
///
/// The tool calls the caller's sessions hold for a decision
/// (`POST /v1/sessions/{id}/approvals`), oldest session first and each session's calls in
/// the order the model made them, with their arguments and deadlines. A page looks at
/// 500 sessions at most: with `tool` it may hold fewer than `limit` with a `next_cursor`.
#[utoipa::path(
    get,
    path = "/v1/approvals",
    operation_id = "list_approvals",
    params(
        ("queue" = Option<String>, Query, description = "Only sessions of this queue."),
        ("batch_id" = Option<String>, Query, description = "Only sessions of this batch."),
        ("tool" = Option<String>, Query, description = "Only calls of this tool (its exact \
            name)."),
        ("session_id" = Option<String>, Query, description = "Only this session's calls \
            (404 when it is not one of the caller's)."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 100,
            description = "Approvals per page (50 when absent)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous \
            page (opaque)."),
    ),
    responses(
        (status = 200, description = "A page", body = ApprovalList),
        (status = 404, description = "`not_found`: `session_id` names no session of the \
            caller's", body = ErrorBody),
    ),
)]
pub(super) async fn list(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let mut p = params(query, APPROVALS_PARAMS)?;
    let mut take = |k: &str| p.remove(k).filter(|v| !v.is_empty());
    let q = ApprovalQuery {
        queue: take("queue"),
        batch_id: take("batch_id"),
        tool: take("tool"),
        session_id: take("session_id"),
        cursor: take("cursor"),
        limit: match take("limit") {
            None => DEFAULT_APPROVALS_LIMIT as usize,
            Some(l) => l
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=MAX_APPROVALS_LIMIT).contains(l))
                .map(|l| l as usize)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "limit",
                        format!(
                            "must be an integer between 1 and {MAX_APPROVALS_LIMIT}, got {l:?}"
                        ),
                    )
                })?,
        },
    };
    for (field, v) in [
        ("queue", &q.queue),
        ("batch_id", &q.batch_id),
        ("tool", &q.tool),
        ("session_id", &q.session_id),
    ] {
        if v.as_ref().is_some_and(|v| v.len() > MAX_ID_LEN) {
            return Err(ApiError::invalid(
                field,
                format!("is over {MAX_ID_LEN} bytes"),
            ));
        }
    }
    respond(
        StatusCode::OK,
        &actions::list_approvals(&s, &caller, &q).await?,
    )
}
