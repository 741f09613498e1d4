//! agentq-error: the one error every backend and process shares, `agentq_core::Error`:
//! what the `Store` and `Queue` traits and the limiter return, so that a caller holds
//! either in one type. Classified where raised: a lost lease is final for the run that
//! sees it; database and Redis outages are retryable; bad input is the caller's; a value
//! the database refuses for what it is ([`Error::Data`]) is final for the write that
//! carries it, and for nothing else.
//!
//! Every `sqlx::Error` becomes an [`Error`] through one conversion ([`From`]), which sorts
//! the database's refusals of a value from everything else: SQLSTATE class 22 (data
//! exception: a character the encoding cannot hold, a number out of range, bad JSON),
//! class 23 (integrity constraint violation of the row written), class 54 (program limit
//! exceeded: a row or value too big), and SQLite's `SQLITE_TOOBIG`, `SQLITE_CONSTRAINT`
//! and `SQLITE_MISMATCH`, plus a value the driver cannot encode. Retrying such a write
//! fails the same way, so it is never retried; callers that write many rows at once
//! (the group commit) split the write to find the row at fault.
//!
//! A domain error ([`agentq_types::Error`]) becomes the variant of the same name and
//! message, through [`From`], so that `?` carries it unchanged.

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
    /// A finished session cannot be re-opened (a follow-up, a retry): its tree's token
    /// budget has nothing left to give it. Nothing was changed.
    #[error("{0}")]
    NoBudget(String),
    /// Invalid input, naming the field.
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    /// The database schema is older than this binary.
    #[error(
        "database schema is behind ({}; this binary needs version {required}): run `agentq migrate`",
        schema_at(*.current)
    )]
    SchemaBehind { current: Option<i64>, required: i64 },
    #[error("database error: {0}")]
    Db(sqlx::Error),
    /// A service (Postgres, Redis) could not be reached at all, said once with its
    /// address and cause. Retryable: it may be starting.
    #[error("cannot connect to {service} at {address}: {cause}")]
    Unreachable {
        service: &'static str,
        address: String,
        cause: String,
    },
    /// The database refused a value of this write for what it is (see the module docs):
    /// not retryable, and not an outage.
    #[error("the database refused the data{code}: {0}", code = sqlstate(.0))]
    Data(sqlx::Error),
    /// The embedded database file is damaged or is not a database.
    #[error(
        "the database file {path} is corrupt ({detail}); restore it from a backup, or move it aside to start afresh"
    )]
    Corrupt { path: String, detail: String },
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
    /// The object store (`[workspace] blob_store = "s3"`) failed or refused: retryable for
    /// an outage (transport, 5xx, throttling), not for a refusal or a wrong content.
    #[error("object store: {message}")]
    ObjectStore { retryable: bool, message: String },
    /// One failure seen by every member of a group commit.
    #[error(transparent)]
    Shared(std::sync::Arc<Error>),
}

impl Error {
    /// Worth trying again after a pause (the service may be restarting): every database
    /// error but a refused value ([`Error::Data`]) or an unreadable stored one, e.g.
    /// connection loss (class 08), serialization failures and deadlocks (40001, 40P01),
    /// a server shutting down (57P01), lack of resources (class 53), a busy or full
    /// SQLite file.
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
            Error::Pool(_) | Error::Unreachable { .. } => true,
            Error::ObjectStore { retryable, .. } => *retryable,
            Error::Shared(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// The database refused a value of the write (see [`Error::Data`]); sees through
    /// [`Error::Shared`].
    pub fn is_data(&self) -> bool {
        match self {
            Error::Data(_) => true,
            Error::Shared(e) => e.is_data(),
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

/// Where a schema that is behind stands, for [`Error::SchemaBehind`]'s message.
fn schema_at(current: Option<i64>) -> String {
    match current {
        Some(v) => format!("at version {v}"),
        None => "no migration applied".into(),
    }
}

/// What a failed connection attempt says once: the kind of the common transport failures
/// in a few words ("connection refused"), else the error's own text.
pub fn connect_cause(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::ConnectionReset => "connection reset".into(),
        K::TimedOut => "timed out".into(),
        K::NotFound => "no such socket".into(),
        K::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

impl From<agentq_types::Error> for Error {
    fn from(e: agentq_types::Error) -> Self {
        match e {
            agentq_types::Error::Invalid { field, message } => Error::Invalid { field, message },
            agentq_types::Error::Config(message) => Error::Config(message),
            agentq_types::Error::Json(e) => Error::Json(e),
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        if refuses_the_value(&e) {
            Error::Data(e)
        } else {
            Error::Db(e)
        }
    }
}

/// Whether the database (or the driver) refused a value for what it is, so that the same
/// write can never succeed.
fn refuses_the_value(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Encode(_) => true,
        sqlx::Error::Database(d) => {
            let Some(code) = d.code() else {
                return false;
            };
            if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // The extended result code; its low byte is the primary one.
                return code.parse::<u32>().is_ok_and(|c| {
                    matches!(
                        c & 0xff,
                        SQLITE_TOOBIG | SQLITE_CONSTRAINT | SQLITE_MISMATCH
                    )
                });
            }
            matches!(code.get(..2), Some("22" | "23" | "54"))
        }
        _ => false,
    }
}

const SQLITE_TOOBIG: u32 = 18;
const SQLITE_CONSTRAINT: u32 = 19;
const SQLITE_MISMATCH: u32 = 20;

/// ` (SQLSTATE xxxxx)` when the error has a code, for the message.
fn sqlstate(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => d.code().map(|c| format!(" ({c})")).unwrap_or_default(),
        _ => String::new(),
    }
}
