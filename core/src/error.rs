//! The crate's error type. Classified where raised: a lost lease is final for the run that
//! sees it; database and Redis outages are retryable; bad input is the caller's.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The write was fenced off: another worker holds a newer lease.
    #[error("lease lost: another worker owns session {0}")]
    LeaseLost(String),
    #[error("session {0} not found")]
    NotFound(String),
    /// The request conflicts with the session's state (e.g. cancel of a finished one).
    #[error("conflict: {0}")]
    Conflict(String),
    /// Invalid input, naming the field.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    /// The database schema is older than this binary.
    #[error("database schema is behind (at {current:?}, need {required}): run `agentq migrate`")]
    SchemaBehind { current: Option<i64>, required: i64 },
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration error: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis pool error: {0}")]
    Pool(String),
    #[error("configuration error: {0}")]
    Config(String),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Agent(#[from] agentq_agent::Error),
    /// The worker stopped its checkpoint writer (hard shutdown): nothing more is written.
    #[error("stopped: the worker is shutting down")]
    Stopped,
    /// One failure seen by every member of a group commit.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// Worth trying again after a pause (the service may be restarting).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Db(e) => !matches!(
                e,
                sqlx::Error::RowNotFound
                    | sqlx::Error::ColumnDecode { .. }
                    | sqlx::Error::Decode(_)
            ),
            Error::Redis(e) => !matches!(
                e.kind(),
                redis::ErrorKind::UnexpectedReturnType | redis::ErrorKind::Parse
            ),
            Error::Pool(_) => true,
            Error::Shared(e) => e.is_retryable(),
            _ => false,
        }
    }

    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
