//! The MCP server of `--tool mcp`: `agentq bench-mcp-server` (a hidden subcommand of the
//! one binary, so nothing more is installed), which each in-process worker starts over
//! stdio as it starts any operator's `[[mcp.servers]]` entry; the settings that make a
//! worker start it; and the count of calls it answered, kept in a file that the bench
//! reads, so that a run whose MCP calls failed (and whose sessions went on regardless,
//! the scripted model being indifferent to what a tool says) is caught, not measured.
//!
//! The server is real but minimal: rmcp over the process's standard streams, one
//! read-only tool that answers at once what [`TRIVIAL`](crate::turns::TRIVIAL) answers.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use anyhow::{Context, bail};
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};

use agentq_core::config::{
    DEFAULT_MCP_MAX_RESULT_BYTES, DEFAULT_MCP_TIMEOUT_SECS, MAX_MCP_CONCURRENT_CALLS,
    McpServerSettings,
};

use crate::env::Env;
use crate::turns::{
    MCP_REMOTE_TOOL, MCP_SERVER, MCP_SERVER_COMMAND, TOOL_DESCRIPTION, tool_answer, tool_parameters,
};

/// The longest count file the bench reads: a number and a newline.
const MAX_SERVED_BYTES: u64 = 64;

/// `agentq bench-mcp-server`: what `agentq bench --tool mcp` starts, once per worker.
#[derive(Args, Debug, Clone)]
pub struct McpServerArgs {
    /// Where to keep the number of tool calls answered (created, or emptied, at the start,
    /// then rewritten before each answer).
    #[arg(long)]
    pub served: PathBuf,
}

/// Serve MCP on stdin/stdout until the client closes them.
pub async fn serve(args: McpServerArgs) -> anyhow::Result<ExitCode> {
    let file = File::create(&args.served)
        .with_context(|| format!("--served {}: cannot create it", args.served.display()))?;
    let server = Server {
        served: Mutex::new(Served { count: 0, file }),
    };
    // A server that starts and answers nothing reads as 0, not as one that never started.
    server
        .record(0)
        .with_context(|| format!("--served {}: cannot write it", args.served.display()))?;
    // The pipes through the reactor, not through the blocking pool (a thread hand-off per
    // message): the figure is the client's cost, and the server's own should stay small.
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .context("the MCP handshake on stdin/stdout")?;
    running.waiting().await.context("serving MCP")?;
    Ok(ExitCode::SUCCESS)
}

struct Served {
    count: u64,
    file: File,
}

struct Server {
    served: Mutex<Served>,
}

impl Server {
    /// Count one answered call (`add` = 1), or write the count as it is (`add` = 0).
    fn record(&self, add: u64) -> std::io::Result<()> {
        let mut s = self.served.lock().unwrap_or_else(|e| e.into_inner());
        s.count = s.count.saturating_add(add);
        // A fixed width, written in place: a count never reads as the end of a longer
        // earlier one.
        let text = format!("{:>20}\n", s.count);
        s.file.write_all_at(text.as_bytes(), 0)
    }
}

