//! Human decisions on held tool calls: the calls a session holds
//! (`GET /v1/sessions/{id}`'s `pending_approvals`, the MCP tool `list_approvals`) and a
//! decision on one (`POST /v1/sessions/{id}/approvals`, `decide_approval`).

use serde_json::{Map, Value};

use agentq_agent::schema::Role;
use agentq_api::bounds::MAX_EDITED_ARGUMENTS_BYTES;
use agentq_api::{ApprovalRequest, ApprovalResponse, PendingApproval};
use agentq_core::auth::Caller;
use agentq_core::lifecycle;
use agentq_core::{ApprovalRecorded, SessionRow};

use crate::error::ApiError;
use crate::http::{ApiResult, decode_object, get_row, not_found, pending_approval};
use crate::state::Scheduler;

/// The calls `row` holds for a decision (none unless its row shows it may hold some).
pub(crate) async fn pending_approvals(
    s: &Scheduler,
    row: &SessionRow,
) -> ApiResult<Vec<PendingApproval>> {
    // Only a session whose row shows held calls costs a read for them.
    if !row.may_hold_calls() {
        return Ok(Vec::new());
    }
    let held = s.store.pending_approvals(&row.id, &row.held_calls).await?;
    Ok(held.into_iter().map(|c| pending_approval(row, c)).collect())
}

/// Whether `call_id` is a call the session is holding: a pending call of its last turn.
async fn is_pending(s: &Scheduler, id: &str, call_id: &str) -> ApiResult<bool> {
    let messages = s.store.messages(id).await?;
    Ok(messages
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
        .unwrap_or(false))
}

/// Edited arguments as stored (their JSON text), held to
/// [`MAX_EDITED_ARGUMENTS_BYTES`] (413 naming `arguments` past it).
fn edited_text(arguments: Option<Map<String, Value>>) -> ApiResult<Option<String>> {
    let Some(arguments) = arguments else {
        return Ok(None);
    };
    let text = serde_json::to_string(&arguments).map_err(|_| ApiError::Internal)?;
    if text.len() > MAX_EDITED_ARGUMENTS_BYTES {
        return Err(ApiError::TooLarge {
            field: Some("arguments".into()),
            message: format!("arguments are over {MAX_EDITED_ARGUMENTS_BYTES} bytes"),
        });
    }
    Ok(Some(text))
}

/// Record the decision `body` (an [`ApprovalRequest`]) on a call session `id` of the
/// caller's tenant holds, and wake the session.
pub(crate) async fn decide_approval(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
    body: Value,
) -> ApiResult<ApprovalResponse> {
    get_row(s, caller, id).await?;
    let req: ApprovalRequest = decode_object(body)?;
    req.check()
        .map_err(|v| ApiError::invalid(v.field, v.message))?;
    let ApprovalRequest {
        tool_call_id,
        approve,
        reason,
        arguments,
    } = req;
    let arguments = edited_text(arguments)?;
    if !is_pending(s, id, &tool_call_id).await? {
        return Err(ApiError::invalid(
            "tool_call_id",
            format!("session {id} has no pending tool call `{tool_call_id}`"),
        ));
    }
    match s
        .store
        .decide_approval(
            id,
            &tool_call_id,
            approve,
            reason.as_deref(),
            arguments.as_deref(),
        )
        .await?
    {
        ApprovalRecorded::Recorded { woken, held, queue } => {
            if woken {
                lifecycle::enqueue_woken(s.store.as_ref(), s.queue.as_ref(), id, &queue).await;
            } else if held {
                s.dispatch().nudge();
            }
            Ok(ApprovalResponse {
                id: id.to_string(),
                tool_call_id,
                approve,
                resumed: woken,
            })
        }
        ApprovalRecorded::AlreadyDecided => Err(ApiError::Conflict {
            code: "already_decided",
            message: format!("tool call `{tool_call_id}` was already decided"),
        }),
        ApprovalRecorded::Finished(status) => Err(ApiError::Conflict {
            code: "already_finished",
            message: format!("session {id} already finished ({status})"),
        }),
        ApprovalRecorded::NotFound => Err(not_found(id)),
    }
}
