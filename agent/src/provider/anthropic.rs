//! The Anthropic Messages provider: converts the neutral history into Messages API turns
//! (content blocks, strict role alternation, tool results paired with the preceding
//! `tool_use`, thinking blocks replayed with their signatures) and decodes the streamed
//! answer into [`LlmEvent`]s. The wire format stays inside this module.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::provider::sse::{SseEvent, error_chain, sse_events};
use crate::provider::{HttpTimeouts, LlmEvent, LlmProvider, LlmRequest, LlmStream, f32_for_json};
use crate::schema::{FinishReason, Message, Role, ToolCall, ToolSpec, Usage};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const DEFAULT_VERSION: &str = "2023-06-01";

/// How to reach the Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// Without the `/v1/messages` suffix, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    /// Sent as `x-api-key`. `None` is allowed for gateways that authenticate otherwise.
    pub api_key: Option<String>,
    /// The `anthropic-version` header.
    pub version: String,
    pub timeouts: HttpTimeouts,
    /// Enables extended thinking with this token budget.
    pub thinking_budget: Option<u32>,
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        AnthropicConfig {
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            version: DEFAULT_VERSION.to_string(),
            timeouts: HttpTimeouts::default(),
            thinking_budget: None,
        }
    }
}

impl AnthropicConfig {
    /// `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`) and `ANTHROPIC_API_KEY`.
    pub fn from_env() -> Self {
        let non_empty = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        AnthropicConfig {
            base_url: non_empty("ANTHROPIC_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.into()),
            api_key: non_empty("ANTHROPIC_API_KEY"),
            ..AnthropicConfig::default()
        }
    }
}

pub struct AnthropicProvider {
    client: reqwest::Client,
    config: AnthropicConfig,
    url: String,
}

impl std::fmt::Debug for AnthropicProvider {
    // Hand-written so the API key never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("url", &self.url)
            .field("version", &self.config.version)
            .field("thinking_budget", &self.config.thinking_budget)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    pub fn new(config: AnthropicConfig) -> Result<Self> {
        let base = config.base_url.trim().trim_end_matches('/');
        let url = format!("{base}/v1/messages");
        reqwest::Url::parse(&url)
            .map_err(|e| Error::Config(format!("anthropic base URL {base:?}: {e}")))?;
        if let Some(key) = &config.api_key
            && reqwest::header::HeaderValue::from_str(key).is_err()
        {
            return Err(Error::Config(
                "ANTHROPIC_API_KEY contains characters not allowed in a header".into(),
            ));
        }
        // Only a connect timeout: a total timeout would kill long but healthy streams; the
        // idle timeout between chunks is enforced by the SSE reader.
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeouts.connect)
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(AnthropicProvider {
            client,
            config,
            url,
        })
    }

    /// The request body exactly as it is POSTed; public so tests and tools can inspect it.
    pub fn request_body(&self, request: &LlmRequest<'_>) -> Value {
        build_body(request, self.config.thinking_budget)
    }

    /// The bytes POSTed for `request`: [`AnthropicProvider::request_body`], serialized
    /// straight from the wire structs.
    pub fn request_bytes(&self, request: &LlmRequest<'_>) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec(&wire_request(
            request,
            self.config.thinking_budget,
        ))?)
    }
}

#[async_trait]
impl LlmProvider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
    }

    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream> {
        // Only the bytes wait for the answer, not a JSON tree several times their size (a
        // session's request is in flight for the model's whole latency).
        let body = self.request_bytes(request)?;
        let mut req = self
            .client
            .post(&self.url)
            .header("anthropic-version", &self.config.version)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body);
        if let Some(key) = &self.config.api_key {
            req = req.header("x-api-key", key);
        }
        // Waiting for the response head counts as silence before the first chunk.
        let resp = match tokio::time::timeout(self.config.timeouts.idle, req.send()).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => {
                return Err(Error::Transport(format!(
                    "POST {}: {}",
                    self.url,
                    error_chain(&e)
                )));
            }
            Err(_) => {
                return Err(Error::Transport(format!(
                    "POST {}: no response within {:?}",
                    self.url, self.config.timeouts.idle
                )));
            }
        };
        let status = resp.status();
        if !status.is_success() {
            return Err(http_error(resp, self.config.timeouts.idle).await);
        }
        let events = sse_events(resp, self.config.timeouts.idle);
        Ok(decode_stream(events))
    }
}

