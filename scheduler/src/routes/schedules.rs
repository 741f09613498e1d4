//! Schedules (`/v1/schedules…`): creating, listing, reading, deleting, pausing, resuming,
//! triggering, and the history of fires. What each does is in `crate::schedules`; here
//! are the HTTP parts.

use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};

use agentq_api::{
    CreateSchedule, DEFAULT_SCHEDULE_LIST, ErrorBody, FireList, FireView, MAX_SCHEDULE_LIST,
    SCHEDULE_LIST_PARAMS, ScheduleList, ScheduleView,
};

use crate::error::ApiError;
use crate::http::query::params;
use crate::http::refused_body::IgnoredBody;
use crate::http::{ApiResult, Auth, JsonBody, decode_object, respond};
use crate::schedules::manage::{fire_view, new_schedule, schedule_of, view_of};
use crate::schedules::{Firer, Timing};
use crate::state::Scheduler;
use crate::webhooks::SystemClock;

/// Create a schedule
///
/// A session from `session` (anything `POST /v1/sessions` takes but `idempotency_key`)
/// at each time of `cron` in `timezone`, or every `every_secs` seconds. The template is
/// checked now as `POST /v1/sessions` checks it (its fields named `session.…`), and
/// again at each fire against the tenant's policy of then. `overlap` says what a fire
/// does while the previous fire's session is unfinished; fires missed while no scheduler
/// ran fire on start when at most `catchup_window_secs` late.
#[utoipa::path(
    post,
    path = "/v1/schedules",
    operation_id = "create_schedule",
    request_body = CreateSchedule,
    responses((status = 201, description = "Created", body = ScheduleView)),
)]
pub(super) async fn create(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let body: CreateSchedule = decode_object(body)?;
    let new = new_schedule(&s, &caller, body, Utc::now()).await?;
    s.store.create_schedule(&new).await?;
    tracing::info!(schedule_id = %new.id, tenant = %new.tenant, "schedule created");
    let row = schedule_of(&s, &caller, &new.id).await?;
    respond(StatusCode::CREATED, &view_of(row))
}

/// List schedules
///
/// The caller's tenant's schedules by id, paged.
#[utoipa::path(
    get,
    path = "/v1/schedules",
    operation_id = "list_schedules",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500,
            description = "Schedules per page (50 when absent)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous \
            page."),
    ),
    responses((status = 200, description = "A page", body = ScheduleList)),
)]
pub(super) async fn list(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let (limit, cursor) = page(query)?;
    let rows = s
        .store
        .list_schedules(&caller.tenant, cursor.as_deref(), limit)
        .await?;
    let full = rows.len() == usize::try_from(limit).unwrap_or(usize::MAX);
    let next_cursor = full.then(|| rows.last().map(|r| r.id.clone())).flatten();
    let schedules = rows.into_iter().map(view_of).collect();
    respond(
        StatusCode::OK,
        &ScheduleList {
            schedules,
            next_cursor,
        },
    )
}

/// Get a schedule
#[utoipa::path(
    get,
    path = "/v1/schedules/{id}",
    operation_id = "get_schedule",
    params(("id" = String, Path, description = "The schedule's id")),
    responses((status = 200, description = "The schedule", body = ScheduleView)),
)]
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let row = schedule_of(&s, &caller, &path_id(id)?).await?;
    respond(StatusCode::OK, &view_of(row))
}

/// Delete a schedule
///
/// With its history of fires; the sessions it created stay.
#[utoipa::path(
    delete,
    path = "/v1/schedules/{id}",
    operation_id = "delete_schedule",
    params(("id" = String, Path, description = "The schedule's id")),
    responses((status = 204, description = "Deleted")),
)]
pub(super) async fn delete(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let row = schedule_of(&s, &caller, &path_id(id)?).await?;
    s.store.delete_schedule(&row.id).await?;
    Ok(axum::response::IntoResponse::into_response(
        StatusCode::NO_CONTENT,
    ))
}

/// Pause a schedule
///
/// No fire until resumed (a buffered fire is dropped). Harmless when paused.
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/pause",
    operation_id = "pause_schedule",
    params(("id" = String, Path, description = "The schedule's id")),
    request_body(content = Object, description = "`{}`: nothing to send"),
    responses((status = 200, description = "Paused", body = ScheduleView)),
)]
pub(super) async fn pause(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    _: IgnoredBody,
) -> ApiResult<Response> {
    let row = schedule_of(&s, &caller, &path_id(id)?).await?;
    s.store
        .set_schedule_paused(&row.id, true, row.next_fire_at)
        .await?;
    let row = schedule_of(&s, &caller, &row.id).await?;
    respond(StatusCode::OK, &view_of(row))
}

