//! Batches as objects: `POST /v1/batches` (a JSON body or a JSON Lines upload),
//! `GET /v1/batches`, `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel` and
//! `GET /v1/batches/{id}/results` (JSON Lines, a page at a time). What each does is in
//! `crate::batches`; here are the HTTP parts: the body's form, the query, the status.

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use agentq_api::{
    BatchList, BatchRequestItem, BatchResult, BatchView, CREATE_PARAMS, CreateBatch,
    DEFAULT_BATCH_LIST, DEFAULT_RESULTS, ErrorBody, JSONL_CONTENT_TYPE, LIST_BATCHES_PARAMS,
    MAX_BATCH_LIST, MAX_RESULTS, NEXT_HEADER, RESULTS_HEADER, RESULTS_PARAMS,
};

use crate::batches;
use crate::error::ApiError;
use crate::http::batch_body::BatchBody;
use crate::http::body::{is_jsonl_content_type, no_nul};
use crate::http::query::params;
use crate::http::refused_body::{IgnoredBody, check_declared};
use crate::http::{ApiResult, Auth, MAX_ID_LEN, respond};
use crate::request::BatchOptions;
use crate::state::Scheduler;

/// Submit a batch
///
/// A batch of session requests as one object: a JSON body (`requests`, `max_running`,
/// `metadata`; no query), or JSON Lines (`application/x-ndjson`: one request a line, each
/// with an optional `custom_id`; the options in the query), read as a stream. Every item is
/// checked as `POST /v1/sessions` checks one, and the batch is created all or none: a bad
/// one is named where it is (`requests[3].mode`, `line 17.mode`); a line that is not JSON
/// is a 400 naming it; the item past `max_batch_items` (100,000), a line longer than a
/// session's body limit and an upload over 1 GiB are 413s naming the line.
#[utoipa::path(
    post,
    path = "/v1/batches",
    operation_id = "submit_batch",
    params(
        ("max_running" = Option<u32>, Query, minimum = 1, maximum = 1000000,
            description = "JSON Lines only: at most this many of the batch's sessions run at \
            once."),
        ("metadata" = Option<String>, Query, description = "JSON Lines only: the batch's \
            metadata, a JSON object (URL-encoded)."),
    ),
    request_body(
        description = "A JSON body, or JSON Lines of items (one `BatchRequestItem` a line).",
        content(
            (CreateBatch = "application/json"),
            (BatchRequestItem = "application/x-ndjson"),
        ),
    ),
    responses(
        (status = 201, description = "Created: every session queued", body = BatchView),
        (status = 409, description = "`conflict`: an item's `idempotency_key` names a session \
            already (`field`: `line 2.idempotency_key`, `requests[1].idempotency_key`)",
            body = ErrorBody),
    ),
)]
pub(super) async fn create(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    req: Request,
) -> ApiResult<Response> {
    let lines = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_jsonl_content_type);
    let checked = if lines {
        // Each line is held to a session's limit as it is read; the whole, declared
        // larger than an upload may be, is refused before a byte of it is.
        check_declared(req.headers(), batches::MAX_UPLOAD_BYTES)?;
        let options = params(query, CREATE_PARAMS).and_then(|mut p| {
            BatchOptions::from_query(
                p.remove("max_running").as_deref(),
                p.remove("metadata").as_deref(),
            )
        });
        let body: Body = req.into_body();
        batches::json_lines(&s, &caller, options, body).await?
    } else {
        // A JSON body carries its options itself.
        params(query, &[])?;
        let body = BatchBody::from_request(req, &s).await?;
        batches::json_body(&s, &caller, body).await?
    };
    let view = batches::create(&s, &caller, checked).await?;
    respond(StatusCode::CREATED, &view)
}

/// List batches
///
/// The caller's batches, newest first (every tenant's for an `admin` key), each as `GET
/// /v1/batches/{id}` shows it.
#[utoipa::path(
    get,
    path = "/v1/batches",
    operation_id = "list_batches",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 100,
            description = "Batches per page (20 when absent)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous \
            page."),
    ),
    responses((status = 200, description = "A page", body = BatchList)),
)]
pub(super) async fn list(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let mut p = params(query, LIST_BATCHES_PARAMS)?;
    let limit = limit(p.remove("limit"), DEFAULT_BATCH_LIST, MAX_BATCH_LIST)?;
    let cursor = id_param("cursor", p.remove("cursor"))?;
    let page = batches::list(&s, &caller, cursor.as_deref(), limit).await?;
    respond(StatusCode::OK, &page)
}

