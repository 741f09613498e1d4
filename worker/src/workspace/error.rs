//! What goes wrong with a workspace ([`Error`]): the store (retryable when it is an
//! outage), the local disk, or the stored data itself.

use std::path::Path;

/// What went wrong with a workspace: the store (retryable when it is an outage), the local
/// disk, or the stored data itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] agentq_core::Error),
    #[error("workspace {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// The manifest names content the store does not hold (or holds other bytes for).
    #[error("workspace: {0}")]
    Data(String),
}

impl Error {
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Store(e) => e.is_retryable(),
            Error::Io { .. } | Error::Data(_) => false,
        }
    }
}

/// The error of a disk operation on `path`.
pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}