/// The one tool, as listed: read-only, so the worker runs it as pure, like `trivial`.
fn tool() -> Tool {
    Tool::new(MCP_REMOTE_TOOL, TOOL_DESCRIPTION, tool_parameters()).annotate(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("agentq-bench", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != MCP_REMOTE_TOOL {
            let shown: String = request.name.chars().take(64).collect();
            return Err(ErrorData::invalid_params(
                format!("unknown tool {shown:?}"),
                None,
            ));
        }
        let answer = tool_answer(request.arguments.as_ref());
        // Counted before the answer goes: a call counts once the server has answered it.
        self.record(1)
            .map_err(|e| ErrorData::internal_error(format!("counting the call: {e}"), None))?;
        Ok(CallToolResult::success(vec![ContentBlock::text(answer)]).into())
    }
}

/// Where the server of the worker named `worker` keeps its count.
pub(crate) fn served_path(env: &Env, worker: &str) -> PathBuf {
    env.scratch.join(format!("mcp-served-{worker}"))
}

/// The `[[mcp.servers]]` entry that has the worker named `worker` start the bench's
/// server: this `agentq` binary, by path (a worker looks a bare name up on `PATH`), with
/// no environment (a worker passes none it is not told to). Up to `concurrency` calls at
/// once, a worker's sessions, so that the figure is the transport's cost rather than a
/// queue behind the default of 4 calls at once.
pub(crate) fn server_settings(
    env: &Env,
    worker: &str,
    concurrency: usize,
) -> anyhow::Result<McpServerSettings> {
    let exe = env.agentq_binary()?;
    let served = served_path(env, worker);
    let text = |p: &Path| {
        p.to_str()
            .map(str::to_string)
            .with_context(|| format!("{} is not UTF-8", p.display()))
    };
    Ok(McpServerSettings {
        name: MCP_SERVER.into(),
        command: Some(text(&exe)?),
        args: vec![MCP_SERVER_COMMAND.into(), "--served".into(), text(&served)?],
        env: Vec::new(),
        url: None,
        headers: BTreeMap::new(),
        timeout_secs: DEFAULT_MCP_TIMEOUT_SECS,
        max_concurrent_calls: concurrency.clamp(1, MAX_MCP_CONCURRENT_CALLS),
        max_result_bytes: DEFAULT_MCP_MAX_RESULT_BYTES,
        destructive_sensitive: false,
        tools: BTreeMap::new(),
        env_values: BTreeMap::new(),
        header_values: BTreeMap::new(),
    })
}

/// The calls a server counted in `path`; 0 when it never started (no file).
pub(crate) fn served(path: &Path) -> anyhow::Result<u64> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_SERVED_BYTES), &mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    match text.trim().parse() {
        Ok(n) => Ok(n),
        Err(_) => bail!(
            "{}: not a count of calls ({:?})",
            path.display(),
            text.trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn server(dir: &Path) -> (Server, PathBuf) {
        let path = dir.join("served");
        let file = File::create(&path).unwrap();
        (
            Server {
                served: Mutex::new(Served { count: 0, file }),
            },
            path,
        )
    }

    #[test]
    fn the_count_file_reads_back_each_count_written_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let (s, path) = server(dir.path());
        s.record(0).unwrap();
        assert_eq!(served(&path).unwrap(), 0);
        for _ in 0..12 {
            s.record(1).unwrap();
        }
        assert_eq!(served(&path).unwrap(), 12);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 21);
    }

    #[test]
    fn a_server_that_never_started_served_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(served(&dir.path().join("none")).unwrap(), 0);
    }

    /// The file is the bench's own, but a stray or cut one must fail the run, never
    /// count as calls.
    #[test]
    fn a_count_file_that_holds_no_count_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("served");
        for bad in [
            "",
            "12x",
            "-3",
            "99999999999999999999999999",
            &"7".repeat(200),
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = served(&path).expect_err(bad);
            assert!(e.to_string().contains("not a count"), "{bad:?}: {e}");
        }
    }

    /// The server over an in-memory pipe, as a worker's client speaks to it: the tool is
    /// listed, a call is answered and counted; a call of another tool, or with a path
    /// that is not a string, is answered as such and only answered calls count.
    #[tokio::test]
    async fn a_client_lists_and_calls_the_tool_and_only_answered_calls_count() {
        use rmcp::model::JsonObject;

        let dir = tempfile::tempdir().unwrap();
        let (s, path) = server(dir.path());
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let served_task = tokio::spawn(async move {
            let running = s.serve(tokio::io::split(server_io)).await.unwrap();
            running.waiting().await.unwrap();
        });
        let client = ().serve(tokio::io::split(client_io)).await.unwrap();
        let tools = client.list_all_tools().await.unwrap();
        assert_eq!(
            tools.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>(),
            [MCP_REMOTE_TOOL]
        );
        let call = |args: serde_json::Value| {
            let args: JsonObject = serde_json::from_value(args).unwrap();
            CallToolRequestParams::new(MCP_REMOTE_TOOL).with_arguments(args)
        };
        let text = |r: CallToolResult| {
            serde_json::to_value(&r.content).unwrap()[0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let r = client
            .call_tool(call(serde_json::json!({"path": "src"})))
            .await
            .unwrap();
        assert_eq!(r.is_error, Some(false));
        assert_eq!(text(r), "src: (empty directory)");
        let r = client
            .call_tool(call(serde_json::json!({"path": {"$ne": 1}})))
            .await
            .unwrap();
        assert_eq!(text(r), ".: (empty directory)");
        let other = client.call_tool(CallToolRequestParams::new("shell")).await;
        assert!(other.is_err(), "{other:?}");
        assert_eq!(served(&path).unwrap(), 2);
        client.cancel().await.unwrap();
        served_task.await.unwrap();
    }

    #[test]
    fn the_tool_is_listed_read_only_with_the_trivial_tools_words() {
        let t = tool();
        assert_eq!(t.name, MCP_REMOTE_TOOL);
        assert_eq!(t.description.as_deref(), Some(TOOL_DESCRIPTION));
        assert_eq!(*t.input_schema, tool_parameters());
        assert_eq!(t.annotations.and_then(|a| a.read_only_hint), Some(true));
    }
}
