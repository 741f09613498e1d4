//! The `Tool` trait, the context a call runs in, the `Workspace` file tools act on, the
//! registry a session's tool set is built from, and the built-in tools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::schema::ToolSpec;

mod error;
pub mod fs;
pub mod http;
mod settings;
pub mod shared_specs;
pub mod shell;
pub mod skills;
pub mod workspace;

pub use error::ToolError;
pub use settings::{DEFAULT_MAX_FILE_BYTES, DEFAULT_WORKSPACE_QUOTA_BYTES, ToolSettings};
pub use workspace::{Changes, LocalWorkspace, Workspace, WriteLimits};

/// What re-running a call whose result was not saved would do (issue: durability of
/// tool side effects). The loop re-runs `Pure` and `Idempotent` calls on resume and
/// reports `Unsafe` ones as "outcome unknown".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideEffect {
    Pure,
    Idempotent,
    Unsafe,
}

/// What a tool returns. `content` goes to the model as the tool result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
    /// End the loop after this call (exit reason `yielded`).
    pub yield_loop: bool,
    /// The call cannot finish yet (e.g. it waits for a sub-agent): record no result and
    /// suspend the session; the call runs again when the session resumes.
    pub suspend: bool,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            ..Default::default()
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: true,
            ..Default::default()
        }
    }
}

/// Everything a tool call may use besides its arguments.
#[derive(Clone)]
pub struct ToolContext {
    pub session_id: String,
    pub tool_call_id: String,
    /// `session_id:tool_call_id`: stable across re-runs, for tools with side effects.
    pub idempotency_key: String,
    pub workspace: Arc<dyn Workspace>,
    pub settings: Arc<ToolSettings>,
    pub cancel: CancellationToken,
}

#[async_trait]
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    /// JSON Schema of the arguments object.
    fn parameters(&self) -> Value;
    /// Decided per call: the same tool can be safe to repeat for some arguments (GET)
    /// and not for others (POST). A tool that says nothing is taken to be `Idempotent`:
    /// re-run on resume, but never run before its response is committed.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Idempotent
    }
    /// Paths (relative to the workspace) this call would touch, for the firewall.
    fn paths(&self, _args: &Value) -> Vec<String> {
        Vec::new()
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError>;

    /// The same for the tool object's whole life: runs offering these very tool objects
    /// share the specs one of them built ([`shared_specs::share_registry`]).
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name().to_string(),
            description: self.description().to_string(),
            parameters: self.parameters(),
        }
    }
}

/// The tools a session may call, by name. Ordered so that the tool list sent to the model
/// is stable across runs (prompt caching, replay).
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_string(), tool);
    }

    /// Add every tool of `other`; one with a name already here replaces it.
    pub fn extend(&mut self, other: &ToolRegistry) {
        for (name, tool) in &other.tools {
            self.tools.insert(name.clone(), tool.clone());
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|t| t.spec()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Keep only the named tools; an unknown name is an error naming it.
    pub fn select(&self, names: &[String]) -> Result<ToolRegistry, String> {
        let mut out = ToolRegistry::new();
        for n in names {
            let tool = self.get(n).ok_or_else(|| {
                format!(
                    "unknown tool `{n}` (available: {})",
                    self.names().join(", ")
                )
            })?;
            out.register(tool.clone());
        }
        Ok(out)
    }
}

/// Names of the built-in tools that only read. They are the default set: a session that
/// names no tools can look at its workspace but change nothing.
pub const READ_ONLY_TOOLS: &[&str] = &["read_file", "list_dir", "glob", "grep"];

/// Every built-in tool. `shell` is included only when the settings enable it.
pub fn builtin_registry(settings: &ToolSettings) -> ToolRegistry {
    let mut r = ToolRegistry::new();
    r.register(Arc::new(fs::ReadFile));
    r.register(Arc::new(fs::WriteFile));
    r.register(Arc::new(fs::EditFile));
    r.register(Arc::new(fs::ListDir));
    r.register(Arc::new(fs::Glob));
    r.register(Arc::new(fs::Grep));
    r.register(Arc::new(http::HttpFetch));
    if settings.shell_enabled {
        r.register(Arc::new(shell::Shell));
    }
    r
}

/// Make `p` relative-to-root and refuse anything that escapes `root` lexically
/// (`..`, absolute paths elsewhere). Symlinks are checked by the workspace.
pub fn normalize_relative(root: &Path, p: &str) -> Result<PathBuf, ToolError> {
    workspace::normalize_relative(root, p)
}
