//! The client side of MCP's streamable HTTP, on the workspace's HTTP client: each message
//! is POSTed to the server's one URL and the answer read as JSON or as an event stream,
//! every message bounded to `max_result_bytes` before it is parsed. The address is held to
//! `http_fetch`'s network rules and pinned once vetted; redirects are never followed;
//! the operator's headers (values from the environment) go with every request.
//!
//! Not implemented: the optional GET stream of server-initiated messages (a server's
//! notifications reach us only inside the answer to one of our requests), and resuming
//! a broken event stream.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Url, redirect};
use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentq_agent::tools::ToolSettings;
use agentq_agent::tools::http::vet;
use agentq_types::config::McpServerSettings;

use crate::error::{Error, Result};

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Of an error answer, only this much is read (for the message).
const ERROR_BODY_MAX: usize = 2048;

/// What every request of one connection shares.
struct Shared {
    client: reqwest::Client,
    url: Url,
    headers: HeaderMap,
    session: Mutex<Option<HeaderValue>>,
    protocol: Mutex<Option<HeaderValue>>,
    max: usize,
    server: String,
}

/// One connection to a streamable-HTTP server.
pub(crate) struct HttpTransport {
    shared: Arc<Shared>,
    tx: mpsc::Sender<ServerJsonRpcMessage>,
    rx: mpsc::Receiver<ServerJsonRpcMessage>,
    stop: CancellationToken,
}

impl HttpTransport {
    /// Vet the server's address under `net` and build the client that may reach only it.
    pub(crate) async fn connect(s: &McpServerSettings, net: &ToolSettings) -> Result<Self> {
        let start = |why: String| Error::Start {
            server: s.name.clone(),
            why,
        };
        let url = Url::parse(s.url.as_deref().unwrap_or_default())
            .map_err(|e| start(format!("url: {e}")))?;
        let pinned = vet(net, &url).await.map_err(|e| start(e.to_string()))?;
        // Proxies are off: a proxy would resolve the host itself, undoing the vetting.
        // HTTP/1.1, a connection per request in flight: one HTTP/2 connection would queue
        // a worker's calls past the server's stream limit.
        let mut builder = reqwest::Client::builder()
            .redirect(redirect::Policy::none())
            .no_proxy()
            .http1_only()
            .connect_timeout(CONNECT_TIMEOUT);
        if let Some((host, addrs)) = &pinned {
            builder = builder.resolve_to_addrs(host, addrs);
        }
        let client = builder
            .build()
            .map_err(|e| start(format!("cannot build an HTTP client: {e}")))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &s.header_values {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| start(format!("`{name}` is not a header name")))?;
            let value = HeaderValue::from_str(value.expose())
                .map_err(|_| start(format!("the value of header `{name}` is not valid")))?;
            headers.insert(name, value);
        }
        let (tx, rx) = mpsc::channel(64);
        Ok(HttpTransport {
            shared: Arc::new(Shared {
                client,
                url,
                headers,
                session: Mutex::new(None),
                protocol: Mutex::new(None),
                max: s.max_result_bytes,
                server: s.name.clone(),
            }),
            tx,
            rx,
            stop: CancellationToken::new(),
        })
    }
}

