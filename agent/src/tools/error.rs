//! [`ToolError`]: how a tool call fails, shown to the model as the call's result.

/// A failure a tool reports. It becomes the tool's text output, never a crash of the loop.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    #[error("denied: {0}")]
    Denied(String),
    #[error("{0}")]
    Failed(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}
