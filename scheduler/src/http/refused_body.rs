//! What is left of a request body the server has refused: read and dropped, up to
//! [`DRAIN_BYTES`], before the answer goes. A client still writing when the server answers
//! and closes sees its write fail (a broken pipe), not the answer that says why; reading a
//! bounded rest lets a body somewhat over a limit get its 4xx, and a far larger one still
//! costs the server at most this much.

use axum::body::{Body, Bytes};
use futures::{Stream, StreamExt};

use crate::error::ApiError;

/// Bytes of a refused body read (and dropped) at most before the answer.
pub const DRAIN_BYTES: usize = 4 * 1024 * 1024;

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

/// The whole of `body` when it holds at most `limit` bytes; else a 413 (the rest drained
/// first, see the module docs).
pub(crate) async fn read_at_most(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(piece) = stream.next().await {
        let piece = piece
            .map_err(|e| ApiError::InvalidJson(format!("cannot read the request body: {e}")))?;
        if bytes.len().saturating_add(piece.len()) > limit {
            drain(&mut stream).await;
            return Err(ApiError::TooLarge {
                field: None,
                message: format!("request body is over {limit} bytes"),
            });
        }
        bytes.extend_from_slice(&piece);
    }
    Ok(Bytes::from(bytes))
}