async fn http_error(resp: reqwest::Response, idle: std::time::Duration) -> Error {
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::provider::parse_retry_after);
    // An error body that never finishes must not hang the caller; the status says enough.
    let text = tokio::time::timeout(idle, resp.text())
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default();
    let parsed = serde_json::from_str::<Value>(&text).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let code = err
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let message = err
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            let t = text.trim();
            if t.is_empty() {
                status.canonical_reason().unwrap_or("error").to_string()
            } else {
                t.chars().take(500).collect()
            }
        });
    if status.as_u16() == 400 && message.contains("prompt is too long") {
        return Error::ContextLength(message);
    }
    Error::Http {
        status: status.as_u16(),
        message,
        code,
        retry_after,
    }
}

// ---------------------------------------------------------------------------------------
// Request conversion

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<WireThinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    messages: Vec<WireTurn<'a>>,
}

#[derive(Serialize)]
struct WireThinking {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: Cow<'a, Value>,
}

#[derive(Serialize)]
struct WireTurn<'a> {
    role: &'static str,
    content: TurnContent<'a>,
}

/// A user turn of one text block goes out as a plain string, like the SDKs send it.
#[derive(Serialize)]
#[serde(untagged)]
enum TurnContent<'a> {
    Text(&'a str),
    Blocks(Vec<WireBlock<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: String,
        name: &'a str,
        input: Cow<'a, Value>,
    },
    ToolResult {
        tool_use_id: String,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

/// One turn being built; blocks are only collapsed to a plain string at the end.
struct Turn<'a> {
    role: &'static str,
    blocks: Vec<WireBlock<'a>>,
}

fn build_body(request: &LlmRequest<'_>, thinking_budget: Option<u32>) -> Value {
    // Serializing these structs cannot fail: every map key is a string.
    serde_json::to_value(wire_request(request, thinking_budget)).unwrap_or_default()
}

fn wire_request<'a>(request: &'a LlmRequest<'a>, thinking_budget: Option<u32>) -> WireRequest<'a> {
    let (messages, stray_system) = convert_messages(request.messages.iter().map(|m| &**m));
    let mut max_tokens = request.max_tokens;
    let (thinking, temperature) = match thinking_budget {
        Some(budget) => {
            // The API rejects budget_tokens >= max_tokens; keep the requested room for the
            // answer.
            if max_tokens <= budget {
                max_tokens = budget.saturating_add(max_tokens.max(1));
            }
            let thinking = WireThinking {
                kind: "enabled",
                budget_tokens: budget,
            };
            // The API refuses a temperature with extended thinking.
            (Some(thinking), None)
        }
        // Anthropic accepts 0..=1 while the neutral schema allows OpenAI's 0..=2. Sent as
        // the decimal the session asked for, not the f32 widened.
        None => (
            None,
            Some(f32_for_json(request.temperature.clamp(0.0, 1.0))),
        ),
    };
    let mut system: Vec<&str> = Vec::new();
    if let Some(s) = request.system.as_deref()
        && !s.trim().is_empty()
    {
        system.push(s);
    }
    system.extend(stray_system);
    WireRequest {
        model: &request.model,
        thinking,
        temperature,
        max_tokens,
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        stream: true,
        tools: request.tools.iter().map(wire_tool).collect(),
        messages,
    }
}

fn wire_tool(t: &ToolSpec) -> WireTool<'_> {
    let input_schema = match &t.parameters {
        Value::Object(o) if !o.is_empty() => Cow::Borrowed(&t.parameters),
        _ => Cow::Owned(json!({"type": "object", "properties": {}})),
    };
    WireTool {
        name: &t.name,
        description: &t.description,
        input_schema,
    }
}

