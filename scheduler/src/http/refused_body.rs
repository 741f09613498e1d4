//! Bodies past their route's limit. Declared too large (`content-length`), a body is
//! refused at once, before a byte of it is read; when it is at most [`DRAIN_BYTES`] over
//! the limit, what the client writes anyway is read and dropped beside the answer. Found
//! too large while read (a chunked body), what is left of it is read and dropped, up to
//! [`DRAIN_BYTES`], before the answer goes: a client still
//! writing when the server answers and closes sees its write fail (a broken pipe), not the
//! answer that says why; reading a bounded rest lets a body somewhat over a limit get its
//! 413, and a far larger one still costs the server at most this much.
//!
//! Each route's limit is in the request's extensions ([`BodyLimit`], set by the router
//! from `routes::body_limit`), so every reader of a body holds it to the same number.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, header};
use futures::{Stream, StreamExt};

use crate::error::ApiError;

/// Bytes of a refused body read (and dropped) at most before the answer.
pub const DRAIN_BYTES: usize = 4 * 1024 * 1024;

/// The body limit of a route that sets none of its own (axum's default, kept).
pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

/// The most bytes the body of the request's route may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimit(pub usize);

/// The limit of `req`'s route ([`DEFAULT_BODY_LIMIT`] when the router set none).
pub(crate) fn limit_of(req: &Request) -> usize {
    req.extensions()
        .get::<BodyLimit>()
        .map_or(DEFAULT_BODY_LIMIT, |l| l.0)
}

/// The 413 of a body over `limit` bytes, naming the limit.
pub(crate) fn too_large(limit: impl std::fmt::Display) -> ApiError {
    ApiError::TooLarge {
        field: None,
        message: format!("request body is over {limit} bytes, the most this route takes"),
    }
}

/// A 413 when the request declares a body longer than `limit` bytes (nothing is read).
pub(crate) fn check_declared(headers: &HeaderMap, limit: u64) -> Result<(), ApiError> {
    match declared(headers) {
        Some(n) if n > limit => Err(too_large(limit)),
        _ => Ok(()),
    }
}

/// The body's length as `content-length` declares it.
fn declared(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// Read what is left of `body`, up to [`DRAIN_BYTES`] (within the request's body timeout).
pub(crate) async fn drain<S, E>(body: &mut S)
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    let mut read = 0usize;
    while read <= DRAIN_BYTES {
        match body.next().await {
            Some(Ok(piece)) => read = read.saturating_add(piece.len()),
            Some(Err(_)) | None => return,
        }
    }
}

/// The whole of `body` when it holds at most `limit` bytes; else a 413, at once when
/// `headers` declare more, else once it passes the limit (the rest drained first, see the
/// module docs).
pub(crate) async fn read_at_most(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    if let Err(refused) = check_declared(headers, u64::try_from(limit).unwrap_or(u64::MAX)) {
        // Somewhat over the limit: the answer goes at once, and what the client writes
        // meanwhile is read and dropped beside it, so that a client writing the body whole
        // (most do, whatever the answer) gets to read its 413.
        let drainable = u64::try_from(limit.saturating_add(DRAIN_BYTES)).unwrap_or(u64::MAX);
        if declared(headers).is_some_and(|n| n <= drainable) {
            tokio::spawn(async move { drain(&mut stream).await });
        }
        return Err(refused);
    }
    let mut bytes = Vec::new();
    while let Some(piece) = stream.next().await {
        let piece = piece
            .map_err(|e| ApiError::InvalidJson(format!("cannot read the request body: {e}")))?;
        if bytes.len().saturating_add(piece.len()) > limit {
            drain(&mut stream).await;
            return Err(too_large(limit));
        }
        bytes.extend_from_slice(&piece);
    }
    Ok(Bytes::from(bytes))
}

/// The body of a route that reads none (its operation documents `{}`): read and dropped
/// under the route's limit all the same, so that one past it gets its 413 like any other
/// route's, and a client writing one is never cut off mid-write.
#[derive(Debug, Clone, Copy)]
pub struct IgnoredBody;

impl<S: Send + Sync> axum::extract::FromRequest<S> for IgnoredBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        let limit = limit_of(&req);
        let (parts, body) = req.into_parts();
        read_at_most(&parts.headers, body, limit).await?;
        Ok(IgnoredBody)
    }
}
