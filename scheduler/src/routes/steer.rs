//! Talking to a session after it started: steering messages (`inject`, `enqueue`,
//! `interrupt`, `reject`, and follow-up turns on a finished session), human decisions on
//! held tool calls, and the session tree.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value};

use agentq_api::{
    ApprovalRequest, ApprovalResponse, Delivery, ErrorBody, PostMessage, PostMessageResponse,
    TreeNode,
};
use agentq_core::auth::Caller;
use agentq_core::lifecycle;
use agentq_core::protocol::{InboxPayload, SteerMessage, Strategy, WorkerSignal};
use agentq_core::{ListFilter, SessionRow, SessionStatus};

use crate::actions;
use crate::error::ApiError;
use crate::http::{
    ApiResult, Auth, JsonBody, check_id, decode_fields, get_row, known_fields, not_found, object,
    respond, session_view,
};
use crate::state::Scheduler;

/// Largest steering message accepted.
const MAX_MESSAGE_BYTES: usize = 1_000_000;
/// Most sessions a tree answer lists.
const MAX_TREE: usize = 10_000;

/// Start a follow-up turn on a finished session.
async fn follow_up(s: &Scheduler, row: &SessionRow, content: &str) -> ApiResult<Response> {
    match s.store.follow_up(&row.id, content, None).await? {
        Some(reopened) => {
            if reopened.held {
                s.dispatch().nudge();
            } else {
                lifecycle::enqueue_woken(
                    s.store.as_ref(),
                    s.queue.as_ref(),
                    &reopened.id,
                    &reopened.queue,
                )
                .await;
            }
            respond(
                StatusCode::ACCEPTED,
                &PostMessageResponse {
                    id: reopened.id,
                    status: reopened.status,
                    delivery: Delivery::FollowUp,
                    seq: None,
                },
            )
        }
        None => Err(ApiError::Conflict {
            code: "conflict",
            message: format!("session {} changed status; retry", row.id),
        }),
    }
}

/// A `content` over the limit is refused as such (413) before the other fields are
/// decoded, as an oversize prompt is; blank content is left to the decoding, which
/// reports it as empty.
fn check_content_size(body: &Map<String, Value>) -> ApiResult<()> {
    if let Some(Value::String(content)) = body.get("content")
        && !content.trim().is_empty()
        && content.len() > MAX_MESSAGE_BYTES
    {
        return Err(ApiError::TooLarge {
            field: Some("content".into()),
            message: format!("content is over {MAX_MESSAGE_BYTES} bytes"),
        });
    }
    Ok(())
}

/// Send a session a message
///
/// To a running session, delivered by its `strategy`; to a finished one, a follow-up turn
/// with its full history (it is queued again).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/messages",
    operation_id = "post_message",
    params(("id" = String, Path, description = "The session's id")),
    request_body = PostMessage,
    responses(
        (status = 202, description = "Taken", body = PostMessageResponse),
        (status = 409, description = "`session_busy`: `reject` and the session has not \
            finished; `conflict`: it changed status meanwhile (retry); `budget_exhausted`: \
            its tree's token budget has nothing left for a follow-up", body = ErrorBody),
    ),
)]
pub(super) async fn post_message(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let body = object(body)?;
    known_fields::<PostMessage>(&body)?;
    check_content_size(&body)?;
    let PostMessage { content, strategy } = decode_fields(body)?;
    let row = get_row(&s, &caller, &id).await?;
    if row.status.is_terminal() {
        // A finished session takes any message as a new turn with its full history.
        return follow_up(&s, &row, &content).await;
    }
    if strategy == Strategy::Reject {
        return Err(ApiError::Conflict {
            code: "session_busy",
            message: format!("session {id} is {}; the message was rejected", row.status),
        });
    }
    let kind = strategy.inbox_kind();
    // An `enqueue` waits for the end of the session; the others wake a waiting one.
    let wake: &[SessionStatus] = if strategy == Strategy::Enqueue {
        &[]
    } else {
        &[SessionStatus::Waiting]
    };
    let dedupe = format!("msg:{}", uuid::Uuid::new_v4());
    let payload = InboxPayload::Steer(SteerMessage { content, strategy });
    let delivered = s
        .store
        .deliver(&id, kind, &dedupe, &payload, wake)
        .await?
        .ok_or_else(|| not_found(&id))?;
    if delivered.woken {
        lifecycle::enqueue_woken(s.store.as_ref(), s.queue.as_ref(), &id, &delivered.queue).await;
    } else if delivered.held {
        s.dispatch().nudge();
    }
    let signal = if strategy == Strategy::Interrupt {
        WorkerSignal::Interrupt(id.clone())
    } else {
        WorkerSignal::Wake(id.clone())
    };
    if let Err(e) = s.queue.publish_signal(&signal).await {
        // The running worker reads its inbox at its next claim at the latest.
        tracing::warn!(session_id = %id, error = %e, "cannot signal the worker");
    }
    if strategy == Strategy::Enqueue {
        // It may have finished between our read and the delivery: start the turn now.
        if let Some(now) = s.store.get(&id).await?
            && now.status.is_terminal()
        {
            lifecycle::start_next_followup(s.store.as_ref(), s.queue.as_ref(), &now).await?;
        }
    }
    respond(
        StatusCode::ACCEPTED,
        &PostMessageResponse {
            id,
            status: row.status,
            delivery: Delivery::Steer(strategy),
            seq: Some(delivered.seq),
        },
    )
}

/// Decide on a held tool call
///
/// Approve or deny a call the session holds for a human (one of `pending_approvals`).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/approvals",
    operation_id = "decide_approval",
    params(("id" = String, Path, description = "The session's id")),
    request_body = ApprovalRequest,
    responses(
        (status = 200, description = "Recorded", body = ApprovalResponse),
        (status = 409, description = "`already_decided`, or `already_finished`",
            body = ErrorBody),
    ),
)]
pub(super) async fn approvals(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    respond(
        StatusCode::OK,
        &actions::decide_approval(&s, &caller, &id, body).await?,
    )
}

/// Read a session tree
///
/// The session and its descendants, nested, oldest child first (at most 10,000
/// sessions).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/tree",
    operation_id = "get_tree",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The tree", body = TreeNode)),
)]
pub(super) async fn tree(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let root = get_row(&s, &caller, &id).await?;
    let mut count = 1usize;
    let node = subtree(&s, &caller, root, &mut count).await?;
    respond(StatusCode::OK, &node)
}

fn subtree<'a>(
    s: &'a Scheduler,
    caller: &'a Caller,
    row: SessionRow,
    count: &'a mut usize,
) -> futures::future::BoxFuture<'a, ApiResult<TreeNode>> {
    Box::pin(async move {
        let children = s
            .store
            .list(&ListFilter {
                tenant: caller.tenant_filter(),
                parent_id: Some(row.id.clone()),
                limit: 10_000,
                ..Default::default()
            })
            .await?;
        let mut nodes = Vec::with_capacity(children.len());
        // Oldest first reads naturally in a tree.
        for child in children.into_iter().rev() {
            *count += 1;
            if *count > MAX_TREE {
                break;
            }
            nodes.push(subtree(s, caller, child, count).await?);
        }
        Ok(TreeNode {
            session: session_view(&row),
            children: nodes,
        })
    })
}
