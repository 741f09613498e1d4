//! [`McpServer`]: one configured server on this worker — the task that keeps it connected
//! (start, handshake, list its tools, relist them when it says they changed, restart it
//! with a backoff when it exits or stops answering), and a call made through the
//! connection of the moment, bounded in time and in how many run at once.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, ElicitRequestParams, ElicitResult,
    ErrorCode, ErrorData, PaginatedRequestParams, PingRequest, Tool as McpToolDef,
};
// Sampling and roots are deprecated by the protocol, yet a server may still ask for them:
// they are refused explicitly rather than left to a default that may change.
#[allow(deprecated)]
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult, ListRootsResult};
use rmcp::service::{NotificationContext, Peer, RequestContext, RunningService, ServiceError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentq_agent::tools::ToolSettings;
use agentq_types::config::{McpServerSettings, mcp_tool_name};

use crate::error::{Error, Result};
use crate::http::HttpTransport;
use crate::stdio::{self, Fault, fault_of};

/// The first wait before a restart; it doubles with each failure in a row.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
/// The longest wait before a restart.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A connection that lasted this long was healthy: the next failure starts the backoff
/// afresh.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// How long a server that timed a call out has to answer a ping before it is restarted.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a stopping connection may take to close before it is dropped (and its
/// process killed).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most tools taken from one server: each goes to the model with every request of a
/// session that asks for the server's tools by a glob.
pub const MAX_TOOLS: usize = 1000;
/// Most pages of a tool list read.
pub const MAX_PAGES: usize = 100;
/// Longest description of a tool kept (longer ones are cut): it goes to the model with
/// every request.
pub const MAX_DESCRIPTION_BYTES: usize = 8 * 1024;
/// Largest input schema of a tool kept (as JSON; a tool with a larger one is left out):
/// it too goes to the model with every request, and arguments are checked against it.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest tool name, `mcp__<server>__<tool>` included: the shortest bound among the
/// model providers' (OpenAI's function names).
pub const MAX_TOOL_NAME: usize = 64;

/// Where a server is, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStatus {
    Starting,
    Up,
    /// Down for the reason given; it is restarted after a backoff.
    Down(String),
    Stopped,
}

#[derive(Clone)]
enum State {
    Starting,
    Up(Arc<Live>),
    Down(String),
    Stopped,
}

/// A connection and what the server said on it.
pub(crate) struct Live {
    peer: Peer<RoleClient>,
    tools: RwLock<Arc<Vec<McpToolDef>>>,
    fault: Fault,
    /// Cancelled to drop this connection (and restart the server).
    restart: CancellationToken,
}

/// One configured server.
pub struct McpServer {
    settings: McpServerSettings,
    net: ToolSettings,
    state: watch::Sender<State>,
    permits: Semaphore,
}

/// The client side's handler: it only hears that the tool list changed.
struct Handler {
    changed: Arc<Notify>,
}

#[allow(deprecated)]
impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }

    /// Refused: an LLM call a server asked for would be made outside every session's
    /// budget and metering, on a prompt the server wrote.
    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> std::result::Result<CreateMessageResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "agentq does not make LLM calls for an MCP server (sampling)",
            None,
        ))
    }

    /// Refused: no human watches a session to answer a server's questions.
    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> std::result::Result<ElicitResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "agentq does not ask a human for an MCP server (elicitation)",
            None,
        ))
    }

    /// Refused: the worker's folders are not the server's business.
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> std::result::Result<ListRootsResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "agentq lists no roots to an MCP server",
            None,
        ))
    }
}

impl McpServer {
    pub(crate) fn new(settings: McpServerSettings, net: ToolSettings) -> Arc<McpServer> {
        let permits = Semaphore::new(settings.max_concurrent_calls);
        Arc::new(McpServer {
            settings,
            net,
            state: watch::Sender::new(State::Starting),
            permits,
        })
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }

    pub(crate) fn settings(&self) -> &McpServerSettings {
        &self.settings
    }

