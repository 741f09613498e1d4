//! [`McpServers`]: every server of `[mcp]` on one worker, started together and stopped
//! by one token, and the choice of a session's MCP tools among theirs ([`McpTools`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use globset::Glob;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use agentq_agent::tools::{ToolRegistry, ToolSettings};
use agentq_types::config::{MCP_TOOL_PREFIX, McpServerSettings, mcp_server_of, mcp_tool_name};

use crate::server::McpServer;
use crate::tool::{McpTool, Unavailable};

/// The servers a worker runs.
#[derive(Clone, Default)]
pub struct McpServers {
    servers: BTreeMap<String, Arc<McpServer>>,
    worker: String,
    tasks: TaskTracker,
}

/// A session's MCP tools and, of them, those that need an approval.
#[derive(Default)]
pub struct McpTools {
    pub registry: ToolRegistry,
    pub sensitive: Vec<String>,
}

impl McpServers {
    /// Start each of `settings` (HTTP servers held to `net`, the worker's network rules)
    /// until `cancel`. `worker` names this worker in the errors of tools it lacks.
    pub fn start(
        settings: &[McpServerSettings],
        net: &ToolSettings,
        worker: &str,
        cancel: &CancellationToken,
    ) -> McpServers {
        let tasks = TaskTracker::new();
        let mut servers = BTreeMap::new();
        for s in settings {
            let server = McpServer::new(s.clone(), net.clone());
            tasks.spawn(server.clone().supervise(cancel.clone()));
            servers.insert(s.name.clone(), server);
        }
        tasks.close();
        McpServers {
            servers,
            worker: worker.to_string(),
            tasks,
        }
    }

    /// None at all (a worker without `[mcp]`).
    pub fn none(worker: &str) -> McpServers {
        let tasks = TaskTracker::new();
        tasks.close();
        McpServers {
            worker: worker.to_string(),
            tasks,
            ..McpServers::default()
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<McpServer>> {
        self.servers.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Wait until every server has been started (or failed to) once, at most `bound`.
    pub async fn settled(&self, bound: Duration) {
        let all = self.servers.values().map(|s| s.settled(bound));
        futures::future::join_all(all).await;
    }

    /// Wait, after the start's token was cancelled, until every server is closed (each
    /// takes a bounded time).
    pub async fn stopped(&self) {
        self.tasks.wait().await;
    }

    /// Of `wanted` (a session's tool names), the MCP ones: exact names
    /// (`mcp__time__get_current_time`) and globs (`mcp__time__*`) over the tools the
    /// servers list now. An exact name of a server this worker lacks becomes a tool whose
    /// calls fail naming the server and this worker; one its server does not list (yet)
    /// is looked up again when called.
    pub fn select(&self, wanted: &[String]) -> McpTools {
        let mut out = McpTools::default();
        let add = |tool: McpTool, out: &mut McpTools| {
            if tool.is_sensitive() {
                out.sensitive
                    .push(agentq_agent::tools::Tool::name(&tool).to_string());
            }
            out.registry.register(Arc::new(tool));
        };
        for name in wanted.iter().filter(|n| n.starts_with(MCP_TOOL_PREFIX)) {
            let Some(server_name) = mcp_server_of(name) else {
                continue;
            };
            let Some(server) = self.servers.get(server_name) else {
                if !is_glob(name) {
                    out.registry.register(Arc::new(Unavailable {
                        name: name.clone(),
                        server: server_name.to_string(),
                        worker: self.worker.clone(),
                    }));
                }
                continue;
            };
            let listed = server.tools();
            if is_glob(name) {
                let Ok(glob) = Glob::new(name) else { continue };
                let m = glob.compile_matcher();
                for def in listed.iter() {
                    if m.is_match(mcp_tool_name(server_name, &def.name)) {
                        add(
                            McpTool::new(server.clone(), &def.name, Some(def.clone())),
                            &mut out,
                        );
                    }
                }
            } else {
                let remote = &name[mcp_tool_name(server_name, "").len()..];
                let def = listed.iter().find(|d| d.name == remote).cloned();
                add(McpTool::new(server.clone(), remote, def), &mut out);
            }
        }
        out
    }
}

fn is_glob(name: &str) -> bool {
    name.contains(['*', '?', '[', '{'])
}
