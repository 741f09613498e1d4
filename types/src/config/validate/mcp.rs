//! The rules of `[mcp]`: each server named once with a name that can sit inside a tool's
//! name, spoken to one way, and its limits in range.

use std::collections::BTreeSet;

use super::hooks::{is_token_byte, webhook_url};
use super::rules::{invalid, range};
use crate::config::mcp::{
    MAX_MCP_CONCURRENT_CALLS, MAX_MCP_MAX_RESULT_BYTES, MAX_MCP_TIMEOUT_SECS, McpSection,
    McpServerSettings,
};
use crate::error::Result;

/// The longest server name: the tool names it makes stay short enough for the providers.
const MAX_SERVER_NAME_LEN: usize = 32;

pub(super) fn mcp(m: &McpSection) -> Result<()> {
    let mut seen = BTreeSet::new();
    for (i, s) in m.servers.iter().enumerate() {
        server(i, s)?;
        if !seen.insert(s.name.as_str()) {
            return Err(invalid(
                &format!("mcp.servers[{i}].name"),
                format!("`{}` names two servers", s.name),
            ));
        }
    }
    Ok(())
}

fn server(i: usize, s: &McpServerSettings) -> Result<()> {
    let key = |field: &str| format!("mcp.servers[{i}].{field}");
    server_name(&key("name"), &s.name)?;
    transport(i, s)?;
    variables_and_headers(i, s)?;
    range(
        &key("timeout_secs"),
        s.timeout_secs,
        1,
        MAX_MCP_TIMEOUT_SECS,
    )?;
    range(
        &key("max_concurrent_calls"),
        s.max_concurrent_calls,
        1,
        MAX_MCP_CONCURRENT_CALLS,
    )?;
    range(
        &key("max_result_bytes"),
        s.max_result_bytes,
        1024,
        MAX_MCP_MAX_RESULT_BYTES,
    )?;
    for tool in s.tools.keys() {
        if tool.trim().is_empty() {
            return Err(invalid(&key("tools"), "a tool's name must not be empty"));
        }
    }
    Ok(())
}

/// A server's name sits inside `mcp__<server>__<tool>`, so it must not make those names
/// ambiguous.
fn server_name(field: &str, name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > MAX_SERVER_NAME_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        || name.contains("__")
        || name.starts_with('_')
        || name.ends_with('_')
    {
        return Err(invalid(
            field,
            format!(
                "`{name}` must be 1 to {MAX_SERVER_NAME_LEN} of a-z, 0-9, `_` and `-`, \
                 without `__` and not starting or ending with `_` (it sits inside \
                 `mcp__<server>__<tool>`)"
            ),
        ));
    }
    Ok(())
}

/// Exactly one of `command` (stdio) and `url` (streamable HTTP), with only its own fields.
fn transport(i: usize, s: &McpServerSettings) -> Result<()> {
    let key = |field: &str| format!("mcp.servers[{i}].{field}");
    match (&s.command, &s.url) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                &key("url"),
                "a server is either a program (`command`) or an endpoint (`url`), not both",
            ));
        }
        (None, None) => {
            return Err(invalid(
                &format!("mcp.servers[{i}]"),
                "needs a `command` (stdio) or a `url` (streamable HTTP)",
            ));
        }
        (Some(c), None) => {
            if c.trim().is_empty() {
                return Err(invalid(&key("command"), "must name a program"));
            }
            if !s.headers.is_empty() {
                return Err(invalid(
                    &key("headers"),
                    "only a `url` server is sent headers",
                ));
            }
        }
        (None, Some(url)) => {
            webhook_url(&key("url"), url)?;
            if !s.args.is_empty() || !s.env.is_empty() {
                return Err(invalid(
                    &key(if s.args.is_empty() { "env" } else { "args" }),
                    "only a `command` server has arguments and an environment",
                ));
            }
        }
    }
    Ok(())
}

/// Names of variables, and of the headers they fill.
fn variables_and_headers(i: usize, s: &McpServerSettings) -> Result<()> {
    let key = |field: &str| format!("mcp.servers[{i}].{field}");
    for var in &s.env {
        if !is_variable_name(var) {
            return Err(invalid(
                &key("env"),
                format!("`{var}` is not an environment variable name"),
            ));
        }
    }
    for (header, var) in &s.headers {
        if header.is_empty() || !header.bytes().all(is_token_byte) {
            return Err(invalid(
                &key("headers"),
                format!("`{header}` is not a header name"),
            ));
        }
        if !is_variable_name(var) {
            return Err(invalid(
                &key(&format!("headers.{header}")),
                format!(
                    "`{var}` is not an environment variable name (the value is the name of \
                     the variable holding the header's value, never the value)"
                ),
            ));
        }
    }
    Ok(())
}

fn is_variable_name(v: &str) -> bool {
    !v.is_empty()
        && !v.starts_with(|c: char| c.is_ascii_digit())
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}
