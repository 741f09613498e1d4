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
    CREATE_PARAMS, DEFAULT_BATCH_LIST, DEFAULT_RESULTS, JSONL_CONTENT_TYPE, LIST_BATCHES_PARAMS,
    MAX_BATCH_LIST, MAX_RESULTS, NEXT_HEADER, RESULTS_HEADER, RESULTS_PARAMS,
};

use crate::batches;
use crate::error::ApiError;
use crate::http::batch_body::BatchBody;
use crate::http::body::{is_jsonl_content_type, no_nul};
use crate::http::query::params;
use crate::http::{ApiResult, Auth, MAX_ID_LEN, respond};
use crate::request::BatchOptions;
use crate::state::Scheduler;

/// `POST /v1/batches`: JSON Lines when the content type says so (the options in the
/// query), else a JSON body (the options in it, and no query).
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
        let mut p = params(query, CREATE_PARAMS)?;
        let options = BatchOptions::from_query(
            p.remove("max_running").as_deref(),
            p.remove("metadata").as_deref(),
        )?;
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

/// `GET /v1/batches?limit=&cursor=`
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

/// `GET /v1/batches/{id}`
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let row = batches::batch_of(&s, &caller, &batch_id(id)?).await?;
    respond(StatusCode::OK, &batches::view_of(&s, row).await?)
}

/// `POST /v1/batches/{id}/cancel`: 202 when a running session was asked to stop (its
/// worker stops it at its next check), else 200.
pub(super) async fn cancel(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
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

/// `GET /v1/batches/{id}/results?after=&limit=`: JSON Lines of the finished items in id
/// order, with the next page's `after` and why this one ends in headers.
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
