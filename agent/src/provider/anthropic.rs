//! The Anthropic Messages provider: converts the neutral history into Messages API turns
//! (content blocks, strict role alternation, tool results paired with the preceding
//! `tool_use`, thinking blocks replayed with their signatures) and decodes the streamed
//! answer into [`LlmEvent`]s. The wire format stays inside this module.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::provider::sse::{SseEvent, error_chain, sse_events};
use crate::provider::{HttpTimeouts, LlmEvent, LlmProvider, LlmRequest, LlmStream};
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
}

#[async_trait]
impl LlmProvider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
    }

    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream> {
        // Only the bytes wait for the answer, not the larger JSON tree (see the OpenAI
        // provider).
        let body = serde_json::to_vec(&self.request_body(request))?;
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
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: Value,
}

/// One turn being built; blocks are only collapsed to a plain string at the end.
struct Turn {
    role: &'static str,
    blocks: Vec<Value>,
}

fn build_body(request: &LlmRequest<'_>, thinking_budget: Option<u32>) -> Value {
    let (messages, stray_system) = convert_messages(request.messages.iter().map(|m| &**m));
    let mut body = Map::new();
    body.insert("model".into(), json!(request.model));

    let mut max_tokens = request.max_tokens;
    if let Some(budget) = thinking_budget {
        // The API rejects budget_tokens >= max_tokens; keep the requested room for the answer.
        if max_tokens <= budget {
            max_tokens = budget.saturating_add(max_tokens.max(1));
        }
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    } else {
        // Anthropic accepts 0..=1 while the neutral schema allows OpenAI's 0..=2.
        body.insert(
            "temperature".into(),
            json!(request.temperature.clamp(0.0, 1.0)),
        );
    }
    body.insert("max_tokens".into(), json!(max_tokens));

    let mut system: Vec<&str> = Vec::new();
    if let Some(s) = request.system.as_deref()
        && !s.trim().is_empty()
    {
        system.push(s);
    }
    system.extend(stray_system.iter().map(String::as_str));
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("stream".into(), json!(true));
    if !request.tools.is_empty() {
        let tools: Vec<WireTool<'_>> = request.tools.iter().map(wire_tool).collect();
        body.insert("tools".into(), json!(tools));
    }
    body.insert("messages".into(), Value::Array(messages));
    Value::Object(body)
}

fn wire_tool(t: &ToolSpec) -> WireTool<'_> {
    let input_schema = match &t.parameters {
        Value::Object(o) if !o.is_empty() => t.parameters.clone(),
        _ => json!({"type": "object", "properties": {}}),
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
) -> (Vec<Value>, Vec<String>) {
    let mut turns: Vec<Turn> = Vec::new();
    let mut stray_system = Vec::new();
    for m in messages {
        match m.role {
            Role::System => {
                if !m.content.trim().is_empty() {
                    stray_system.push(m.content.clone());
                }
            }
            Role::User => {
                // The API rejects empty text blocks.
                if m.content.is_empty() {
                    continue;
                }
                let block = json!({"type": "text", "text": m.content});
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
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": wire_id(m.tool_call_id.as_deref().unwrap_or_default()),
                    "content": m.content,
                });
                if m.is_error {
                    block["is_error"] = json!(true);
                }
                match turns.last_mut() {
                    // Results must precede any text in the user turn that answers the
                    // assistant's tool_use blocks.
                    Some(t) if t.role == "user" => {
                        let pos = t
                            .blocks
                            .iter()
                            .position(|b| b["type"] != "tool_result")
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
                [only] if t.role == "user" && only["type"] == "text" => only["text"].clone(),
                _ => Value::Array(t.blocks),
            };
            json!({"role": t.role, "content": content})
        })
        .collect();
    (out, stray_system)
}

fn assistant_blocks(m: &Message) -> Vec<Value> {
    let mut blocks = Vec::new();
    for t in &m.thinking {
        if let Some(data) = &t.redacted {
            blocks.push(json!({"type": "redacted_thinking", "data": data}));
        } else if let Some(sig) = t.signature.as_deref().filter(|s| !s.is_empty()) {
            blocks.push(json!({"type": "thinking", "thinking": t.text, "signature": sig}));
        }
        // Unsigned reasoning (another model's `<think>` text) would be rejected as a
        // thinking block and is not worth replaying as text: it is dropped.
    }
    if !m.content.is_empty() {
        blocks.push(json!({"type": "text", "text": m.content}));
    }
    for c in &m.tool_calls {
        blocks.push(json!({
            "type": "tool_use",
            "id": wire_id(&c.id),
            "name": c.name,
            "input": tool_input(c),
        }));
    }
    blocks
}