    pub fn status(&self) -> ServerStatus {
        match &*self.state.borrow() {
            State::Starting => ServerStatus::Starting,
            State::Up(_) => ServerStatus::Up,
            State::Down(why) => ServerStatus::Down(why.clone()),
            State::Stopped => ServerStatus::Stopped,
        }
    }

    /// The server's tools as last listed (none while it is not up).
    pub fn tools(&self) -> Arc<Vec<McpToolDef>> {
        match &*self.state.borrow() {
            State::Up(live) => live.tools.read().map(|t| t.clone()).unwrap_or_default(),
            _ => Arc::default(),
        }
    }

    /// Wait until the server has been started (or failed to) at least once, at most
    /// `bound`.
    pub async fn settled(&self, bound: Duration) {
        let mut rx = self.state.subscribe();
        let _ = tokio::time::timeout(bound, rx.wait_for(|s| !matches!(s, State::Starting))).await;
    }

    /// Wait until the server is up with a tool list, at most `bound`.
    pub async fn up(&self, bound: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(bound, rx.wait_for(|s| matches!(s, State::Up(_))))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Wait until the server is up and lists `tool`, at most `bound`.
    pub async fn lists(&self, tool: &str, bound: Duration) -> bool {
        let mut rx = self.state.subscribe();
        let listed = |s: &State| match s {
            State::Up(live) => live
                .tools
                .read()
                .is_ok_and(|t| t.iter().any(|d| d.name == tool)),
            _ => false,
        };
        tokio::time::timeout(bound, rx.wait_for(listed))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Keep the server connected until `cancel`; then close it within a bound.
    pub(crate) async fn supervise(self: Arc<Self>, cancel: CancellationToken) {
        let mut failures: u32 = 0;
        while !cancel.is_cancelled() {
            let started = Instant::now();
            let why = self.run_once(&cancel).await;
            if cancel.is_cancelled() {
                break;
            }
            tracing::warn!(server = %self.name(), "MCP server down: {why}");
            self.state.send_replace(State::Down(why));
            if started.elapsed() >= HEALTHY_AFTER {
                failures = 0;
            }
            let delay = backoff(failures);
            failures = failures.saturating_add(1);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => break,
            }
        }
        self.state.send_replace(State::Stopped);
    }

    /// One connection, from start to its end; why it ended.
    async fn run_once(&self, cancel: &CancellationToken) -> String {
        let fault = Fault::default();
        let changed = Arc::new(Notify::new());
        let handler = Handler {
            changed: changed.clone(),
        };
        let handshake = self.handshake(handler, fault.clone());
        let (running, _child) = tokio::select! {
            r = tokio::time::timeout(self.call_timeout(), handshake) => match r {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => return e.to_string(),
                Err(_) => return format!(
                    "MCP server `{}` did not complete its handshake within {}s",
                    self.name(), self.settings.timeout_secs
                ),
            },
            _ = cancel.cancelled() => return "stopped".into(),
        };
        let peer = running.peer().clone();
        let live = Arc::new(Live {
            peer,
            tools: RwLock::default(),
            fault,
            restart: CancellationToken::new(),
        });
        if let Err(why) = self.relist(&live).await {
            close(running).await;
            return why;
        }
        self.state.send_replace(State::Up(live.clone()));
        tracing::info!(server = %self.name(), tools = live_tools(&live), "MCP server up");
        let stop = running.cancellation_token();
        let mut done = Box::pin(running.waiting());
        let why = loop {
            tokio::select! {
                r = &mut done => break match r {
                    Ok(reason) => format!("the connection ended ({reason:?})"),
                    Err(e) => format!("the connection's task failed: {e}"),
                },
                _ = changed.notified() => {
                    match self.relist(&live).await {
                        // Whoever waits on the server's state sees the new list.
                        Ok(()) => self.state.send_modify(|_| {}),
                        Err(why) => {
                            tracing::warn!(server = %self.name(), "cannot relist tools: {why}");
                        }
                    }
                }
                _ = live.restart.cancelled() => {
                    stop.cancel();
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, &mut done).await;
                    break "it stopped answering".to_string();
                }
                _ = cancel.cancelled() => {
                    stop.cancel();
                    let _ = tokio::time::timeout(CLOSE_TIMEOUT, &mut done).await;
                    break "stopped".to_string();
                }
            }
        };
        // The process (if any) is killed as `_child` drops.
        fault_of(&live.fault).unwrap_or(why)
    }

