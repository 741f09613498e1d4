//! [`McpTool`]: one MCP tool as a session's tool, and [`Unavailable`], the stand-in for
//! a tool whose server this worker does not have.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{CallToolResult, Tool as McpToolDef};
use serde_json::{Map, Value, json};

use agentq_agent::tools::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use agentq_types::config::mcp_tool_name;

use crate::schema;
use crate::server::McpServer;

/// `mcp__<server>__<tool>`: described to the model as its server describes it.
pub struct McpTool {
    name: String,
    server: Arc<McpServer>,
    /// The tool as the server listed it when the session's tools were chosen; `None`
    /// when it was not listed then (the server was down): looked up again at the call.
    def: Option<McpToolDef>,
    description: String,
}

impl McpTool {
    pub(crate) fn new(server: Arc<McpServer>, tool: &str, def: Option<McpToolDef>) -> McpTool {
        let description = match &def {
            Some(d) => d.description.as_deref().unwrap_or_default().to_string(),
            None => format!(
                "Tool `{tool}` of MCP server `{}` (not listed yet: the server is not up).",
                server.name()
            ),
        };
        McpTool {
            name: mcp_tool_name(server.name(), tool),
            server,
            def,
            description,
        }
    }

    /// The tool's name on its server.
    fn remote_name(&self) -> &str {
        self.name
            .strip_prefix(&mcp_tool_name(self.server.name(), ""))
            .unwrap_or(&self.name)
    }

    /// Whether every call needs an approval: the operator says so, or the server marks
    /// it destructive (which the protocol presumes of a tool that is not read-only)
    /// and the operator asked for those to be.
    pub fn is_sensitive(&self) -> bool {
        let settings = self.server.settings();
        if let Some(t) = settings.tools.get(self.remote_name())
            && t.sensitive
        {
            return true;
        }
        settings.destructive_sensitive
            && self.def.as_ref().is_none_or(|d| {
                let a = d.annotations.as_ref();
                let read_only = a.and_then(|a| a.read_only_hint).unwrap_or(false);
                !read_only && a.and_then(|a| a.destructive_hint).unwrap_or(true)
            })
    }

    fn current_def(&self) -> Option<McpToolDef> {
        if let Some(d) = &self.def {
            return Some(d.clone());
        }
        let remote = self.remote_name();
        self.server
            .tools()
            .iter()
            .find(|t| t.name == remote)
            .cloned()
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> Value {
        match &self.def {
            Some(d) => Value::Object((*d.input_schema).clone()),
            None => json!({"type": "object"}),
        }
    }

    /// The operator's word, else the annotations: `readOnlyHint` is pure,
    /// `idempotentHint` idempotent, anything else unsafe (never re-run after a crash).
    fn side_effect(&self, _args: &Value) -> SideEffect {
        if let Some(s) = self
            .server
            .settings()
            .tools
            .get(self.remote_name())
            .and_then(|t| t.side_effect)
        {
            return s.into();
        }
        let a = self.def.as_ref().and_then(|d| d.annotations.as_ref());
        if a.and_then(|a| a.read_only_hint) == Some(true) {
            SideEffect::Pure
        } else if a.and_then(|a| a.idempotent_hint) == Some(true) {
            SideEffect::Idempotent
        } else {
            SideEffect::Unsafe
        }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let args = match args {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "the arguments must be an object, not {other}"
                )));
            }
        };
        let remote = self.remote_name();
        let Some(def) = self.current_def() else {
            return Ok(ToolOutput::error(format!(
                "MCP server `{}` does not offer a tool `{remote}` now ({})",
                self.server.name(),
                describe_status(&self.server)
            )));
        };
        schema::check(&Value::Object(args.clone()), &def.input_schema)
            .map_err(ToolError::InvalidArguments)?;
        match self.server.call(remote, args, &ctx.cancel).await {
            Ok(result) => Ok(output(result)),
            Err(why) => Ok(ToolOutput::error(why)),
        }
    }
}

fn describe_status(server: &McpServer) -> String {
    match server.status() {
        crate::ServerStatus::Up => "it is up; its tools are listed with their names".into(),
        crate::ServerStatus::Starting => "it is starting".into(),
        crate::ServerStatus::Down(why) => format!("it is down: {why}"),
        crate::ServerStatus::Stopped => "it is stopped".into(),
    }
}

/// What the model is shown of a result: its text blocks; for other blocks, what they
/// are (their bytes are not text the model can read); the structured content when there
/// is no block. The driver truncates it like any tool's output.
fn output(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        let v = serde_json::to_value(block).unwrap_or(Value::Null);
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("unknown");
        match (kind, v.get("text").and_then(Value::as_str)) {
            ("text", Some(text)) => parts.push(text.to_string()),
            _ => {
                let mime = v.get("mimeType").and_then(Value::as_str).unwrap_or("");
                let uri = v
                    .pointer("/resource/uri")
                    .or_else(|| v.get("uri"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let text = v.pointer("/resource/text").and_then(Value::as_str);
                match text {
                    Some(t) => parts.push(format!("[resource {uri}]\n{t}")),
                    None => parts.push(format!("[{kind} content {mime}{uri} not shown]")),
                }
            }
        }
    }
    if parts.is_empty()
        && let Some(s) = &result.structured_content
    {
        parts.push(s.to_string());
    }
    let content = parts.join("\n");
    if result.is_error == Some(true) {
        ToolOutput::error(content)
    } else {
        ToolOutput::ok(content)
    }
}

/// A tool a session names whose server this worker does not run (the session was
/// started on a worker that has it): each call fails naming the server and this worker.
pub(crate) struct Unavailable {
    pub name: String,
    pub server: String,
    pub worker: String,
}

#[async_trait]
impl Tool for Unavailable {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "An MCP tool whose server is not configured on this worker."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }

    /// What the tool would do is not known here: a call another worker started before it
    /// died is reported as of unknown outcome, never taken for done.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Unsafe
    }

    async fn call(&self, _args: Value, _ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::error(format!(
            "MCP server `{}` is not configured on worker `{}`, so `{}` cannot run here",
            self.server, self.worker, self.name
        )))
    }
}
