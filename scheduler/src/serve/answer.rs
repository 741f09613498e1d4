//! Answers written outside hyper (a connection refused over the cap, the JSON body
//! that replaces hyper's empty one for a head it refuses), and the limits they name.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use agentq_api::{ErrorBody, ErrorDetail};

use crate::error::ApiError;

use super::slots::Full;

/// Longest request target (path and query) served; session ids are UUIDs.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Largest request head (all header names and values) served.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Seconds a client refused for the connection cap is told to wait.
pub(super) const RETRY_AFTER_SECS: u64 = 1;
/// How long a refused connection is given to take its answer.
pub(super) const REFUSE_WITHIN: Duration = Duration::from_secs(1);

/// Answer a connection over the cap with a 503 and close it.
pub(super) async fn refuse(mut stream: TcpStream, full: Full) {
    let message = match full {
        Full::Total => "too many open connections; retry later",
        Full::Peer => {
            "too many open connections from your address \
             (scheduler.max_connections_per_peer); close one or retry later"
        }
    };
    let err = ApiError::Overloaded {
        message: message.into(),
        retry_after: RETRY_AFTER_SECS,
    };
    let resp = raw_response(&err, &[("retry-after", &RETRY_AFTER_SECS.to_string())]);
    if stream.write_all(&resp).await.is_ok() {
        let _ = stream.shutdown().await;
        // Read what the client sent, so closing does not reset the connection before
        // the client has read the answer.
        let mut sink = [0u8; 4096];
        while matches!(tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await, Ok(n) if n > 0)
        {
        }
    }
}

/// A whole HTTP/1.1 response of `err` (for answers written outside hyper).
pub(super) fn raw_response(err: &ApiError, extra: &[(&str, &str)]) -> Vec<u8> {
    let body = ErrorBody {
        error: ErrorDetail {
            code: err.code().to_string(),
            message: err.to_string(),
            field: None,
        },
    };
    // Through a `Value`, like every answer of the API (sorted keys).
    let body = serde_json::to_value(&body)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let status = err.status();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}
