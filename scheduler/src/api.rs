//! The HTTP API: routes, handlers and the JSON views of sessions.
//!
//! Enqueue is "insert the row, then `XADD`, then mark the row enqueued". The row is the
//! commitment: once it is in Postgres the request succeeds, even if Redis is down at that
//! moment — the sweeper adds the missing entry later.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};

use agentq_core::{CancelResult, EnqueueReason, ListFilter, NewSession, SessionRow, SessionStatus};

use crate::error::ApiError;
use crate::request::{JsonBody, Limits, ListQuery, parse_batch, parse_session};
use crate::{BATCH_BODY_LIMIT, Scheduler};

pub const DEFAULT_LIST_LIMIT: u32 = 50;
pub const MAX_LIST_LIMIT: u32 = 1000;
/// Children listed in a session's view.
const MAX_CHILDREN: u32 = 1000;
/// Session ids are UUIDs; anything much longer cannot exist.
const MAX_ID_LEN: usize = 128;
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// The API on `state`. Serve it with `axum::serve` (the tests bind port 0).
pub fn router(state: Scheduler) -> Router {
    // Room for a prompt and a system prompt at their limit, plus metadata and escaping;
    // the handler reports an oversize prompt by name before this limit is reached.
    let single_limit = state
        .cfg
        .max_prompt_bytes
        .saturating_mul(2)
        .saturating_add(1024 * 1024);
    Router::new()
        .route(
            "/v1/sessions",
            post(create_session)
                .layer(DefaultBodyLimit::max(single_limit))
                .get(list_sessions),
        )
        .route(
            "/v1/sessions/batch",
            post(create_batch).layer(DefaultBodyLimit::max(BATCH_BODY_LIMIT.max(single_limit))),
        )
        .route("/v1/sessions/{id}", get(get_session))
        .route(
            "/v1/sessions/{id}/messages",
            get(get_messages).post(crate::steer::post_message),
        )
        .route("/v1/sessions/{id}/approvals", post(crate::steer::approvals))
        .route("/v1/sessions/{id}/tree", get(crate::steer::tree))
        .route("/v1/sessions/{id}/cancel", post(cancel_session))
        .route("/v1/sessions/{id}/events", get(crate::events::events))
        .route("/metrics", get(crate::metrics::metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

impl Scheduler {
    fn limits(&self) -> Limits {
        Limits {
            max_prompt_bytes: self.cfg.max_prompt_bytes,
            max_batch: self.cfg.max_batch,
        }
    }

    /// `XADD` the new sessions of one queue and mark them enqueued. Failures are logged,
    /// not returned: the rows are committed and the sweeper adds what is missing.
    async fn enqueue(&self, queue: &str, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        if !self.queues().ensure(self.queue.as_ref(), queue).await {
            tracing::warn!(
                queue,
                sessions = ids.len(),
                "queue unavailable; the sweeper will enqueue these sessions"
            );
            return;
        }
        let added = match ids {
            [id] => self.queue.enqueue(queue, id, EnqueueReason::New).await,
            _ => {
                let items: Vec<(String, EnqueueReason)> = ids
                    .iter()
                    .map(|id| (id.clone(), EnqueueReason::New))
                    .collect();
                self.queue.enqueue_many(queue, &items).await
            }
        };
        if let Err(e) = added {
            tracing::warn!(queue, sessions = ids.len(), error = %e, "XADD failed; the sweeper will enqueue these sessions");
            return;
        }
        if let Err(e) = self.store.mark_enqueued(ids).await {
            // The entries exist; the sweeper may add duplicates, which the lease absorbs.
            tracing::warn!(queue, sessions = ids.len(), error = %e, "cannot mark sessions enqueued");
        }
    }
}

/// The JSON view of a session: the spec's fields at the top level beside the row's.
pub fn session_view(row: &SessionRow) -> Value {
    let mut m = match serde_json::to_value(&row.spec) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let own = json!({
        "id": row.id,
        "status": row.status,
        "finish_reason": row.finish_reason,
        "result": row.result,
        "error": row.error,
        "iterations": row.iteration,
        "usage": row.usage,
        "parent_id": row.parent_id,
        "root_id": row.root_id,
        "depth": row.depth,
        "queue": row.queue,
        "cancel_requested": row.cancel_requested,
        "attempts": row.attempts,
        "lease_owner": row.lease_owner,
        "idempotency_key": row.idempotency_key,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "finished_at": row.finished_at,
    });
    if let Value::Object(own) = own {
        m.extend(own);
    }
    Value::Object(m)
}

pub(crate) fn check_id(id: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    match id {
        Ok(Path(id)) if !id.is_empty() && id.len() <= MAX_ID_LEN => Ok(id),
        Ok(Path(id)) => Err(ApiError::NotFound(format!(
            "session {} not found",
            id.chars().take(MAX_ID_LEN).collect::<String>()
        ))),
        Err(_) => Err(ApiError::NotFound("session not found".into())),
    }
}

async fn create_session(
    State(s): State<Scheduler>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let req = parse_session(body, &s.limits(), "")?;
    let mut new = NewSession::root(req.spec, req.queue);
    new.idempotency_key = req.idempotency_key;
    let (row, created) = s.store.create_session(&new).await?;
    if created {
        tracing::info!(session_id = %row.id, queue = %row.queue, "session created");
        s.enqueue(&row.queue, std::slice::from_ref(&row.id)).await;
        Ok((
            StatusCode::CREATED,
            Json(json!({"id": row.id, "status": SessionStatus::Queued})),
        )
            .into_response())
    } else {
        Ok((
            StatusCode::OK,
            Json(json!({"id": row.id, "status": row.status})),
        )
            .into_response())
    }
}

async fn create_batch(State(s): State<Scheduler>, JsonBody(body): JsonBody) -> ApiResult<Response> {
    let reqs = parse_batch(body, &s.limits())?;
    let new: Vec<NewSession> = reqs
        .into_iter()
        .map(|r| {
            let mut n = NewSession::root(r.spec, r.queue);
            n.idempotency_key = r.idempotency_key;
            n
        })
        .collect();
    let rows = s.store.create_sessions(&new).await?;

    let mut by_queue: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (row, created) in &rows {
        if *created {
            by_queue
                .entry(row.queue.as_str())
                .or_default()
                .push(row.id.clone());
        }
    }
    let any_created = !by_queue.is_empty();
    tracing::info!(
        sessions = rows.len(),
        created = by_queue.values().map(Vec::len).sum::<usize>(),
        "batch created"
    );
    for (queue, ids) in &by_queue {
        s.enqueue(queue, ids).await;
    }
    let sessions: Vec<Value> = rows
        .iter()
        .map(|(row, _)| json!({"id": row.id, "status": row.status}))
        .collect();
    let status = if any_created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!({ "sessions": sessions }))).into_response())
}

