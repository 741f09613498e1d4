//! `[mcp]`: the MCP servers whose tools sessions may call as `mcp__<server>__<tool>`, each
//! started by every worker (a child process over stdio, or a fixed streamable-HTTP URL),
//! with its per-call limits and the operator's overrides of what its tools declare.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use agentq_agent::tools::SideEffect;

use super::section::section;
use super::values::Secret;

/// What a tool's name starts with when it comes from an MCP server.
pub const MCP_TOOL_PREFIX: &str = "mcp__";
/// Between the server's name and the tool's in a tool name.
pub const MCP_SEPARATOR: &str = "__";

/// A call's timeout unless configured.
pub const DEFAULT_MCP_TIMEOUT_SECS: u64 = 60;
pub const MAX_MCP_TIMEOUT_SECS: u64 = 3_600;
/// Calls one server runs at once unless configured.
pub const DEFAULT_MCP_MAX_CONCURRENT_CALLS: usize = 4;
pub const MAX_MCP_CONCURRENT_CALLS: usize = 256;
/// The largest message read from a server unless configured: 4 MiB. A larger answer
/// fails the call before it is held whole.
pub const DEFAULT_MCP_MAX_RESULT_BYTES: usize = 4 * 1024 * 1024;
pub const MAX_MCP_MAX_RESULT_BYTES: usize = 64 * 1024 * 1024;

fn d_timeout() -> u64 {
    DEFAULT_MCP_TIMEOUT_SECS
}

fn d_concurrency() -> usize {
    DEFAULT_MCP_MAX_CONCURRENT_CALLS
}

fn d_result_bytes() -> usize {
    DEFAULT_MCP_MAX_RESULT_BYTES
}

section! {
    /// `[mcp]`: the operator's MCP servers.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct McpSection {
        /// `[[mcp.servers]]`, each named once.
        pub servers: Vec<McpServerSettings> = Vec::new(),
    }
}

/// One `[[mcp.servers]]` entry: a program spoken to over stdio (`command`) or a
/// streamable-HTTP endpoint (`url`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSettings {
    /// `[a-z0-9_-]`, without `__`: the middle of its tools' names.
    pub name: String,
    /// The program, found on `PATH` or given as a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The variables the program sees, with the worker's values; it sees no others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// An http(s) URL; it is held to the same network rules as `http_fetch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Header name → the environment variable whose value is sent (never the value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "d_timeout")]
    pub timeout_secs: u64,
    #[serde(default = "d_concurrency")]
    pub max_concurrent_calls: usize,
    /// The largest message read from the server (a tool's result included).
    #[serde(default = "d_result_bytes")]
    pub max_result_bytes: usize,
    /// Tools the server marks `destructiveHint` need an approval, like `sensitive` ones.
    #[serde(default)]
    pub destructive_sensitive: bool,
    /// Per tool (its name on the server): what the operator says instead of its hints.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, McpToolSettings>,
    /// The values of `env`, read by the environment layer (unset ones are left out).
    #[serde(skip)]
    pub env_values: BTreeMap<String, Secret>,
    /// The values of `headers`, by header name, read by the environment layer.
    #[serde(skip)]
    pub header_values: BTreeMap<String, Secret>,
}

/// `[mcp.servers.tools.<tool>]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolSettings {
    /// Overrides the class the tool's annotations imply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effect: Option<SideEffectSetting>,
    /// Every call waits for an approval.
    #[serde(default)]
    pub sensitive: bool,
}

/// [`SideEffect`] as the file writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SideEffectSetting {
    Pure,
    Idempotent,
    Unsafe,
}

impl From<SideEffectSetting> for SideEffect {
    fn from(s: SideEffectSetting) -> SideEffect {
        match s {
            SideEffectSetting::Pure => SideEffect::Pure,
            SideEffectSetting::Idempotent => SideEffect::Idempotent,
            SideEffectSetting::Unsafe => SideEffect::Unsafe,
        }
    }
}

/// `mcp__<server>__<tool>`.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    format!("{MCP_TOOL_PREFIX}{server}{MCP_SEPARATOR}{tool}")
}

/// The server an MCP tool name (or `mcp__<server>__*`) names; `None` for other tools.
pub fn mcp_server_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(MCP_TOOL_PREFIX)?;
    let (server, _) = rest.split_once(MCP_SEPARATOR)?;
    (!server.is_empty()).then_some(server)
}