/// `tool_use.input` must be an object; anything else is wrapped so the model sees it.
fn tool_input(c: &ToolCall) -> Value {
    match &c.arguments {
        Value::Object(o) => match o.get("_raw") {
            Some(raw) if o.len() == 1 && !raw.is_string() => json!({"_raw": raw.to_string()}),
            _ => c.arguments.clone(),
        },
        Value::Null => json!({}),
        Value::String(s) => json!({"_raw": s}),
        other => json!({"_raw": other.to_string()}),
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
        let v: Value = serde_json::from_str(data).map_err(|e| {
            let head: String = data.chars().take(200).collect();
            Error::Decode(format!("anthropic stream event is not JSON ({e}): {head}"))
        })?;
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or_default();
        let mut out = Vec::new();
        match ty {
            "message_start" => {
                let msg = &v["message"];
                if let Some(model) = msg.get("model").and_then(Value::as_str) {
                    out.push(LlmEvent::Model(model.to_string()));
                }
                if let Some(u) = msg.get("usage") {
                    self.assign_usage(u);
                    out.push(LlmEvent::Usage(self.usage));
                }
            }
            "content_block_start" => self.block_start(&v, &mut out),
            "content_block_delta" => self.block_delta(&v, &mut out),
            "message_delta" => {
                if let Some(r) = v["delta"].get("stop_reason").and_then(Value::as_str) {
                    self.finish = Some(map_stop_reason(r));
                }
                if let Some(u) = v.get("usage") {
                    self.assign_usage(u);
                    out.push(LlmEvent::Usage(self.usage));
                }
            }
            "message_stop" => {
                self.done = true;
                out.push(LlmEvent::Done(self.finish.clone().unwrap_or_default()));
            }
            "error" => {
                let err = &v["error"];
                let code = err.get("type").and_then(Value::as_str).map(str::to_string);
                let message = err
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("stream error")
                    .to_string();
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

    fn block_start(&mut self, v: &Value, out: &mut Vec<LlmEvent>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or_default();
        let cb = &v["content_block"];
        let block = match cb.get("type").and_then(Value::as_str).unwrap_or_default() {
            "text" => {
                if let Some(t) = cb
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    out.push(LlmEvent::TextDelta(t.to_string()));
                }
                Block::Text
            }
            "thinking" => {
                // Always open the block, so a signature arriving without text has one.
                let t = cb
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                out.push(LlmEvent::ThinkingDelta(t.to_string()));
                if let Some(sig) = cb
                    .get("signature")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    out.push(LlmEvent::ThinkingSignature(sig.to_string()));
                }
                Block::Thinking
            }
            "redacted_thinking" => {
                let data = cb.get("data").and_then(Value::as_str).unwrap_or_default();
                out.push(LlmEvent::RedactedThinking(data.to_string()));
                Block::Ignored
            }
            "tool_use" => {
                let ordinal = self.tools;
                self.tools += 1;
                // Announce the call now: a tool without input gets no input_json_delta.
                let (arguments, whole) = match cb.get("input") {
                    Some(Value::Object(o)) if !o.is_empty() => (cb["input"].to_string(), true),
                    _ => (String::new(), false),
                };
                out.push(LlmEvent::ToolCallDelta {
                    index: ordinal,
                    id: cb.get("id").and_then(Value::as_str).map(str::to_string),
                    name: cb.get("name").and_then(Value::as_str).map(str::to_string),
                    arguments,
                });
                Block::Tool { ordinal, whole }
            }
            // server_tool_use, web_search_tool_result, …: executed by Anthropic, not by us.
            _ => Block::Ignored,
        };
        self.blocks.insert(index, block);
    }

    fn block_delta(&mut self, v: &Value, out: &mut Vec<LlmEvent>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or_default();
        let block = self.blocks.get(&index).copied();
        let d = &v["delta"];
        let ty = d.get("type").and_then(Value::as_str).unwrap_or_default();
        let field = match ty {
            "text_delta" => "text",
            "input_json_delta" => "partial_json",
            "thinking_delta" => "thinking",
            "signature_delta" => "signature",
            // citations_delta and later additions carry nothing the schema keeps.
            _ => return,
        };
        let Some(text) = d
            .get(field)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        else {
            return;
        };
        let text = text.to_string();
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
    fn assign_usage(&mut self, u: &Value) {
        let get = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(n) = get("input_tokens") {
            self.usage.input_tokens = n;
        }
        if let Some(n) = get("output_tokens") {
            self.usage.output_tokens = n;
        }
        if let Some(n) = get("cache_read_input_tokens") {
            self.usage.cache_read_tokens = n;
        }
        if let Some(n) = get("cache_creation_input_tokens") {
            self.usage.cache_write_tokens = n;
        }
        if let Some(n) = u
            .get("output_tokens_details")
            .and_then(|d| d.get("thinking_tokens"))
            .and_then(Value::as_u64)
        {
            self.usage.reasoning_tokens = n;
        }
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

    #[test]
    fn thinking_budget_drops_temperature_and_keeps_room() {
        let body = build_body(&req(vec![Message::user("hi")]), Some(2048));
        assert!(body.get("temperature").is_none());
        assert_eq!(body["thinking"]["budget_tokens"], 2048);
        assert!(body["max_tokens"].as_u64().unwrap_or_default() > 2048);
        assert_eq!(body["messages"][0]["content"], "hi");
    }
}