async fn get_session(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    let id = check_id(id)?;
    let row = s
        .store
        .get(&id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("session {id} not found")))?;
    let children: Vec<String> = s
        .store
        .list(&ListFilter {
            parent_id: Some(id.clone()),
            limit: MAX_CHILDREN,
            ..Default::default()
        })
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let mut view = session_view(&row);
    if let Value::Object(m) = &mut view {
        m.insert("children".into(), json!(children));
    }
    Ok(Json(view))
}

async fn get_messages(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Json<Value>> {
    let id = check_id(id)?;
    let mut messages = s.store.messages(&id).await?;
    // Parallel tool results are stored as they finished; clients read them in call order.
    agentq_agent::state::normalize_history(&mut messages);
    Ok(Json(json!({ "messages": messages })))
}

async fn list_sessions(
    State(s): State<Scheduler>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(q) = query.map_err(|e| ApiError::InvalidQuery(e.body_text()))?;
    let limit = match q.limit.as_deref() {
        None | Some("") => DEFAULT_LIST_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_LIST_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("must be an integer between 1 and {MAX_LIST_LIMIT}, got {l:?}"),
                )
            })?,
    };
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(st) => Some(SessionStatus::parse(st).ok_or_else(|| {
            ApiError::invalid(
                "status",
                format!(
                    "unknown status {st:?} (expected queued, running, waiting, \
                     awaiting_approval, completed, failed or cancelled)"
                ),
            )
        })?),
    };
    for (field, v) in [("cursor", &q.cursor), ("parent_id", &q.parent_id)] {
        if v.as_ref().is_some_and(|v| v.len() > MAX_ID_LEN) {
            return Err(ApiError::invalid(field, "is not a session id"));
        }
    }
    // One more than asked tells whether another page exists.
    let mut rows = s
        .store
        .list(&ListFilter {
            status,
            parent_id: q.parent_id.filter(|p| !p.is_empty()),
            limit: limit + 1,
            cursor: q.cursor.filter(|c| !c.is_empty()),
        })
        .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next_cursor = if more {
        rows.last().map(|r| r.id.clone())
    } else {
        None
    };
    let sessions: Vec<Value> = rows.iter().map(session_view).collect();
    Ok(Json(
        json!({ "sessions": sessions, "next_cursor": next_cursor }),
    ))
}