/// Converts the history into alternating user/assistant turns. Returns the turns and the
/// text of any `System` messages found in the history (the API takes those only in
/// `system`).
fn convert_messages<'m>(
    messages: impl IntoIterator<Item = &'m Message>,
) -> (Vec<WireTurn<'m>>, Vec<&'m str>) {
    let mut turns: Vec<Turn<'m>> = Vec::new();
    let mut stray_system = Vec::new();
    for m in messages {
        match m.role {
            Role::System => {
                if !m.content.trim().is_empty() {
                    stray_system.push(m.content.as_str());
                }
            }
            Role::User => {
                // The API rejects empty text blocks.
                if m.content.is_empty() {
                    continue;
                }
                let block = WireBlock::Text { text: &m.content };
                match turns.last_mut() {
                    Some(t) if t.role == "user" => t.blocks.push(block),
                    _ => turns.push(Turn {
                        role: "user",
                        blocks: vec![block],
                    }),
                }
            }
            Role::Assistant => {
                let blocks = assistant_blocks(m);
                if blocks.is_empty() {
                    continue;
                }
                match turns.last_mut() {
                    Some(t) if t.role == "assistant" => t.blocks.extend(blocks),
                    _ => turns.push(Turn {
                        role: "assistant",
                        blocks,
                    }),
                }
            }
            Role::Tool => {
                let block = WireBlock::ToolResult {
                    tool_use_id: wire_id(m.tool_call_id.as_deref().unwrap_or_default()),
                    content: &m.content,
                    is_error: m.is_error,
                };
                match turns.last_mut() {
                    // Results must precede any text in the user turn that answers the
                    // assistant's tool_use blocks.
                    Some(t) if t.role == "user" => {
                        let pos = t
                            .blocks
                            .iter()
                            .position(|b| !matches!(b, WireBlock::ToolResult { .. }))
                            .unwrap_or(t.blocks.len());
                        t.blocks.insert(pos, block);
                    }
                    _ => turns.push(Turn {
                        role: "user",
                        blocks: vec![block],
                    }),
                }
            }
        }
    }
    let out = turns
        .into_iter()
        .map(|t| {
            let content = match t.blocks.as_slice() {
                [WireBlock::Text { text }] if t.role == "user" => TurnContent::Text(text),
                _ => TurnContent::Blocks(t.blocks),
            };
            WireTurn {
                role: t.role,
                content,
            }
        })
        .collect();
    (out, stray_system)
}

fn assistant_blocks(m: &Message) -> Vec<WireBlock<'_>> {
    let mut blocks = Vec::new();
    for t in &m.thinking {
        if let Some(data) = &t.redacted {
            blocks.push(WireBlock::RedactedThinking { data });
        } else if let Some(signature) = t.signature.as_deref().filter(|s| !s.is_empty()) {
            blocks.push(WireBlock::Thinking {
                thinking: &t.text,
                signature,
            });
        }
        // Unsigned reasoning (another model's `<think>` text) would be rejected as a
        // thinking block and is not worth replaying as text: it is dropped.
    }
    if !m.content.is_empty() {
        blocks.push(WireBlock::Text { text: &m.content });
    }
    for c in &m.tool_calls {
        blocks.push(WireBlock::ToolUse {
            id: wire_id(&c.id),
            name: &c.name,
            input: tool_input(c),
        });
    }
    blocks
}

/// `tool_use.input` must be an object; anything else is wrapped so the model sees it.
fn tool_input(c: &ToolCall) -> Cow<'_, Value> {
    match &c.arguments {
        Value::Object(o) => match o.get("_raw") {
            Some(raw) if o.len() == 1 && !raw.is_string() => {
                Cow::Owned(json!({"_raw": raw.to_string()}))
            }
            _ => Cow::Borrowed(&c.arguments),
        },
        Value::Null => Cow::Owned(json!({})),
        Value::String(s) => Cow::Owned(json!({"_raw": s})),
        other => Cow::Owned(json!({"_raw": other.to_string()})),
    }
}

