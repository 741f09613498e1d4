//! Forking a session from a step: `POST /v1/sessions/{id}/fork`. The origin's spec with
//! the request's overrides goes through the checks of a new session's (`parse_session`,
//! then the tenant's policy), so a fork can ask for nothing a new session could not; the
//! store finds the step, shares the prefix and copies the tree's file list as of then.

use std::collections::BTreeSet;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use agentq_api::{ErrorBody, ForkRequest, ForkResponse};
use agentq_core::SessionRow;
use agentq_core::fork::{ForkRefusal, ForkResult, NewFork};

use crate::actions::{enqueue, limits, new_session};
use crate::error::ApiError;
use crate::http::{
    ApiResult, Auth, JsonBody, check_id, decode_object, get_row, not_found, respond,
};
use crate::request::{check_policy, parse_session};
use crate::state::Scheduler;

/// Fork a session from a step
///
/// A new queued session whose history is the first `at_iteration` iterations of this
/// one (shared with it in storage, not copied), then `message`, and whose workspace holds
/// the tree's files as of that step. No model call is made to get there: the fork's usage
/// starts at zero and its first call is iteration `at_iteration + 1`. The original is
/// never changed, and may be running (only its finished iterations can be forked).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/fork",
    operation_id = "fork_session",
    params(("id" = String, Path, description = "The session to fork (a root session)")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The fork, queued", body = ForkResponse),
        (status = 404, description = "No such session of the caller's tenant", body = ErrorBody),
        (status = 422, description = "`invalid_field`: `at_iteration` past the end of the \
            history, or inside an iteration that has not finished; an override the policy \
            refuses (named); `id` of a sub-agent", body = ErrorBody),
    ),
)]
pub(super) async fn fork(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let req: ForkRequest = decode_object(body)?;
    let origin = get_row(&s, &caller, &id).await?;
    let limits = limits(&s, &caller);
    if let Some(m) = &req.message
        && (m.is_empty() || m.len() > limits.max_prompt_bytes)
    {
        return Err(ApiError::invalid(
            "message",
            format!("must be 1 to {} bytes", limits.max_prompt_bytes),
        ));
    }
    let mut session = parse_session(spec_body(&origin, &req)?, &limits, "")?;
    // The origin's spec was held to the policy when it was made; what is asked anew is the
    // overrides (the rest is lowered to a tightened bound, as an unsent default is).
    session.sent = ForkRequest::OVERRIDES
        .iter()
        .filter(|f| sent(&req, f))
        .map(|f| (*f).to_string())
        .collect::<BTreeSet<_>>();
    check_policy(&mut session, s.cfg.policy.for_tenant(&caller.tenant), "")?;
    let mut new = new_session(session, &caller, None);
    // Beside its origin, whose history it reads in place (one shard).
    new.id = agentq_core::shard::id_beside(&id);
    new.root_id = new.id.clone();
    new.sched.held = s.dispatch().hold(&new.queue, &new.tenant, 1, None);
    new.sched.capped = s.dispatch().capped(&new.tenant, None);
    let fork = NewFork {
        new,
        origin: id.clone(),
        at_iteration: req.at_iteration,
        message: req.message.clone(),
    };
    let row = match s.store.fork_session(&fork).await? {
        ForkResult::Forked(row) => row,
        ForkResult::NotFound => return Err(not_found(&id)),
        ForkResult::Refused(r) => return Err(refusal(&r)),
    };
    tracing::info!(session_id = %row.id, forked_from = %id, at_iteration = req.at_iteration, "session forked");
    if fork.new.sched.held {
        s.dispatch().nudge();
    } else {
        enqueue(&s, &row.queue, std::slice::from_ref(&row.id)).await;
    }
    respond(
        StatusCode::CREATED,
        &ForkResponse {
            id: row.id.clone(),
            status: row.status,
            forked_from: id,
            at_iteration: req.at_iteration,
        },
    )
}

fn sent(req: &ForkRequest, field: &str) -> bool {
    match field {
        "model" => req.model.is_some(),
        "tools" => req.tools.is_some(),
        "token_budget" => req.token_budget.is_some(),
        _ => false,
    }
}

/// A `POST /v1/sessions` body for the fork: the origin's spec and queue, the overrides
/// over them.
fn spec_body(origin: &SessionRow, req: &ForkRequest) -> ApiResult<Value> {
    let mut body = serde_json::to_value(&origin.spec).map_err(|_| ApiError::Internal)?;
    let Value::Object(obj) = &mut body else {
        return Err(ApiError::Internal);
    };
    obj.retain(|_, v| !v.is_null());
    obj.insert("queue".into(), Value::String(origin.queue.clone()));
    if let Some(m) = &req.model {
        obj.insert("model".into(), Value::String(m.clone()));
    }
    if let Some(t) = &req.tools {
        obj.insert("tools".into(), serde_json::json!(t));
    }
    if let Some(b) = req.token_budget {
        obj.insert("token_budget".into(), Value::from(b));
    }
    Ok(body)
}

/// A step the store cannot fork from, named as the API names its fields.
fn refusal(r: &ForkRefusal) -> ApiError {
    let field = match r {
        ForkRefusal::NotRoot => "id",
        _ => "at_iteration",
    };
    ApiError::invalid(field, r.message())
}
