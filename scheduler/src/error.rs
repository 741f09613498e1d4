//! [`ApiError`]: every error the HTTP API answers with, and its one JSON shape
//! `{"error":{"code","message","field"}}`. Client errors say what is wrong and, when one
//! field is to blame, which (`prompt`, `[17].mode`, `metadata.api_key`). Server errors are
//! logged with their cause and answered with a generic message: a database error string
//! can leak schema or connection details.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use agentq_api::{ErrorBody, ErrorDetail};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON at all (syntax error, truncated, not UTF-8).
    #[error("{0}")]
    InvalidJson(String),
    /// One named part of a body is not JSON (a line of an upload: `line 17`).
    #[error("{message}")]
    InvalidJsonAt { field: String, message: String },
    /// A query string that cannot be decoded.
    #[error("{0}")]
    InvalidQuery(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body, or one field of it, is larger than allowed.
    #[error("{message}")]
    TooLarge {
        field: Option<String>,
        message: String,
    },
    /// Well-formed JSON with a value the API does not accept.
    #[error("{message}")]
    Invalid {
        code: &'static str,
        field: Option<String>,
        message: String,
    },
    #[error("{0}")]
    NotFound(String),
    /// No key, or one that is not valid (unknown, expired, revoked).
    #[error("{0}")]
    Unauthorized(String),
    /// A valid key without the scope the route needs, or a request the server refuses
    /// whoever sends it (a `Host` that is not loopback in `agentq dev`).
    #[error("{message}")]
    Forbidden {
        field: Option<String>,
        message: String,
    },
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// A conflict one field is to blame for (an idempotency key reused with another
    /// request).
    #[error("{message}")]
    ConflictOn { field: String, message: String },
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Postgres or Redis is unreachable right now: worth retrying.
    #[error("{0}")]
    Unavailable(String),
    /// A cap of the server is reached (open connections, event streams): retry after
    /// `retry_after` seconds.
    #[error("{message}")]
    Overloaded { message: String, retry_after: u64 },
    /// The client did not send its request within the server's time.
    #[error("{0}")]
    Timeout(String),
    /// The request line is longer than the server reads.
    #[error("{0}")]
    UriTooLong(String),
    /// The request's headers are larger than the server reads.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// Anything else; the cause is logged, not sent.
    #[error("internal error")]
    Internal,
}

impl ApiError {
    /// A 422 naming `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            code: "invalid_field",
            field: Some(field.into()),
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_)
            | ApiError::InvalidJsonAt { .. }
            | ApiError::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::Conflict { .. } | ApiError::ConflictOn { .. } => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unavailable(_) | ApiError::Overloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) | ApiError::InvalidJsonAt { .. } => "invalid_json",
            ApiError::InvalidQuery(_) => "invalid_query",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::TooLarge { .. } => "too_large",
            ApiError::Invalid { code, .. } => code,
            ApiError::NotFound(_) => "not_found",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::Conflict { code, .. } => code,
            ApiError::ConflictOn { .. } => "conflict",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Overloaded { .. } => "overloaded",
            ApiError::Timeout(_) => "timeout",
            ApiError::UriTooLong(_) => "uri_too_long",
            ApiError::HeadersTooLarge(_) => "headers_too_large",
            ApiError::Internal => "internal",
        }
    }

    pub fn field(&self) -> Option<&str> {
        match self {
            ApiError::TooLarge { field, .. }
            | ApiError::Invalid { field, .. }
            | ApiError::Forbidden { field, .. } => field.as_deref(),
            ApiError::ConflictOn { field, .. } | ApiError::InvalidJsonAt { field, .. } => {
                Some(field)
            }
            _ => None,
        }
    }
}

impl From<agentq_core::Error> for ApiError {
    fn from(e: agentq_core::Error) -> Self {
        use agentq_core::Error as E;
        match e {
            E::Invalid { field, message } => ApiError::Invalid {
                code: "invalid_field",
                field: Some(field),
                message,
            },
            E::NotFound(id) => ApiError::NotFound(format!("session {id} not found")),
            E::Conflict(message) => ApiError::Conflict {
                code: "conflict",
                message,
            },
            // A follow-up or retry of a session whose tree's token budget has nothing left
            // to give it: refused, the session left as it was.
            E::NoBudget(message) => ApiError::Conflict {
                code: "budget_exhausted",
                message,
            },
            // Input the request checks let through but the database refuses (a value out
            // of a column's range, say): the caller's to fix, never worth a retry.
            e if e.is_data() => {
                tracing::warn!(error = %e, "the store refused a value of a request");
                ApiError::Invalid {
                    code: "invalid_value",
                    field: None,
                    message: "the store refused a value of this request".into(),
                }
            }
            e if e.is_retryable() => {
                tracing::warn!(error = %e, "backend unavailable");
                ApiError::Unavailable("a backing service is unavailable; retry later".into())
            }
            e => {
                tracing::error!(error = %e, "internal error");
                ApiError::Internal
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code().to_string(),
                message: self.to_string(),
                field: self.field().map(str::to_string),
            },
        };
        // Through a `Value`, like every answer: its keys go out sorted, as they always have.
        let body = serde_json::to_value(&body).unwrap_or_default();
        let mut resp = (self.status(), Json(body)).into_response();
        let retry_after = match &self {
            ApiError::Unavailable(_) => Some(1),
            ApiError::Overloaded { retry_after, .. } => Some(*retry_after),
            _ => None,
        };
        if let Some(secs) = retry_after {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        if matches!(self, ApiError::Unauthorized(_)) {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}
