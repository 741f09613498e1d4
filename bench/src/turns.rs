//! What every session of the bench asks and is answered: its prompt, the tool each turn
//! but the last calls ([`TRIVIAL`] in process, [`BUILTIN`] in `agentq worker` children,
//! [`MCP_TOOL`] with `--tool mcp`), what that tool says of itself and answers, and the text
//! of a turn and of the last one. The fake LLM and the scripted provider say the same, so
//! every part's messages weigh the same. [`spec`] is such a session.

use agentq_agent::spec::SessionSpec;

/// The tool the in-process parts call every iteration unless `--tool` names another: it
/// returns at once and touches nothing, so that the figures are agentq's own costs. It is
/// registered through `WorkerSettings::tools`, as an embedding program's tool would be.
pub const TRIVIAL: &str = "trivial";
/// The tool of the parts that run `agentq worker` children, which have only the built-in
/// tools (and of the in-process parts with `--tool list_dir`): one directory listing through
/// tokio's blocking pool.
pub const BUILTIN: &str = "list_dir";
/// `--tool mcp`: the in-process parts call [`MCP_TOOL`], which the bench's own stdio MCP
/// server answers (`agentq bench-mcp-server`, one per worker), against [`TRIVIAL`] in the
/// same run.
pub const MCP: &str = "mcp";
/// The subcommand of the `agentq` binary that serves it (hidden from `agentq --help`).
pub const MCP_SERVER_COMMAND: &str = "bench-mcp-server";
/// The bench's MCP server as the workers' settings name it.
pub const MCP_SERVER: &str = "bench";
/// Its one tool, as the server names it.
pub const MCP_REMOTE_TOOL: &str = "list_dir";
/// That tool as sessions name it (`mcp__<server>__<tool>`).
pub const MCP_TOOL: &str = "mcp__bench__list_dir";
/// What [`TRIVIAL`] and the MCP tool tell the model of themselves: the same words and
/// schema, so that both runs' requests weigh the same.
pub const TOOL_DESCRIPTION: &str =
    "List a directory of the workspace (answers at once: the workspace is empty).";
pub const PROMPT: &str = "Look at the workspace and tell me what is in it.";

/// What a turn says (a realistic, constant size).
pub const TURN_TEXT: &str = "I will look at the workspace to see which files are there before answering; \
     listing the directory is cheap and tells me where the relevant code lives.";
pub const FINAL_TEXT: &str = "The workspace is empty: there are no files to summarise, so there is nothing \
     further to do. Done.";

/// The input schema of [`TRIVIAL`] and of the MCP tool.
pub fn tool_parameters() -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), "object".into());
    m.insert(
        "properties".into(),
        serde_json::json!({"path": {"type": "string"}}),
    );
    m
}

/// What [`TRIVIAL`] and the MCP tool answer: what `list_dir` says of an empty workspace,
/// so that every tool's messages weigh the same.
pub fn tool_answer(args: Option<&serde_json::Map<String, serde_json::Value>>) -> String {
    let path = args
        .and_then(|a| a.get("path"))
        .and_then(|p| p.as_str())
        .unwrap_or(".");
    format!("{path}: (empty directory)")
}

/// The tool sessions call for a value of `--tool`.
pub fn session_tool(flag: &str) -> &'static str {
    match flag {
        MCP => MCP_TOOL,
        BUILTIN => BUILTIN,
        _ => TRIVIAL,
    }
}

/// A session of `iterations` turns that may call `tool`.
pub fn spec(iterations: u32, tool: &str) -> SessionSpec {
    let mut spec = SessionSpec::new(PROMPT);
    spec.tools = Some(vec![tool.into()]);
    spec.max_iterations = iterations + 5;
    // The whole history goes to the model (the scripted model picks its turn by counting
    // the assistant turns it is sent).
    spec.history_window = spec.history_window.max(2 * iterations as usize + 10);
    // The scripted model makes the same call every turn by design: the bench measures the
    // system, so no session of it ends `stuck` or carries repeat notes.
    spec.max_repeated_calls = 0;
    spec.warn_repeated_calls = 0;
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mcp_tool_is_named_as_a_worker_names_its_servers_tools() {
        assert_eq!(
            agentq_core::config::mcp_tool_name(MCP_SERVER, MCP_REMOTE_TOOL),
            MCP_TOOL
        );
        assert_eq!(session_tool(MCP), MCP_TOOL);
        assert_eq!(session_tool(BUILTIN), BUILTIN);
        assert_eq!(session_tool(TRIVIAL), TRIVIAL);
    }
}