impl Transport<RoleClient> for HttpTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = std::result::Result<(), Self::Error>> + Send + 'static {
        let shared = self.shared.clone();
        let tx = self.tx.clone();
        let stop = self.stop.clone();
        async move {
            tokio::select! {
                r = post(&shared, &item, &tx) => r.map_err(std::io::Error::other),
                _ = stop.cancelled() => Err(std::io::Error::other("connection closed")),
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<ServerJsonRpcMessage>> + Send {
        let stop = self.stop.clone();
        let rx = &mut self.rx;
        async move {
            tokio::select! {
                m = rx.recv() => m,
                _ = stop.cancelled() => None,
            }
        }
    }

    async fn close(&mut self) -> std::result::Result<(), Self::Error> {
        self.stop.cancel();
        Ok(())
    }
}

/// POST one message; deliver what the server answers with (nothing, a JSON message or
/// batch, or an event stream of messages) to `tx`.
async fn post(
    shared: &Shared,
    item: &ClientJsonRpcMessage,
    tx: &mpsc::Sender<ServerJsonRpcMessage>,
) -> std::result::Result<(), String> {
    let server = &shared.server;
    let mut req = shared
        .client
        .post(shared.url.clone())
        .headers(shared.headers.clone())
        .header(ACCEPT, "application/json, text/event-stream")
        .json(item);
    for (name, slot) in [
        (SESSION_HEADER, &shared.session),
        (PROTOCOL_HEADER, &shared.protocol),
    ] {
        if let Some(v) = slot.lock().ok().and_then(|s| s.clone()) {
            req = req.header(name, v);
        }
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("MCP server `{server}` cannot be reached: {e}"))?;
    let status = resp.status();
    if status.is_redirection() {
        let to = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?");
        return Err(format!(
            "MCP server `{server}` answered HTTP {status} to {to}; redirects are not followed"
        ));
    }
    if let Some(id) = resp.headers().get(SESSION_HEADER)
        && let Ok(mut s) = shared.session.lock()
    {
        *s = Some(id.clone());
    }
    if !status.is_success() {
        let body = read_bounded(resp, ERROR_BODY_MAX).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        return Err(format!(
            "MCP server `{server}` answered HTTP {status}: {}",
            text.trim()
        ));
    }
    let kind = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if kind.starts_with("text/event-stream") {
        read_events(shared, resp, tx).await
    } else if kind.starts_with("application/json") {
        let body = read_bounded(resp, shared.max)
            .await
            .map_err(|e| too_big(server, shared.max, e))?;
        deliver(shared, &body, tx).await
    } else {
        // 202 Accepted and friends: nothing to read.
        Ok(())
    }
}

fn too_big(server: &str, max: usize, e: String) -> String {
    format!("MCP server `{server}`: {e} (max_result_bytes is {max})")
}

/// The body, failing as soon as it passes `max` bytes.
async fn read_bounded(resp: reqwest::Response, max: usize) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("reading the answer: {e}"))?;
        if out.len().saturating_add(chunk.len()) > max {
            return Err(format!("the answer is larger than {max} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// An event stream's `data`, one message per event, each bounded to `max` bytes.
async fn read_events(
    shared: &Shared,
    resp: reqwest::Response,
    tx: &mpsc::Sender<ServerJsonRpcMessage>,
) -> std::result::Result<(), String> {
    let max = shared.max;
    let mut body = resp.bytes_stream();
    let mut line: Vec<u8> = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("reading the event stream: {e}"))?;
        for &b in chunk.iter() {
            if b != b'\n' {
                line.push(b);
                if line.len().saturating_add(data.len()) > max {
                    return Err(too_big(
                        &shared.server,
                        max,
                        format!("an event is larger than {max} bytes"),
                    ));
                }
                continue;
            }
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.is_empty() {
                if !data.is_empty() {
                    deliver(shared, &data, tx).await?;
                    data.clear();
                }
            } else if let Some(rest) = line.strip_prefix(b"data:") {
                if !data.is_empty() {
                    data.push(b'\n');
                }
                data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
            }
            line.clear();
        }
    }
    if !data.is_empty() {
        deliver(shared, &data, tx).await?;
    }
    Ok(())
}

/// Parse one message (or a batch) and hand it to the service; remember the protocol
/// version the server chose, which every later request carries.
async fn deliver(
    shared: &Shared,
    body: &[u8],
    tx: &mpsc::Sender<ServerJsonRpcMessage>,
) -> std::result::Result<(), String> {
    let server = &shared.server;
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| format!("MCP server `{server}` sent something that is not JSON: {e}"))?;
    let messages = match value {
        Value::Array(batch) => batch,
        one => vec![one],
    };
    for m in messages {
        if let Some(v) = m.pointer("/result/protocolVersion").and_then(Value::as_str)
            && let Ok(v) = HeaderValue::from_str(v)
            && let Ok(mut p) = shared.protocol.lock()
        {
            *p = Some(v);
        }
        let msg: ServerJsonRpcMessage = serde_json::from_value(m).map_err(|e| {
            format!("MCP server `{server}` sent a message that is not JSON-RPC: {e}")
        })?;
        tx.send(msg)
            .await
            .map_err(|_| format!("the connection to MCP server `{server}` is closed"))?;
    }
    Ok(())
}
