//! Talking to a session after it started: steering messages (`inject`, `enqueue`,
//! `interrupt`, `reject`, and follow-up turns on a finished session), human decisions on
//! held tool calls, and the session tree.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use agentq_agent::schema::Role;
use agentq_core::lifecycle;
use agentq_core::protocol::{InboxPayload, SteerMessage, Strategy, WorkerSignal};
use agentq_core::{ApprovalRecorded, ListFilter, SessionRow, SessionStatus};

use crate::Scheduler;
use crate::api::{ApiResult, check_id, session_view};
use crate::error::ApiError;
use crate::request::JsonBody;

/// Largest steering message accepted.
const MAX_MESSAGE_BYTES: usize = 1_000_000;
/// Most sessions a tree answer lists.
const MAX_TREE: usize = 10_000;

fn field_str<'a>(body: &'a Value, key: &str, required: bool) -> ApiResult<Option<&'a str>> {
    match body.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(ApiError::invalid(key, "is required")),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ApiError::invalid(key, "must be a string")),
    }
}

fn only_fields(body: &Value, allowed: &[&str]) -> ApiResult<()> {
    let Value::Object(m) = body else {
        return Err(ApiError::Invalid {
            code: "invalid_body",
            field: None,
            message: "the body must be a JSON object".into(),
        });
    };
    if let Some(k) = m.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::Invalid {
            code: "unknown_field",
            field: Some(k.clone()),
            message: format!(
                "unknown field `{k}` (expected one of {})",
                allowed.join(", ")
            ),
        });
    }
    Ok(())
}

async fn get_row(s: &Scheduler, id: &str) -> ApiResult<SessionRow> {
    s.store
        .get(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("session {id} not found")))
}

/// Start a follow-up turn on a finished session.
async fn follow_up(s: &Scheduler, row: &SessionRow, content: &str) -> ApiResult<Response> {
    match s.store.follow_up(&row.id, content, None).await? {
        Some(reopened) => {
            lifecycle::enqueue_woken(
                s.store.as_ref(),
                s.queue.as_ref(),
                &reopened.id,
                &reopened.queue,
            )
            .await;
            Ok((
                StatusCode::ACCEPTED,
                Json(
                    json!({"id": reopened.id, "status": reopened.status, "delivery": "follow_up"}),
                ),
            )
                .into_response())
        }
        None => Err(ApiError::Conflict {
            code: "conflict",
            message: format!("session {} changed status; retry", row.id),
        }),
    }
}

/// `POST /v1/sessions/{id}/messages` `{"content", "strategy"}`.
pub async fn post_message(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    only_fields(&body, &["content", "strategy"])?;
    let content = field_str(&body, "content", true)?.unwrap_or_default();
    if content.trim().is_empty() {
        return Err(ApiError::invalid("content", "must not be empty"));
    }
    if content.len() > MAX_MESSAGE_BYTES {
        return Err(ApiError::TooLarge {
            field: Some("content".into()),
            message: format!("content is over {MAX_MESSAGE_BYTES} bytes"),
        });
    }
    let strategy = match field_str(&body, "strategy", false)? {
        None => Strategy::default(),
        Some(name) => Strategy::parse(name).ok_or_else(|| {
            ApiError::invalid(
                "strategy",
                format!(
                    "unknown strategy `{name}` (expected inject, enqueue, interrupt or reject)"
                ),
            )
        })?,
    };
    let row = get_row(&s, &id).await?;
    if row.status.is_terminal() {
        // A finished session takes any message as a new turn with its full history.
        return follow_up(&s, &row, content).await;
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
    let payload = InboxPayload::Steer(SteerMessage {
        content: content.to_string(),
        strategy,
    })
    .to_value()?;
    let delivered = s
        .store
        .deliver(&id, kind.as_str(), &dedupe, &payload, wake)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("session {id} not found")))?;
    if delivered.woken {
        lifecycle::enqueue_woken(s.store.as_ref(), s.queue.as_ref(), &id, &delivered.queue).await;
    }
    let signal = if strategy == Strategy::Interrupt {
        WorkerSignal::Interrupt(id.clone())
    } else {
        WorkerSignal::Wake(id.clone())
    };
    if let Err(e) = s.queue.publish_cancel(&signal.encode()).await {
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
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "status": row.status, "delivery": strategy, "seq": delivered.seq})),
    )
        .into_response())
}

/// `POST /v1/sessions/{id}/approvals` `{"tool_call_id", "approve", "reason"?}`.
pub async fn approvals(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    only_fields(&body, &["tool_call_id", "approve", "reason"])?;
    let call_id = field_str(&body, "tool_call_id", true)?.unwrap_or_default();
    let approve = match body.get("approve") {
        Some(Value::Bool(b)) => *b,
        None | Some(Value::Null) => return Err(ApiError::invalid("approve", "is required")),
        Some(_) => return Err(ApiError::invalid("approve", "must be true or false")),
    };
    let reason = field_str(&body, "reason", false)?;
    // The call must be one the session is holding: a pending call of its last turn.
    let messages = s.store.messages(&id).await?;
    let pending = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .map(|pos| {
            let answered: Vec<&str> = messages[pos + 1..]
                .iter()
                .filter_map(|m| m.tool_call_id.as_deref())
                .collect();
            messages[pos]
                .tool_calls
                .iter()
                .any(|c| c.id == call_id && !answered.contains(&c.id.as_str()))
        })
        .unwrap_or(false);
    if !pending {
        return Err(ApiError::invalid(
            "tool_call_id",
            format!("session {id} has no pending tool call `{call_id}`"),
        ));
    }
    match s
        .store
        .decide_approval(&id, call_id, approve, reason)
        .await?
    {
        ApprovalRecorded::Recorded { woken, queue } => {
            if woken {
                lifecycle::enqueue_woken(s.store.as_ref(), s.queue.as_ref(), &id, &queue).await;
            }
            Ok((
                StatusCode::OK,
                Json(json!({"id": id, "tool_call_id": call_id, "approve": approve, "resumed": woken})),
            )
                .into_response())
        }
        ApprovalRecorded::AlreadyDecided => Err(ApiError::Conflict {
            code: "already_decided",
            message: format!("tool call `{call_id}` was already decided"),
        }),
        ApprovalRecorded::Finished(status) => Err(ApiError::Conflict {
            code: "already_finished",
            message: format!("session {id} already finished ({status})"),
        }),
        ApprovalRecorded::NotFound => Err(ApiError::NotFound(format!("session {id} not found"))),
    }
}

/// `GET /v1/sessions/{id}/tree`: the session and its descendants, nested.
pub async fn tree(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    let id = check_id(id)?;
    let root = get_row(&s, &id).await?;
    let mut count = 1usize;
    let node = subtree(&s, root, &mut count).await?;
    Ok(Json(node))
}

fn subtree<'a>(
    s: &'a Scheduler,
    row: SessionRow,
    count: &'a mut usize,
) -> futures::future::BoxFuture<'a, ApiResult<Value>> {
    Box::pin(async move {
        let children = s
            .store
            .list(&ListFilter {
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
            nodes.push(subtree(s, child, count).await?);
        }
        let mut v = session_view(&row);
        if let Value::Object(m) = &mut v {
            m.insert("children".into(), Value::Array(nodes));
        }
        Ok(v)
    })
}
