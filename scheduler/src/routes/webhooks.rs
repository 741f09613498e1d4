//! Webhook endpoints (`/v1/webhooks…`, scope `webhooks`): registering, listing, reading,
//! deleting, rotating the secret, enabling again, their deliveries and redriving dead
//! letters. What each does is in `crate::webhooks`; here are the HTTP parts.

use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;

use agentq_api::{
    CreateWebhook, DEFAULT_DELIVERIES, DEFAULT_OVERLAP_SECS, DELIVERY_PARAMS, DeliveryList,
    ErrorBody, MAX_DELIVERIES, MAX_OVERLAP_SECS, Redriven, RotateWebhook, WebhookList, WebhookView,
};
use agentq_core::webhook::DeliveryState;

use crate::error::ApiError;
use crate::http::query::params;
use crate::http::refused_body::IgnoredBody;
use crate::http::{ApiResult, Auth, JsonBody, decode_object, respond};
use crate::state::Scheduler;
use crate::webhooks::manage::{delivery_view, endpoint_of, new_endpoint, view_of};
use crate::webhooks::sign::new_salt;

/// Register a webhook endpoint
///
/// Deliveries of the chosen events (of the caller's tenant, optionally only one queue's
/// or one batch's) are POSTed to `url`, signed as the Standard Webhooks specification
/// says. The answer holds the signing `secret` (`whsec_…`): it is never shown again. A
/// URL whose host is private, loopback, link-local or reserved (and not in the operator's
/// `[webhooks] allowed_hosts`) is refused (422 naming `url`).
#[utoipa::path(
    post,
    path = "/v1/webhooks",
    operation_id = "create_webhook",
    request_body = CreateWebhook,
    responses(
        (status = 201, description = "Registered; `secret` shown this once", body = WebhookView),
        (status = 409, description = "`conflict`: the tenant has `[webhooks] max_endpoints` \
            endpoints already (`field`: `url`)", body = ErrorBody),
    ),
)]
pub(super) async fn create(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let body: CreateWebhook = decode_object(body)?;
    let new = new_endpoint(&s, &caller, body).await?;
    let max = s.cfg.webhooks.max_endpoints;
    if !s.store.create_webhook(&new, max).await? {
        return Err(ApiError::ConflictOn {
            field: "url".into(),
            message: format!("the tenant has {max} webhook endpoints already, the most allowed"),
        });
    }
    let secret = s.cfg.webhooks.signer.shown(&new.id, &new.secret_salt);
    let row = endpoint_of(&s, &caller, &new.id).await?;
    respond(StatusCode::CREATED, &view_of(&s, row, Some(secret)).await?)
}

/// List webhook endpoints
///
/// The caller's tenant's endpoints, oldest first, each as `GET /v1/webhooks/{id}` shows
/// it.
#[utoipa::path(
    get,
    path = "/v1/webhooks",
    operation_id = "list_webhooks",
    responses((status = 200, description = "The endpoints", body = WebhookList)),
)]
pub(super) async fn list(State(s): State<Scheduler>, Auth(caller): Auth) -> ApiResult<Response> {
    let rows = s.store.list_webhooks(&caller.tenant).await?;
    let mut webhooks = Vec::with_capacity(rows.len());
    for row in rows {
        webhooks.push(view_of(&s, row, None).await?);
    }
    respond(StatusCode::OK, &WebhookList { webhooks })
}

/// Get a webhook endpoint
///
/// Whether it is enabled (and why not), its last failure and success, and its
/// deliveries per state.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{id}",
    operation_id = "get_webhook",
    params(("id" = String, Path, description = "The endpoint's id")),
    responses((status = 200, description = "The endpoint", body = WebhookView)),
)]
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let row = endpoint_of(&s, &caller, &path_id(id)?).await?;
    respond(StatusCode::OK, &view_of(&s, row, None).await?)
}

/// Delete a webhook endpoint
///
/// With its deliveries, sent or not: nothing more is sent to it.
#[utoipa::path(
    delete,
    path = "/v1/webhooks/{id}",
    operation_id = "delete_webhook",
    params(("id" = String, Path, description = "The endpoint's id")),
    responses((status = 204, description = "Deleted")),
)]
pub(super) async fn delete(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let row = endpoint_of(&s, &caller, &path_id(id)?).await?;
    s.store.delete_webhook(&row.id).await?;
    Ok(axum::response::IntoResponse::into_response(
        StatusCode::NO_CONTENT,
    ))
}

