//! [`Error`]: why a server could not be started or spoken to. A tool call never returns
//! one: its failures are tool errors the model sees.

/// How starting or speaking to an MCP server fails.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("MCP server `{server}` cannot start: {why}")]
    Start { server: String, why: String },
    #[error("MCP server `{server}`: {why}")]
    Protocol { server: String, why: String },
}

pub type Result<T> = std::result::Result<T, Error>;