/// Get a batch
///
/// Counted from its sessions now: by status and finish reason, their tokens and cost, the
/// first start, the last finish, and the time left at the rate the finished ones went.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}",
    operation_id = "get_batch",
    params(("id" = String, Path, description = "The batch's id")),
    responses((status = 200, description = "The batch", body = BatchView)),
)]
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let row = batches::batch_of(&s, &caller, &batch_id(id)?).await?;
    respond(StatusCode::OK, &batches::view_of(&s, row).await?)
}

/// Cancel a batch
///
/// Every session of it that has not finished: those that never started at once, a running
/// one at its next step (202), each with its sub-agents. Repeating it is harmless.
#[utoipa::path(
    post,
    path = "/v1/batches/{id}/cancel",
    operation_id = "cancel_batch",
    params(("id" = String, Path, description = "The batch's id")),
    request_body(content = Object, description = "`{}`: nothing to send"),
    responses(
        (status = 200, description = "Every unfinished session was cancelled", body = BatchView),
        (status = 202, description = "Cancelled; running sessions stop at their next step",
            body = BatchView),
    ),
)]
pub(super) async fn cancel(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    _: IgnoredBody,
) -> ApiResult<Response> {
    let row = batches::batch_of(&s, &caller, &batch_id(id)?).await?;
    let requested = batches::cancel(&s, &row).await?;
    // Read again: the cancel's time and what it changed.
    let row = batches::batch_of(&s, &caller, &row.id).await?;
    let status = if requested {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    respond(status, &batches::view_of(&s, row).await?)
}

/// Read a batch's results
///
/// JSON Lines, one `BatchResult` per finished session in id order (the order of the
/// requests) after `after`, up to the first that has not finished, at most `limit` and
/// 16 MiB a page. `agentq-results` says why the page ends (`complete`, `more`: ask again
/// at once, `waiting`: ask again later), `agentq-next` is the next call's `after`.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}/results",
    operation_id = "get_batch_results",
    params(
        ("id" = String, Path, description = "The batch's id"),
        ("after" = Option<String>, Query, description = "Start after this session (the \
            `agentq-next` of the previous page, or the last id read)."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 10000,
            description = "Results per page (1,000 when absent)."),
    ),
    responses((status = 200, description = "A page of results, one JSON object a line",
        content_type = "application/x-ndjson", body = BatchResult,
        headers(
            ("agentq-results" = String, description = "`complete`, `more` or `waiting`"),
            ("agentq-next" = String, description = "The `after` of the next page, when more \
                may follow"),
        ))),
)]
pub(super) async fn results(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let row = batches::batch_of(&s, &caller, &batch_id(id)?).await?;
    let mut p = params(query, RESULTS_PARAMS)?;
    let limit = limit(p.remove("limit"), DEFAULT_RESULTS, MAX_RESULTS)?;
    let after = id_param("after", p.remove("after"))?;
    let batches::ResultsPage { body, next, end } =
        batches::results(&s, &row.id, after, limit).await?;
    let mut resp = (StatusCode::OK, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(JSONL_CONTENT_TYPE),
    );
    headers.insert(RESULTS_HEADER, HeaderValue::from_static(end.as_str()));
    if let Some(next) = next
        && let Ok(v) = HeaderValue::from_str(&next)
    {
        headers.insert(NEXT_HEADER, v);
    }
    Ok(resp)
}

/// The batch id of a path: one with a NUL is a 422 naming `id`; an impossible one is
/// left to the lookup's 404.
fn batch_id(id: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    match id {
        Ok(Path(id)) => {
            no_nul("id", &id)?;
            Ok(id)
        }
        Err(_) => Err(ApiError::NotFound("batch not found".into())),
    }
}

/// `limit` of a query: 1 to `max`, `default` when absent.
fn limit(v: Option<String>, default: u32, max: u32) -> ApiResult<u32> {
    match v.filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=max).contains(l))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("must be an integer between 1 and {max}, got {l:?}"),
                )
            }),
    }
}

/// A cursor of a query (an id), empty as absent.
fn id_param(field: &str, v: Option<String>) -> ApiResult<Option<String>> {
    match v.filter(|v| !v.is_empty()) {
        Some(v) if v.len() > MAX_ID_LEN => Err(ApiError::invalid(field, "is not an id")),
        v => Ok(v),
    }
}
