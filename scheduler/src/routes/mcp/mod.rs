//! `/mcp`: agentq as an MCP server (streamable HTTP), so that an agent in an editor or
//! another framework can hand work to agentq. Its tools ([`tools`]) are the session
//! routes of the REST API: each checks the scope its REST route needs and calls the same
//! function ([`crate::actions`]), as the caller the auth layer put in the request
//! (`/mcp` is [`Access::Key`](crate::http::auth::Access::Key): any valid key gets in, each
//! tool checks its scope). A refusal (a bad argument, another tenant's session, a missing
//! scope, a policy) is a tool result with `isError: true` holding the REST API's error
//! body, which names the field; only a message that is not JSON-RPC is a JSON-RPC error.
//!
//! Stateless: every POST is one JSON-RPC message answered on its own (JSON, no
//! `Mcp-Session-Id`), so any scheduler replica answers any request and nothing is held
//! between requests; a GET (a server-initiated stream) is 405. Before rmcp reads it, a
//! body passes the checks every body of the API passes ([`scan_envelope`]; a tool's
//! arguments then pass the whole scan), within the body limit of `POST /v1/sessions` (a
//! `submit_session` may carry files).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ContentBlock,
    ErrorData, Implementation, JsonRpcError, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use agentq_api::{ErrorBody, ErrorDetail};
use agentq_core::auth::Caller;

use crate::error::ApiError;
use crate::http::body::{require_json, scan_envelope};
use crate::http::refused_body::read_at_most;
use crate::state::Scheduler;

mod calls;
mod tools;
mod wait;

use tools::{Bounds, Name};

const INSTRUCTIONS: &str = "agentq runs LLM agent sessions as durable background jobs. \
    submit_session starts one (optionally with text files in its workspace); wait_session \
    or get_session follow it; list_files and read_file read what it wrote; list_approvals \
    and decide_approval answer the tool calls it holds for a human; cancel_session stops it.";

/// The handler of `POST /mcp` on `state`.
#[utoipa::path(
    post,
    path = "/mcp",
    operation_id = "mcp",
    summary = "MCP (streamable HTTP)",
    description = "One JSON-RPC 2.0 message per request, answered on its own as JSON (no \
        `Mcp-Session-Id`): `initialize`, `tools/list`, `tools/call`, … The tools are the \
        session routes, each needing the scope of its REST route; a refusal is a tool \
        result with `isError: true` holding the API's error body. Send `Accept: \
        application/json, text/event-stream`.",
    request_body(content = Object, description = "A JSON-RPC request, notification or \
        response", content_type = "application/json"),
    responses(
        (status = 200, description = "The JSON-RPC answer", content_type = "application/json",
            body = Object),
        (status = 202, description = "A notification or response, taken"),
        (status = 400, description = "A JSON-RPC error: not JSON (`-32700`), or not one \
            JSON-RPC message (`-32600`)", content_type = "application/json", body = Object),
    ),
)]
pub(in crate::routes) fn handler(state: &Scheduler) -> MethodRouter<Scheduler> {
    let mcp = Mcp::new(state);
    post(move |req: Request| mcp.handle(req))
}

/// The MCP service of `/mcp`.
#[derive(Clone)]
struct Mcp {
    service: StreamableHttpService<Server, NeverSessionManager>,
    body_limit: usize,
}

impl Mcp {
    fn new(state: &Scheduler) -> Mcp {
        let body_limit = state.single_body_limit();
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            // The router's own layers check `Host` (`agentq dev`) and `Origin`.
            .disable_allowed_hosts()
            .with_max_request_body_bytes(body_limit);
        let server = Server { s: state.clone() };
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        Mcp {
            service,
            body_limit,
        }
    }

    /// Answer one request of `/mcp`.
    async fn handle(self, req: Request) -> Response {
        if let Err(e) = require_json(req.headers()) {
            return e.into_response();
        }
        let (parts, body) = req.into_parts();
        let bytes = match read_at_most(&parts.headers, body, self.body_limit).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
        if let Err(refused) = check_message(&bytes) {
            return rpc_error(refused);
        }
        let req = Request::from_parts(parts, Body::from(bytes));
        self.service.handle(req).await.map(Body::new)
    }
}

/// A JSON-RPC error answer (no id: the message could not be read).
fn rpc_error(error: ErrorData) -> Response {
    let body = serde_json::to_vec(&JsonRpcError::new(None, error)).unwrap_or_default();
    let mut resp = (StatusCode::BAD_REQUEST, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Refuse, as a JSON-RPC error, a body that is not JSON (`-32700`), that breaks the
/// rules of every body of the API (a key twice, too many values: `-32600` naming where),
/// or that is not one JSON-RPC message (`-32600`). A NUL character in a value is left to
/// the tool whose argument it is, which names the field.
fn check_message(bytes: &[u8]) -> Result<(), ErrorData> {
    scan_envelope(bytes).map_err(|e| match e {
        ApiError::InvalidJson(m) => ErrorData::parse_error(m, None),
        e => {
            let message = match e.field() {
                Some(field) => format!("{field}: {e}"),
                None => e.to_string(),
            };
            ErrorData::invalid_request(message, None)
        }
    })?;
    serde_json::from_slice::<ClientJsonRpcMessage>(bytes).map_err(|e| {
        ErrorData::invalid_request(
            format!("not a JSON-RPC 2.0 request, notification or response: {e}"),
            None,
        )
    })?;
    Ok(())
}

/// The MCP server behind [`Mcp`]: one per request (it holds only the shared state).
#[derive(Clone)]
pub(super) struct Server {
    s: Scheduler,
}

impl Server {
    fn bounds(&self, tenant: &str) -> Bounds {
        Bounds {
            max_prompt_bytes: self.s.cfg.max_prompt_bytes,
            files: self.s.cfg.policy.for_tenant(tenant).files,
        }
    }
}

/// The caller the auth layer put in the HTTP request; without one (a route that did not
/// authenticate), nothing is served: fail closed.
fn caller(ctx: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Caller>())
        .cloned()
        .ok_or_else(|| {
            tracing::error!("an MCP request without a caller");
            ErrorData::internal_error("internal error", None)
        })
}

/// A refusal as a tool's error result: the REST API's error body.
fn error_result(e: &ApiError) -> CallToolResult {
    let body = ErrorBody {
        error: ErrorDetail {
            code: e.code().to_string(),
            message: e.to_string(),
            field: e.field().map(str::to_string),
        },
    };
    let text = serde_json::to_string(&body).unwrap_or_else(|_| e.to_string());
    CallToolResult::error(vec![ContentBlock::text(text)])
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("agentq", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = caller(&ctx)?;
        let bounds = self.bounds(&caller.tenant);
        // Only what this key may call: a model is not offered tools that would refuse it.
        let tools = Name::ALL
            .into_iter()
            .filter(|n| caller.allows(n.scope()))
            .map(|n| tools::tool(n, bounds))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = caller(&ctx)?;
        let Some(name) = Name::parse(&request.name) else {
            let shown: String = request.name.chars().take(64).collect();
            return Err(ErrorData::invalid_params(
                format!("unknown tool {shown:?}"),
                None,
            ));
        };
        let args = request.arguments.unwrap_or_default();
        let result = match calls::call(&self.s, &caller, name, args, &ctx.ct).await {
            Ok(value) => CallToolResult::success(vec![ContentBlock::text(value.to_string())]),
            Err(e) => error_result(&e),
        };
        Ok(result.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        Name::parse(name).map(|n| tools::tool(n, self.bounds(agentq_core::auth::DEFAULT_TENANT)))
    }
}
