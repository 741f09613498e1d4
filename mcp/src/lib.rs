//! MCP servers as tools of agentq sessions. This crate owns starting each server the
//! operator configured (`[mcp]`: a child process over stdio with a cleared environment,
//! or a streamable-HTTP endpoint held to `http_fetch`'s network rules), the handshake,
//! its tool list (listed at start and again on `notifications/tools/list_changed`),
//! restarting a server that exits or hangs (with a bounded, cancellable backoff), and one
//! [`Tool`](agentq_agent::tools::Tool) per MCP tool, named `mcp__<server>__<tool>`.
//!
//! A tool passes the model its server's description and input schema as they are, and
//! declares the side-effect class its annotations imply (`readOnlyHint` → pure,
//! `idempotentHint` → idempotent, else unsafe) unless the operator overrides it. A call's
//! arguments are held to that schema first ([`schema`]); the call is bounded by the
//! server's timeout, its concurrency and the size of one message read from it, and is
//! cancelled (`notifications/cancelled`) when the session is. Everything else a call goes
//! through — the guard pipeline, the write-ahead rule per side-effect class, the
//! session's timeout and the output truncation — is the agent driver's, as for any tool.

mod error;
mod http;
pub mod schema;
mod server;
mod servers;
mod stdio;
mod tool;

pub use error::{Error, Result};
pub use server::{
    MAX_DESCRIPTION_BYTES, MAX_PAGES, MAX_SCHEMA_BYTES, MAX_TOOL_NAME, MAX_TOOLS, McpServer,
    ServerStatus,
};
pub use servers::{McpServers, McpTools};
pub use tool::McpTool;
