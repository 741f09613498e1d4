//! `GET /v1/sessions/{id}/events`: the session's events as server-sent events, resumable
//! with `Last-Event-ID` (the relay itself is [`crate::events`]).

use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::events::{LastId, follow};
use crate::http::{ApiResult, Auth, check_id, get_row};
use crate::state::Scheduler;

/// Comments that keep an idle connection open through proxies.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Follow a session's events
///
/// Server-sent events: what is stored is replayed, then the stream follows the session
/// live until `session_completed`. Each event's `id:` resumes the stream
/// (`Last-Event-ID`), its `event:` is the event's `type` and its `data:` the event's JSON
/// with `seq`, the history position it belongs to. `event: reset` (no `id`) tells the
/// client to discard what it received for positions `>= seq`: a step is being redone by
/// another worker.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    operation_id = "stream_events",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this \
            event (`<ms>-<n>` or `t-<seq>-<k>`)."),
    ),
    responses((status = 200, description = "The event stream", content_type = "text/event-stream",
        body = String)),
)]
pub(super) async fn events(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let last = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(v.to_str().ok().and_then(LastId::parse).ok_or_else(|| {
            ApiError::invalid(
                "Last-Event-ID",
                "is not an event id of this API (`<ms>-<n>` or `t-<seq>-<k>`)",
            )
        })?),
    };
    get_row(&s, &caller, &id).await?;
    let permit = s.streams.acquire(&caller)?;
    let stream = follow(
        s.store.clone(),
        s.queue.clone(),
        s.hub.clone(),
        id,
        last,
        s.draining.clone(),
        permit,
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}