/// Tool ids must match `^[a-zA-Z0-9_-]+$`; ids minted by other providers may not. The
/// mapping is deterministic, so a `tool_use` and its `tool_result` still pair up.
fn wire_id(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Stream decoding

#[derive(Debug, Clone, Copy)]
enum Block {
    Text,
    Thinking,
    /// The tool's ordinal among the response's tool_use blocks; `whole` when the start
    /// event already carried the full input (deltas would then duplicate it).
    Tool {
        ordinal: usize,
        whole: bool,
    },
    Ignored,
}

/// Turns the SSE events of one response into [`LlmEvent`]s.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    usage: Usage,
    finish: Option<FinishReason>,
    tools: usize,
    blocks: HashMap<u64, Block>,
    done: bool,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// True once `message_stop` was seen.
    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn handle(&mut self, ev: &SseEvent) -> Result<Vec<LlmEvent>> {
        // Live streams pad `data:` lines with trailing spaces.
        let data = ev.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let v = parse_event(data).map_err(|e| {
            let head: String = data.chars().take(200).collect();
            Error::Decode(format!("anthropic stream event is not JSON ({e}): {head}"))
        })?;
        let ty = v
            .kind
            .as_deref()
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let mut out = Vec::new();
        match ty {
            "message_start" => {
                if let Some(model) = v.message.model {
                    out.push(LlmEvent::Model(model));
                }
                if let Some(u) = &v.message.usage {
                    self.assign_usage(u);
                    out.push(LlmEvent::Usage(self.usage));
                }
            }
            "content_block_start" => {
                self.block_start(v.index.unwrap_or_default(), v.content_block, &mut out)
            }
            "content_block_delta" => {
                self.block_delta(v.index.unwrap_or_default(), v.delta, &mut out)
            }
            "message_delta" => {
                if let Some(r) = &v.delta.stop_reason {
                    self.finish = Some(map_stop_reason(r));
                }
                if let Some(u) = &v.usage {
                    self.assign_usage(u);
                    out.push(LlmEvent::Usage(self.usage));
                }
            }
            "message_stop" => {
                self.done = true;
                out.push(LlmEvent::Done(self.finish.clone().unwrap_or_default()));
            }
            "error" => {
                let code = v.error.kind;
                let message = v.error.message.unwrap_or_else(|| "stream error".into());
                let retryable = matches!(
                    code.as_deref(),
                    Some("overloaded_error" | "api_error" | "rate_limit_error")
                );
                return Err(Error::Stream {
                    message,
                    code,
                    retryable,
                });
            }
            // `content_block_stop`, `ping`, and event types added after this was written.
            _ => {}
        }
        Ok(out)
    }

    fn block_start(&mut self, index: u64, cb: WireContentBlock, out: &mut Vec<LlmEvent>) {
        let block = match cb.kind.as_deref().unwrap_or_default() {
            "text" => {
                if let Some(t) = cb.text.filter(|t| !t.is_empty()) {
                    out.push(LlmEvent::TextDelta(t));
                }
                Block::Text
            }
            "thinking" => {
                // Always open the block, so a signature arriving without text has one.
                out.push(LlmEvent::ThinkingDelta(cb.thinking.unwrap_or_default()));
                if let Some(sig) = cb.signature.filter(|s| !s.is_empty()) {
                    out.push(LlmEvent::ThinkingSignature(sig));
                }
                Block::Thinking
            }
            "redacted_thinking" => {
                out.push(LlmEvent::RedactedThinking(cb.data.unwrap_or_default()));
                Block::Ignored
            }
            "tool_use" => {
                let ordinal = self.tools;
                self.tools += 1;
                // Announce the call now: a tool without input gets no input_json_delta.
                let (arguments, whole) = match &cb.input {
                    Some(input @ Value::Object(o)) if !o.is_empty() => (input.to_string(), true),
                    _ => (String::new(), false),
                };
                out.push(LlmEvent::ToolCallDelta {
                    index: ordinal,
                    id: cb.id,
                    name: cb.name,
                    arguments,
                });
                Block::Tool { ordinal, whole }
            }
            // server_tool_use, web_search_tool_result, …: executed by Anthropic, not by us.
            _ => Block::Ignored,
        };
        self.blocks.insert(index, block);
    }

    fn block_delta(&mut self, index: u64, d: WireDelta, out: &mut Vec<LlmEvent>) {
        let block = self.blocks.get(&index).copied();
        let ty = d.kind.as_deref().unwrap_or_default();
        let text = match ty {
            "text_delta" => d.text,
            "input_json_delta" => d.partial_json,
            "thinking_delta" => d.thinking,
            "signature_delta" => d.signature,
            // citations_delta and later additions carry nothing the schema keeps.
            _ => return,
        };
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            return;
        };
        let ev = match (ty, block) {
            ("text_delta", Some(Block::Ignored)) => return,
            ("text_delta", _) => LlmEvent::TextDelta(text),
            (
                "input_json_delta",
                Some(Block::Tool {
                    ordinal,
                    whole: false,
                }),
            ) => LlmEvent::ToolCallDelta {
                index: ordinal,
                id: None,
                name: None,
                arguments: text,
            },
            ("input_json_delta", _) => return,
            ("thinking_delta", _) => LlmEvent::ThinkingDelta(text),
            _ => LlmEvent::ThinkingSignature(text),
        };
        out.push(ev);
    }

    /// Anthropic reports usage as running totals: fields present overwrite, never add.
    fn assign_usage(&mut self, u: &WireUsage) {
        let fields = [
            (u.input_tokens, &mut self.usage.input_tokens),
            (u.output_tokens, &mut self.usage.output_tokens),
            (u.cache_read_input_tokens, &mut self.usage.cache_read_tokens),
            (
                u.cache_creation_input_tokens,
                &mut self.usage.cache_write_tokens,
            ),
            (
                u.output_tokens_details.thinking_tokens,
                &mut self.usage.reasoning_tokens,
            ),
        ];
        for (reported, total) in fields {
            if let Some(n) = reported {
                *total = n;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Stream event structs. Lenient like the API's own SDKs: a missing field is absent, a field
// of an unexpected JSON type is treated as absent (see [`lenient`]), unknown fields and
// event types are ignored.

/// One event's JSON. A payload that is JSON but not an object reads as an event with no
/// fields (its SSE `event:` name may still say what it is).
fn parse_event(data: &str) -> serde_json::Result<WireEvent> {
    let mut de = serde_json::Deserializer::from_str(data);
    let event = lenient::object(&mut de)?;
    de.end()?;
    Ok(event)
}

/// Every field any streamed event type uses; which ones matter depends on `type`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireEvent {
    #[serde(rename = "type", deserialize_with = "lenient::string")]
    kind: Option<String>,
    /// `message_start`.
    #[serde(deserialize_with = "lenient::object")]
    message: WireMessageStart,
    #[serde(deserialize_with = "lenient::u64")]
    index: Option<u64>,
    /// `content_block_start`.
    #[serde(deserialize_with = "lenient::object")]
    content_block: WireContentBlock,
    /// `content_block_delta` (a block's delta) and `message_delta` (the stop reason).
    #[serde(deserialize_with = "lenient::object")]
    delta: WireDelta,
    /// `message_delta`.
    #[serde(deserialize_with = "lenient::present")]
    usage: Option<WireUsage>,
    /// `error`.
    #[serde(deserialize_with = "lenient::object")]
    error: WireError,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireMessageStart {
    #[serde(deserialize_with = "lenient::string")]
    model: Option<String>,
    #[serde(deserialize_with = "lenient::present")]
    usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireContentBlock {
    #[serde(rename = "type", deserialize_with = "lenient::string")]
    kind: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    text: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    thinking: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    signature: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    data: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    id: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    name: Option<String>,
    input: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireDelta {
    #[serde(rename = "type", deserialize_with = "lenient::string")]
    kind: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    text: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    partial_json: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    thinking: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    signature: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    stop_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireUsage {
    #[serde(deserialize_with = "lenient::u64")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::u64")]
    output_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::u64")]
    cache_read_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::u64")]
    cache_creation_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::object")]
    output_tokens_details: WireUsageDetails,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireUsageDetails {
    #[serde(deserialize_with = "lenient::u64")]
    thinking_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireError {
    #[serde(rename = "type", deserialize_with = "lenient::string")]
    kind: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    message: Option<String>,
}

/// Field deserializers that take what they expect and treat any other JSON value as
/// absent, without failing the event: proxies and API additions send `null`s and odd
/// types in places, and a usable event must not be lost to a field we do not need.
mod lenient {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::value::MapAccessDeserializer;
    use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// A JSON value reduced to what the event structs read from a scalar field.
    enum Scalar {
        Str(String),
        U64(u64),
        Other,
    }

    struct ScalarVisitor;

    impl<'de> Visitor<'de> for ScalarVisitor {
        type Value = Scalar;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
            Ok(Scalar::Str(v.to_owned()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
            Ok(Scalar::Str(v))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
            Ok(Scalar::U64(v))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Scalar, E> {
            Ok(Scalar::Other)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Scalar, E> {
            Ok(Scalar::Other)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Scalar, E> {
            Ok(Scalar::Other)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
            Ok(Scalar::Other)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Scalar::Other)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Scalar::Other)
        }
    }

    /// A string field.
    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Ok(match d.deserialize_any(ScalarVisitor)? {
            Scalar::Str(s) => Some(s),
            _ => None,
        })
    }

    /// A non-negative integer field.
    pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Ok(match d.deserialize_any(ScalarVisitor)? {
            Scalar::U64(n) => Some(n),
            _ => None,
        })
    }

    /// An object field, parsed as `T`; any other value reads as `None`.
    struct ObjectVisitor<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Option<T>, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }

    /// An object field; any other value reads as an empty object.
    pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        Ok(d.deserialize_any(ObjectVisitor(PhantomData))?
            .unwrap_or_default())
    }

    /// An object field whose presence matters: present with any value, it is `Some` (an
    /// empty object when it is not one).
    pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        object(d).map(Some)
    }
}

fn map_stop_reason(r: &str) -> FinishReason {
    match r {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" => FinishReason::Length,
        "refusal" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_string()),
    }
}

struct DecodeState<S> {
    inner: Pin<Box<S>>,
    decoder: StreamDecoder,
    queue: VecDeque<LlmEvent>,
    ended: bool,
}

/// Runs a stream of SSE events through a [`StreamDecoder`]. Ends after `message_stop`
/// (without reading further) or at the first error; an EOF before `message_stop` is an
/// error because the answer is incomplete.
pub fn decode_stream<S>(events: S) -> LlmStream
where
    S: Stream<Item = Result<SseEvent>> + Send + 'static,
{
    let state = DecodeState {
        inner: Box::pin(events),
        decoder: StreamDecoder::new(),
        queue: VecDeque::new(),
        ended: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.ended {
                return None;
            }
            match st.inner.next().await {
                Some(Ok(sse)) => match st.decoder.handle(&sse) {
                    Ok(evs) => {
                        st.queue.extend(evs);
                        if st.decoder.is_done() {
                            st.ended = true;
                        }
                    }
                    Err(Error::Decode(msg)) => {
                        st.ended = true;
                        // The SSE reader flushes a half-received event at EOF: a cut
                        // stream, not a malformed one.
                        let e = match st.inner.next().await {
                            None => Error::Transport(format!(
                                "stream ended before message_stop, inside an event: {msg}"
                            )),
                            Some(_) => Error::Decode(msg),
                        };
                        return Some((Err(e), st));
                    }
                    Err(e) => {
                        st.ended = true;
                        return Some((Err(e), st));
                    }
                },
                Some(Err(e)) => {
                    st.ended = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.ended = true;
                    return Some((
                        Err(Error::Transport("stream ended before message_stop".into())),
                        st,
                    ));
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::ThinkingBlock;

    fn req(messages: Vec<Message>) -> LlmRequest<'static> {
        LlmRequest {
            model: "claude-test".into(),
            system: Some("sys".into()),
            messages: messages.into_iter().map(std::borrow::Cow::Owned).collect(),
            tools: Vec::new().into(),
            temperature: 0.1,
            max_tokens: 100,
            session_id: String::new(),
        }
    }

    fn call(id: &str, args: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: args,
        }
    }

    #[test]
    fn unsigned_thinking_is_dropped_and_raw_args_wrapped() {
        let mut a = Message::assistant("");
        a.thinking = vec![
            ThinkingBlock {
                text: "from <think>".into(),
                ..Default::default()
            },
            ThinkingBlock {
                redacted: Some("opaque".into()),
                ..Default::default()
            },
        ];
        a.tool_calls = vec![
            call("a.b", json!({"_raw": "{bad"})),
            call("c", json!([1])),
            call("d", Value::Null),
        ];
        let body = build_body(
            &req(vec![
                Message::user("hi"),
                a,
                Message::tool_result("a.b", "t", "r1", true),
                Message::tool_result("c", "t", "r2", false),
                Message::tool_result("d", "t", "", false),
                Message::user("next"),
            ]),
            None,
        );
        let msgs = body["messages"].as_array().cloned().unwrap_or_default();
        assert_eq!(msgs.len(), 3);
        let blocks = msgs[1]["content"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            blocks[0],
            json!({"type": "redacted_thinking", "data": "opaque"})
        );
        assert_eq!(blocks[1]["input"], json!({"_raw": "{bad"}));
        assert_eq!(blocks[1]["id"], "a_b");
        assert_eq!(blocks[2]["input"], json!({"_raw": "[1]"}));
        assert_eq!(blocks[3]["input"], json!({}));
        let user = msgs[2]["content"].as_array().cloned().unwrap_or_default();
        assert_eq!(user.len(), 4);
        assert_eq!(user[0]["tool_use_id"], "a_b");
        assert_eq!(user[0]["is_error"], true);
        assert!(user[1].get("is_error").is_none());
        assert_eq!(user[3], json!({"type": "text", "text": "next"}));
    }

    fn sse(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_string),
            data: data.to_string(),
            id: None,
        }
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn fields_of_an_unexpected_type_read_as_absent() {
        let mut d = StreamDecoder::new();
        let evs = d
            .handle(&sse(
                None,
                r#"{"type":"message_start","message":{"model":7,"usage":null,"extra":[1,{"a":2}]}}"#,
            ))
            .unwrap();
        // A usage field that is present reports the totals, even when it says nothing.
        assert_eq!(evs, vec![LlmEvent::Usage(Usage::default())]);
        let evs = d
            .handle(&sse(
                None,
                r#"{"type":"content_block_start","index":"0","content_block":{"type":"tool_use","id":"t1","name":["x"],"input":null}}"#,
            ))
            .unwrap();
        assert_eq!(
            evs,
            vec![LlmEvent::ToolCallDelta {
                index: 0,
                id: Some("t1".into()),
                name: None,
                arguments: String::new(),
            }]
        );
        let evs = d
            .handle(&sse(
                None,
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\":1}"}}"#,
            ))
            .unwrap();
        assert_eq!(
            evs,
            vec![LlmEvent::ToolCallDelta {
                index: 0,
                id: None,
                name: None,
                arguments: "{\"a\":1}".into(),
            }]
        );
        let evs = d
            .handle(&sse(
                None,
                r#"{"type":"message_delta","delta":"odd","usage":{"output_tokens":-1,"input_tokens":12.5,"cache_read_input_tokens":3}}"#,
            ))
            .unwrap();
        assert_eq!(
            evs,
            vec![LlmEvent::Usage(Usage {
                cache_read_tokens: 3,
                ..Default::default()
            })]
        );
        // Not an object: the SSE event name says what it is.
        let evs = d.handle(&sse(Some("message_stop"), "[]")).unwrap();
        assert_eq!(evs, vec![LlmEvent::Done(FinishReason::Stop)]);
        assert!(d.is_done());
        // Unknown events are ignored whatever they carry.
        let evs = d
            .handle(&sse(
                None,
                r#"{"type":"future_event","delta":[1],"index":{}}"#,
            ))
            .unwrap();
        assert!(evs.is_empty());
        // Only text that is not JSON at all is a decode error.
        assert!(matches!(
            d.handle(&sse(None, r#"{"type":"ping""#)),
            Err(Error::Decode(_))
        ));
        assert!(matches!(
            d.handle(&sse(None, r#"{"type":"ping"} trailing"#)),
            Err(Error::Decode(_))
        ));
    }

    #[test]
    fn thinking_budget_drops_temperature_and_keeps_room() {
        let body = build_body(&req(vec![Message::user("hi")]), Some(2048));
        assert!(body.get("temperature").is_none());
        assert_eq!(body["thinking"]["budget_tokens"], 2048);
        assert!(body["max_tokens"].as_u64().unwrap_or_default() > 2048);
        assert_eq!(body["messages"][0]["content"], "hi");
    }
}