    /// Start the transport and complete the handshake. The stdio process is returned to be
    /// held for as long as the connection.
    async fn handshake(
        &self,
        handler: Handler,
        fault: Fault,
    ) -> Result<(
        RunningService<RoleClient, Handler>,
        Option<tokio::process::Child>,
    )> {
        let protocol = |e: rmcp::service::ClientInitializeError| Error::Protocol {
            server: self.name().to_string(),
            why: format!("handshake failed: {e}"),
        };
        if self.settings.command.is_some() {
            let p = stdio::spawn(&self.settings, fault)?;
            // One byte over the bound: our own reader trips first and says why.
            let transport = AsyncRwTransport::new_client(p.stdout, p.stdin)
                .with_max_line_length(self.settings.max_result_bytes.saturating_add(1));
            let running = handler.serve(transport).await.map_err(protocol)?;
            Ok((running, Some(p.child)))
        } else {
            let transport = HttpTransport::connect(&self.settings, &self.net).await?;
            let running = handler.serve(transport).await.map_err(protocol)?;
            Ok((running, None))
        }
    }

    async fn relist(&self, live: &Live) -> std::result::Result<(), String> {
        let listed = tokio::time::timeout(self.call_timeout(), list_tools(&live.peer, self.name()))
            .await
            .map_err(|_| {
                format!(
                    "MCP server `{}` did not list its tools in time",
                    self.name()
                )
            })?
            .map_err(|e| format!("MCP server `{}` cannot list its tools: {e}", self.name()))?;
        if let Ok(mut t) = live.tools.write() {
            *t = Arc::new(listed);
        }
        Ok(())
    }

    fn call_timeout(&self) -> Duration {
        Duration::from_secs(self.settings.timeout_secs)
    }

    /// Call `tool` with `args`: the result, or why not as the model is told. Dropping
    /// the future (the session was cancelled, the driver's timeout) sends
    /// `notifications/cancelled`.
    pub(crate) async fn call(
        &self,
        tool: &str,
        args: Map<String, Value>,
        cancel: &CancellationToken,
    ) -> std::result::Result<CallToolResult, String> {
        let name = self.name();
        let _permit = tokio::select! {
            p = self.permits.acquire() => p.map_err(|_| format!("MCP server `{name}` is stopped"))?,
            _ = cancel.cancelled() => return Err("cancelled".into()),
        };
        let live = self.live(cancel).await?;
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        let call = live.peer.call_tool(params);
        tokio::select! {
            r = tokio::time::timeout(self.call_timeout(), call) => match r {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(e)) => Err(self.describe(&live, e)),
                Err(_) => {
                    probe(live.clone());
                    Err(format!(
                        "MCP server `{name}` did not answer `{tool}` within {}s",
                        self.settings.timeout_secs
                    ))
                }
            },
            _ = cancel.cancelled() => Err("cancelled".into()),
        }
    }

    /// The connection of the moment, waiting (at most a call's timeout) for one that is
    /// being started.
    async fn live(&self, cancel: &CancellationToken) -> std::result::Result<Arc<Live>, String> {
        let name = self.name();
        let mut rx = self.state.subscribe();
        let wait = rx.wait_for(|s| !matches!(s, State::Starting));
        let state = tokio::select! {
            r = tokio::time::timeout(self.call_timeout(), wait) => match r {
                Ok(Ok(s)) => s.clone(),
                _ => return Err(format!("MCP server `{name}` is still starting")),
            },
            _ = cancel.cancelled() => return Err("cancelled".into()),
        };
        match state {
            State::Up(live) => Ok(live),
            State::Down(why) => Err(format!(
                "MCP server `{name}` is down ({why}); it is being restarted"
            )),
            State::Stopped => Err(format!("MCP server `{name}` is stopped")),
            State::Starting => Err(format!("MCP server `{name}` is still starting")),
        }
    }

    fn describe(&self, live: &Live, e: ServiceError) -> String {
        let name = self.name();
        if let Some(fault) = fault_of(&live.fault) {
            return fault;
        }
        match e {
            ServiceError::McpError(err) => {
                format!("MCP server `{name}` refused the call: {}", err.message)
            }
            ServiceError::TransportClosed => {
                format!("MCP server `{name}` stopped during the call (it is being restarted)")
            }
            other => format!("MCP server `{name}`: {other}"),
        }
    }
}

