//! The worker's error and its `Result`: a core error (store, queue, settings) or a
//! configuration the worker cannot run with.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] agentq_core::Error),
    #[error("configuration error: {0}")]
    Config(String),
}

/// A domain error (settings, policy) is a core error, as it was before the domain had a
/// crate of its own.
impl From<agentq_core::error::DomainError> for Error {
    fn from(e: agentq_core::error::DomainError) -> Self {
        Error::Core(e.into())
    }
}