/// Resume a schedule
///
/// Fires again from the next time after now: the times passed while paused are not
/// caught up. Harmless when running.
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/resume",
    operation_id = "resume_schedule",
    params(("id" = String, Path, description = "The schedule's id")),
    request_body(content = Object, description = "`{}`: nothing to send"),
    responses((status = 200, description = "Resumed", body = ScheduleView)),
)]
pub(super) async fn resume(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    _: IgnoredBody,
) -> ApiResult<Response> {
    let row = schedule_of(&s, &caller, &path_id(id)?).await?;
    if row.paused {
        let timing = Timing::parse(
            row.cron.as_deref(),
            row.cron.as_ref().map(|_| row.timezone.as_str()),
            row.every_secs,
        )
        .map_err(|r| {
            tracing::error!(schedule_id = %row.id, field = r.field, error = %r.message, "unreadable schedule");
            ApiError::Internal
        })?;
        let next = timing
            .next_after(Utc::now())
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        s.store.set_schedule_paused(&row.id, false, next).await?;
    }
    let row = schedule_of(&s, &caller, &row.id).await?;
    respond(StatusCode::OK, &view_of(row))
}

/// Trigger a schedule now
///
/// One fire at this moment, outside its times (paused or not), as its overlap policy
/// says: the fire as recorded in its history.
#[utoipa::path(
    post,
    path = "/v1/schedules/{id}/trigger",
    operation_id = "trigger_schedule",
    params(("id" = String, Path, description = "The schedule's id")),
    request_body(content = Object, description = "`{}`: nothing to send"),
    responses(
        (status = 200, description = "Fired", body = FireView),
        (status = 409, description = "`conflict`: a scheduler is firing it at this moment; \
            try again", body = ErrorBody),
    ),
)]
pub(super) async fn trigger(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    _: IgnoredBody,
) -> ApiResult<Response> {
    let row = schedule_of(&s, &caller, &path_id(id)?).await?;
    let firer = Firer::new(s.clone(), Arc::new(SystemClock));
    match firer.trigger(&row).await? {
        Some(fire) => respond(StatusCode::OK, &fire_view(fire)),
        None => Err(ApiError::Conflict {
            code: "conflict",
            message: format!(
                "schedule {} is being fired at this moment; try again",
                row.id
            ),
        }),
    }
}

/// List a schedule's fires
///
/// Newest first: each fire's time, what it did (started, skipped, buffered, missed,
/// failed) and the session it created.
#[utoipa::path(
    get,
    path = "/v1/schedules/{id}/fires",
    operation_id = "list_schedule_fires",
    params(
        ("id" = String, Path, description = "The schedule's id"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500,
            description = "Fires per page (50 when absent)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous \
            page."),
    ),
    responses((status = 200, description = "A page", body = FireList)),
)]
pub(super) async fn fires(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let row = schedule_of(&s, &caller, &path_id(id)?).await?;
    let (limit, cursor) = page(query)?;
    let before = match cursor {
        None => None,
        Some(c) => Some(
            c.parse::<i64>()
                .ok()
                .and_then(DateTime::<Utc>::from_timestamp_micros)
                .ok_or_else(|| ApiError::invalid("cursor", "is not a cursor of this list"))?,
        ),
    };
    let rows = s.store.list_fires(&row.id, before, limit).await?;
    let full = rows.len() == usize::try_from(limit).unwrap_or(usize::MAX);
    let next_cursor = full
        .then(|| {
            rows.last()
                .map(|f| f.fire_time.timestamp_micros().to_string())
        })
        .flatten();
    let fires = rows.into_iter().map(fire_view).collect();
    respond(StatusCode::OK, &FireList { fires, next_cursor })
}

/// `limit` and `cursor` of a listing.
fn page(
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<(u32, Option<String>)> {
    let mut p = params(query, SCHEDULE_LIST_PARAMS)?;
    let limit = match p.remove("limit").filter(|v| !v.is_empty()) {
        None => DEFAULT_SCHEDULE_LIST,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_SCHEDULE_LIST).contains(l))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("must be an integer between 1 and {MAX_SCHEDULE_LIST}, got {l:?}"),
                )
            })?,
    };
    let cursor = p.remove("cursor").filter(|c| !c.is_empty());
    if cursor
        .as_deref()
        .is_some_and(|c| c.len() > 128 || c.contains('\0'))
    {
        return Err(ApiError::invalid("cursor", "is not a cursor of this list"));
    }
    Ok((limit, cursor))
}

/// The id of a path; an impossible one is left to the lookup's 404.
fn path_id(id: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    match id {
        Ok(Path(id)) => Ok(id),
        Err(_) => Err(ApiError::NotFound("schedule not found".into())),
    }
}
