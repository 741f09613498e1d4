//! [`BatchBody`]: the body of `POST /v1/sessions/batch`, read under the batch decode
//! budget (`http::decode`).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use futures::StreamExt;

use agentq_core::auth::Caller;

use crate::error::ApiError;
use crate::http::body::require_json;
use crate::http::decode::Grant;
use crate::http::refused_body::{check_declared, drain, limit_of, too_large};
use crate::state::Scheduler;

/// The body of `POST /v1/sessions/batch` (JSON, as [`crate::http::RawJson`] requires),
/// read under the decode budget. Hold `grant` until the batch is created.
#[derive(Debug)]
pub struct BatchBody {
    pub bytes: Bytes,
    pub grant: Grant,
}

impl FromRequest<Scheduler> for BatchBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &Scheduler) -> Result<Self, ApiError> {
        require_json(req.headers())?;
        let Some(caller) = req.extensions().get::<Caller>() else {
            tracing::error!("a batch body on a route that did not authenticate");
            return Err(ApiError::Internal);
        };
        let mut grant = s.decoding.grant(&caller.tenant);
        let limit = limit_of(&req);
        // Refused before the grant or a byte is read (see `refused_body`).
        check_declared(req.headers(), u64::try_from(limit).unwrap_or(u64::MAX))?;
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        // Granted before a byte is buffered: the whole declared body at once.
        grant.take(declared.unwrap_or(0))?;
        let mut buf = Vec::with_capacity(declared.unwrap_or(0));
        let mut body = req.into_body().into_data_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::InvalidJson(format!("cannot read the request body: {e}")))?;
            let len = buf.len().saturating_add(chunk.len());
            if len > limit {
                // What is still coming is read first, so the client reads the answer.
                drain(&mut body).await;
                return Err(too_large(limit));
            }
            if len > grant.held {
                // Over the tenant's decode budget: answered at once, not drained. The budget
                // bounds the scheduler's memory under load; draining would hold the
                // connection for as long as the client takes to end its body.
                grant.take(len - grant.held)?;
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(BatchBody {
            bytes: Bytes::from(buf),
            grant,
        })
    }
}