async fn cancel_session(
    State(s): State<Scheduler>,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let result = s.store.request_cancel(&id).await?;
    agentq_core::lifecycle::announce_cancel(s.store.as_ref(), s.queue.as_ref(), &result).await;
    match result {
        CancelResult::CancelledNow(row) => {
            tracing::info!(session_id = %row.id, "session cancelled before running");
            agentq_core::lifecycle::cancel_descendants(s.store.as_ref(), s.queue.as_ref(), &row.id)
                .await;
            Ok((
                StatusCode::OK,
                Json(json!({"id": row.id, "status": row.status})),
            )
                .into_response())
        }
        CancelResult::Requested(row) => {
            tracing::info!(session_id = %row.id, owner = ?row.lease_owner, "cancel requested");
            agentq_core::lifecycle::cancel_descendants(s.store.as_ref(), s.queue.as_ref(), &row.id)
                .await;
            Ok((
                StatusCode::ACCEPTED,
                Json(json!({"id": row.id, "status": row.status, "cancel_requested": true})),
            )
                .into_response())
        }
        CancelResult::AlreadyFinished(row) => Err(ApiError::Conflict {
            code: "already_finished",
            message: format!("session {} already finished ({})", row.id, row.status),
        }),
        CancelResult::NotFound => Err(ApiError::NotFound(format!("session {id} not found"))),
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<Scheduler>) -> Response {
    if s.is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response();
    }
    let check = |r: Result<agentq_core::Result<()>, tokio::time::error::Elapsed>| match r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {READY_TIMEOUT:?}")),
    };
    let (pg, redis) = tokio::join!(
        tokio::time::timeout(READY_TIMEOUT, s.store.ping()),
        tokio::time::timeout(READY_TIMEOUT, s.queue.ping()),
    );
    let (pg, redis) = (check(pg), check(redis));
    if pg.is_none() && redis.is_none() {
        return (StatusCode::OK, Json(json!({"status": "ready"}))).into_response();
    }
    let down: Vec<&str> = [("postgres", &pg), ("redis", &redis)]
        .into_iter()
        .filter(|(_, e)| e.is_some())
        .map(|(n, _)| n)
        .collect();
    tracing::warn!(postgres = ?pg, redis = ?redis, "not ready");
    let status = |e: &Option<String>| e.clone().unwrap_or_else(|| "ok".into());
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({
            "status": "unavailable",
            "down": down,
            "checks": {"postgres": status(&pg), "redis": status(&redis)},
        })),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
