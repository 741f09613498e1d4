//! What every route shares: the JSON body extractor and decoding ([`body`]), the session
//! views ([`view`]), query strings ([`query`]), the id check, and answering with an API type. Routes import from
//! here, never from each other.

use axum::Json;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use agentq_core::SessionRow;
use agentq_core::auth::Caller;

use crate::error::ApiError;
use crate::state::Scheduler;

pub mod auth;
pub mod batch_body;
pub mod body;
pub mod cost;
pub mod decode;
pub mod query;
pub mod refused_body;
pub mod view;

pub use auth::Auth;
pub use body::{JsonBody, RawJson, decode_fields, decode_object, known_fields, object};
pub use view::{pending_approval, session_view, wait_reason};

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// Session ids are UUIDs; anything much longer cannot exist.
pub const MAX_ID_LEN: usize = 128;

/// The session id of a path, or a 404 that repeats it (shortened); one with a NUL
/// character is a 422 naming `id`, as in a body.
pub(crate) fn check_id(id: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    if let Ok(Path(id)) = &id {
        body::no_nul("id", id)?;
    }
    match id {
        Ok(Path(id)) if !id.is_empty() && id.len() <= MAX_ID_LEN => Ok(id),
        Ok(Path(id)) => Err(ApiError::NotFound(format!(
            "session {} not found",
            id.chars().take(MAX_ID_LEN).collect::<String>()
        ))),
        Err(_) => Err(ApiError::NotFound("session not found".into())),
    }
}

/// The session's row, or a 404 — the same 404 for another tenant's session as for a
/// missing one, so that ids of other tenants cannot be probed.
pub(crate) async fn get_row(s: &Scheduler, caller: &Caller, id: &str) -> ApiResult<SessionRow> {
    s.store
        .get(id)
        .await?
        .filter(|row| caller.sees(&row.tenant))
        .ok_or_else(|| not_found(id))
}

pub(crate) fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("session {id} not found"))
}

/// `status` with `body` as JSON.
///
/// Encoded through a `serde_json::Value`, as every answer of the API is: objects go out
/// with their keys sorted and an `f32` (a temperature) is written through its `f64` value
/// (`0.699999988079071`, not `0.7`), so clients get the same bytes whichever type an
/// answer is built from.
pub(crate) fn respond<T: Serialize>(status: StatusCode, body: &T) -> ApiResult<Response> {
    let value = serde_json::to_value(body).map_err(|e| {
        tracing::error!(error = %e, "cannot encode a response");
        ApiError::Internal
    })?;
    Ok((status, Json(value)).into_response())
}
