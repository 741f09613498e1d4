//! The crate's error type, classified where it is raised: retryable, fatal or suspended.

use std::time::Duration;

use crate::provider::ratelimit::RateLimitInfo;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the caller should treat a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try again, after at least `after` when the server said so.
    Retryable { after: Option<Duration> },
    /// Trying again cannot help.
    Fatal,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connect failure, reset, idle timeout, a stream cut before its end.
    #[error("transport error: {0}")]
    Transport(String),
    /// A non-2xx answer from a provider. `message` is the provider's own message.
    #[error("HTTP {status}: {message}")]
    Http {
        status: u16,
        message: String,
        /// The provider's error code or type (`rate_limit_exceeded`, `overloaded_error`…).
        code: Option<String>,
        retry_after: Option<Duration>,
        /// The rate-limit state the answer's headers announced (boxed: most errors have
        /// none, and the error travels in every `Result`).
        limits: Option<Box<RateLimitInfo>>,
    },
    /// An error reported inside a 200 stream (`event: error`, `data: {"error":…}`).
    #[error("provider stream error: {message}")]
    Stream {
        message: String,
        code: Option<String>,
        retryable: bool,
    },
    /// The provider sent something we could not understand.
    #[error("invalid provider response: {0}")]
    Decode(String),
    /// The prompt does not fit the model's context window. Never retried.
    #[error("context length exceeded: {0}")]
    ContextLength(String),
    /// Bad configuration (missing key, unknown provider, bad URL).
    #[error("configuration error: {0}")]
    Config(String),
    #[error("cancelled")]
    Cancelled,
    /// The checkpoint was refused because another worker owns the session now.
    #[error("lease lost: another worker owns this session")]
    LeaseLost,
    /// The host stopped the run right after a durable checkpoint (graceful shutdown):
    /// the session is intact and another worker resumes it.
    #[error("stopped at a checkpoint: the worker is shutting down")]
    Stopped,
    /// The checkpoint could not be made durable; the failure says whether trying again
    /// can help.
    #[error("checkpoint failed: {0}")]
    Checkpoint(CheckpointFailure),
    #[error("tool error: {0}")]
    Tool(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Why a [`Checkpointer`](crate::driver::Checkpointer) could not make a step durable
/// (a lost lease is [`Error::LeaseLost`], a host stopping at a checkpoint
/// [`Error::Stopped`]). Its text is the store's own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFailure {
    /// The store refused the step for what it holds (a value it cannot store, a state no
    /// row can hold): the same step would be refused again, so the run cannot go on.
    #[error("{reason}")]
    Refused {
        /// The store's reason.
        reason: String,
        /// How much of the history is durable: the refused step's messages start here.
        durable: usize,
    },
    /// The store failed otherwise (unreachable for as long as the host kept trying):
    /// the last durable checkpoint stands, and a later run can resume from it.
    #[error("{0}")]
    Unavailable(String),
}

impl CheckpointFailure {
    pub fn class(&self) -> ErrorClass {
        match self {
            CheckpointFailure::Refused { .. } => ErrorClass::Fatal,
            CheckpointFailure::Unavailable(_) => ErrorClass::Retryable { after: None },
        }
    }
}

impl Error {
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Transport(_) | Error::Decode(_) => ErrorClass::Retryable { after: None },
            Error::Http {
                status,
                retry_after,
                code,
                ..
            } => {
                // A quota error is a 429 that waiting does not fix.
                if code.as_deref() == Some("insufficient_quota") {
                    return ErrorClass::Fatal;
                }
                match status {
                    408 | 409 | 429 | 500 | 502 | 503 | 504 | 529 => ErrorClass::Retryable {
                        after: *retry_after,
                    },
                    _ => ErrorClass::Fatal,
                }
            }
            Error::Stream { retryable, .. } => {
                if *retryable {
                    ErrorClass::Retryable { after: None }
                } else {
                    ErrorClass::Fatal
                }
            }
            Error::Checkpoint(f) => f.class(),
            Error::ContextLength(_)
            | Error::Config(_)
            | Error::Cancelled
            | Error::LeaseLost
            | Error::Stopped
            | Error::Tool(_)
            | Error::Io(_)
            | Error::Json(_) => ErrorClass::Fatal,
        }
    }

    /// The provider refused the call for its rate limit (HTTP 429, or Anthropic's 529
    /// `overloaded`): `Some(retry_after)`. A quota error (`insufficient_quota`) is not a
    /// rate limit: waiting does not fix it.
    pub fn rate_limited(&self) -> Option<Option<Duration>> {
        match self {
            Error::Http {
                status: 429 | 529,
                code,
                retry_after,
                ..
            } if code.as_deref() != Some("insufficient_quota") => Some(*retry_after),
            _ => None,
        }
    }

    /// The rate-limit state an error answer announced, if any.
    pub fn rate_limits(&self) -> Option<&RateLimitInfo> {
        match self {
            Error::Http { limits, .. } => limits.as_deref(),
            _ => None,
        }
    }

    pub fn is_retryable(&self) -> bool {
        matches!(self.class(), ErrorClass::Retryable { .. })
    }
}
