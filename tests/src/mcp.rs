//! The real MCP servers the tests run: `mcp-server-time` (PyPI) and
//! `@modelcontextprotocol/server-everything` (npm), installed by `scripts/test` into the
//! test cache ([`crate::python::cache_dir`]), never system-wide.
//! `AGENTQ_MCP_TIME_SERVER` and `AGENTQ_MCP_EVERYTHING_SERVER` name other executables.

use std::path::PathBuf;

fn installed(var: &str, default: PathBuf, what: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or(default, PathBuf::from);
    assert!(
        path.is_file(),
        "{} not found: {what} is installed by scripts/test (or set {var})",
        path.display()
    );
    path
}

/// The `mcp-server-time` executable (a Python virtual environment's script).
pub fn mcp_time_server() -> PathBuf {
    installed(
        "AGENTQ_MCP_TIME_SERVER",
        crate::python::cache_dir().join("mcp/venv/bin/mcp-server-time"),
        "mcp-server-time (pip install mcp-server-time)",
    )
}

/// The `mcp-server-everything` executable (a Node script: it needs `PATH` to find
/// `node`).
pub fn mcp_everything_server() -> PathBuf {
    installed(
        "AGENTQ_MCP_EVERYTHING_SERVER",
        crate::python::cache_dir().join("mcp/npm/node_modules/.bin/mcp-server-everything"),
        "server-everything (npm install @modelcontextprotocol/server-everything)",
    )
}