/// Rotate a webhook endpoint's secret
///
/// A new secret, shown in this answer only. The previous one keeps signing too (both
/// signatures in `webhook-signature`) for `overlap_secs` (a day when absent, a week at
/// most), so receivers can switch without losing a delivery.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{id}/rotate",
    operation_id = "rotate_webhook_secret",
    params(("id" = String, Path, description = "The endpoint's id")),
    request_body = RotateWebhook,
    responses((status = 200, description = "Rotated; the new `secret` shown this once",
        body = WebhookView)),
)]
pub(super) async fn rotate(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let row = endpoint_of(&s, &caller, &path_id(id)?).await?;
    let RotateWebhook { overlap_secs } = decode_object(body)?;
    let overlap = overlap_secs.unwrap_or(DEFAULT_OVERLAP_SECS);
    if overlap > MAX_OVERLAP_SECS {
        return Err(ApiError::invalid(
            "overlap_secs",
            format!("must be from 0 to {MAX_OVERLAP_SECS}, not {overlap}"),
        ));
    }
    let salt = new_salt().map_err(|e| {
        tracing::error!(error = %e, "no randomness for a webhook secret");
        ApiError::Internal
    })?;
    let until = chrono::Duration::from_std(Duration::from_secs(overlap))
        .ok()
        .and_then(|d| Utc::now().checked_add_signed(d))
        .unwrap_or_else(Utc::now);
    if !s.store.rotate_webhook(&row.id, &salt, until).await? {
        return Err(ApiError::NotFound(format!("webhook {} not found", row.id)));
    }
    let secret = s.cfg.webhooks.signer.shown(&row.id, &salt);
    let row = endpoint_of(&s, &caller, &row.id).await?;
    respond(StatusCode::OK, &view_of(&s, row, Some(secret)).await?)
}

/// Enable a webhook endpoint
///
/// Again after it was disabled for failing continuously: new events are delivered to it
/// (redrive its dead letters to send the ones it missed). Harmless when enabled.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{id}/enable",
    operation_id = "enable_webhook",
    params(("id" = String, Path, description = "The endpoint's id")),
    request_body(content = Object, description = "`{}`: nothing to send"),
    responses((status = 200, description = "Enabled", body = WebhookView)),
)]
pub(super) async fn enable(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    _: IgnoredBody,
) -> ApiResult<Response> {
    let row = endpoint_of(&s, &caller, &path_id(id)?).await?;
    s.store.enable_webhook(&row.id).await?;
    let row = endpoint_of(&s, &caller, &row.id).await?;
    respond(StatusCode::OK, &view_of(&s, row, None).await?)
}

/// List a webhook endpoint's deliveries
///
/// Newest first: each message's state (pending, delivered, dead), attempts, last status
/// and error, and next attempt.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{id}/deliveries",
    operation_id = "list_webhook_deliveries",
    params(
        ("id" = String, Path, description = "The endpoint's id"),
        ("state" = Option<String>, Query, description = "Only `pending`, `delivered` or \
            `dead` ones."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500,
            description = "Deliveries per page (50 when absent)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous \
            page."),
    ),
    responses((status = 200, description = "A page", body = DeliveryList)),
)]
pub(super) async fn deliveries(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let row = endpoint_of(&s, &caller, &path_id(id)?).await?;
    let mut p = params(query, DELIVERY_PARAMS)?;
    let state = match p.remove("state").filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => Some(DeliveryState::parse(&v).ok_or_else(|| {
            ApiError::invalid(
                "state",
                format!("must be pending, delivered or dead, not {v:?}"),
            )
        })?),
    };
    let limit = match p.remove("limit").filter(|v| !v.is_empty()) {
        None => DEFAULT_DELIVERIES,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_DELIVERIES).contains(l))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("must be an integer between 1 and {MAX_DELIVERIES}, got {l:?}"),
                )
            })?,
    };
    let cursor = p.remove("cursor").filter(|c| !c.is_empty());
    if cursor
        .as_deref()
        .is_some_and(|c| c.len() > 128 || c.contains('\0'))
    {
        return Err(ApiError::invalid("cursor", "is not a delivery id"));
    }
    let rows = s
        .store
        .list_deliveries(&row.id, state, cursor.as_deref(), limit)
        .await?;
    let full = rows.len() == usize::try_from(limit).unwrap_or(usize::MAX);
    let next_cursor = full.then(|| rows.last().map(|d| d.id.clone())).flatten();
    let deliveries = rows.into_iter().map(delivery_view).collect();
    respond(
        StatusCode::OK,
        &DeliveryList {
            deliveries,
            next_cursor,
        },
    )
}

/// Redrive a webhook endpoint's dead letters
///
/// Every dead letter is queued again and retried for the full retry time from now. The
/// endpoint must be enabled (409 otherwise: enable it first).
#[utoipa::path(
    post,
    path = "/v1/webhooks/{id}/redrive",
    operation_id = "redrive_webhook",
    params(("id" = String, Path, description = "The endpoint's id")),
    request_body(content = Object, description = "`{}`: nothing to send"),
    responses(
        (status = 200, description = "Queued again", body = Redriven),
        (status = 409, description = "`conflict`: the endpoint is disabled", body = ErrorBody),
    ),
)]
pub(super) async fn redrive(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    _: IgnoredBody,
) -> ApiResult<Response> {
    let row = endpoint_of(&s, &caller, &path_id(id)?).await?;
    if row.disabled_at.is_some() {
        return Err(ApiError::Conflict {
            code: "conflict",
            message: format!(
                "webhook {} is disabled; enable it first (POST /v1/webhooks/{}/enable)",
                row.id, row.id
            ),
        });
    }
    let requeued = s.store.redrive_deliveries(&row.id, Utc::now()).await?;
    respond(StatusCode::OK, &Redriven { requeued })
}

/// The id of a path; an impossible one is left to the lookup's 404.
fn path_id(id: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    match id {
        Ok(Path(id)) => Ok(id),
        Err(_) => Err(ApiError::NotFound("webhook not found".into())),
    }
}
