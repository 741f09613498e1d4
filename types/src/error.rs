//! The domain's error type: what parsing and checking a value can refuse. Never
//! retryable: the same input is refused the same way. `agentq_core::Error` (of the
//! `agentq-error` crate) holds each variant under the same name and message, so that `?`
//! carries a domain error into the backends' and the processes' errors unchanged.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid input, naming the field.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    #[error("configuration error: {0}")]
    Config(String),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl Error {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