/// The server's tools, page after page, at most [`MAX_TOOLS`] of them over at most
/// [`MAX_PAGES`] pages: a server that pages without end, or lists more tools than any
/// model can be offered, is cut there (and a warning says so) instead of filling the
/// worker's memory until the timeout. A tool whose name a model provider would refuse
/// ([`usable_name`]), whose schema is too large, or that was listed before, is left out;
/// a description too long is cut.
async fn list_tools(
    peer: &Peer<RoleClient>,
    server: &str,
) -> std::result::Result<Vec<McpToolDef>, ServiceError> {
    let mut tools: Vec<McpToolDef> = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let params = PaginatedRequestParams::default().with_cursor(cursor);
        let page = peer.list_tools(Some(params)).await?;
        for t in page.tools {
            if tools.len() >= MAX_TOOLS {
                tracing::warn!(
                    server,
                    "MCP server lists more than {MAX_TOOLS} tools; the first {MAX_TOOLS} are used"
                );
                return Ok(tools);
            }
            if !usable_name(server, &t.name) {
                let shown: String = t.name.chars().take(64).collect();
                tracing::warn!(server, tool = ?shown, "MCP tool left out: its name is not 1 to {MAX_TOOL_NAME} of A-Z, a-z, 0-9, _ and - once prefixed");
                continue;
            }
            let schema_bytes = serde_json::to_vec(&*t.input_schema).map_or(usize::MAX, |b| b.len());
            if schema_bytes > MAX_SCHEMA_BYTES {
                tracing::warn!(server, tool = %t.name, "MCP tool left out: its input schema is over {MAX_SCHEMA_BYTES} bytes");
                continue;
            }
            if tools.iter().any(|seen| seen.name == t.name) {
                tracing::warn!(server, tool = %t.name, "MCP tool listed twice; the first is used");
                continue;
            }
            let mut t = t;
            if let Some(d) = &t.description
                && d.len() > MAX_DESCRIPTION_BYTES
            {
                let mut end = MAX_DESCRIPTION_BYTES;
                while !d.is_char_boundary(end) {
                    end -= 1;
                }
                t.description = Some(d[..end].to_string().into());
            }
            tools.push(t);
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            return Ok(tools);
        }
    }
    tracing::warn!(
        server,
        "MCP server's tool list goes on past {MAX_PAGES} pages; the first {MAX_PAGES} are used"
    );
    Ok(tools)
}

/// Whether `mcp__<server>__<tool>` is a name every model provider takes for a function:
/// 1 to [`MAX_TOOL_NAME`] of `A-Z a-z 0-9 _ -`. Another name (a control character, a
/// space, thousands of characters) would make the provider refuse the whole request of
/// every session offered the tool.
fn usable_name(server: &str, tool: &str) -> bool {
    !tool.is_empty()
        && mcp_tool_name(server, tool).len() <= MAX_TOOL_NAME
        && tool
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Ask a server that let a call time out whether it still answers; restart it if not.
fn probe(live: Arc<Live>) {
    tokio::spawn(async move {
        let ping = live
            .peer
            .send_request(ClientRequest::PingRequest(PingRequest::default()));
        if !matches!(tokio::time::timeout(PING_TIMEOUT, ping).await, Ok(Ok(_))) {
            live.restart.cancel();
        }
    });
}

async fn close(running: RunningService<RoleClient, Handler>) {
    let stop = running.cancellation_token();
    stop.cancel();
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, running.waiting()).await;
}

fn live_tools(live: &Live) -> usize {
    live.tools.read().map(|t| t.len()).unwrap_or(0)
}

/// The wait before the restart after `failures` failures in a row.
fn backoff(failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX);
    BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
}
