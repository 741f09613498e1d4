//! The OpenAI-compatible Chat Completions provider (OpenAI, vLLM, Ollama, llama.cpp,
//! OpenRouter, DeepSeek, Groq, xAI…). It owns the wire format: the request body built from
//! the neutral [`LlmRequest`], the streamed chunk structs, the mapping of chunks to
//! [`LlmEvent`]s, and the classification of HTTP and in-stream errors.
//!
//! Parsing is lenient on purpose: compatible servers differ in which fields they send,
//! send `null` where OpenAI omits a key, start tool-call indexes at 1, repeat ids as `""`,
//! and put usage in the finish chunk or in a separate `choices: []` chunk.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sse::{SseEvent, error_chain, sse_events};
use super::{
    HttpTimeouts, LlmEvent, LlmProvider, LlmRequest, LlmStream, f32_for_json, parse_retry_after,
};
use crate::error::{Error, Result};
use crate::schema::{FinishReason, Message, Role, ToolCall, Usage};

const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// Longest error body kept in an error message when the body is not the usual JSON.
const MAX_RAW_ERROR: usize = 500;

#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Up to and including the version segment, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeouts: HttpTimeouts,
    /// Sent with every request (e.g. OpenRouter's `HTTP-Referer`, an org or project id).
    pub extra_headers: Vec<(String, String)>,
}

impl OpenAiConfig {
    /// `OPENAI_BASE_URL` (default `https://api.openai.com/v1`) and `OPENAI_API_KEY`. An empty
    /// key means none: local servers (Ollama, llama.cpp) need no key.
    pub fn from_env() -> Self {
        let non_empty = |k: &str| {
            std::env::var(k)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        OpenAiConfig {
            base_url: non_empty("OPENAI_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.into()),
            api_key: non_empty("OPENAI_API_KEY"),
            timeouts: HttpTimeouts::default(),
            extra_headers: Vec::new(),
        }
    }
}

pub struct OpenAiProvider {
    client: reqwest::Client,
    url: String,
    headers: HeaderMap,
    idle: Duration,
    /// The assistant-message field that carries earlier reasoning back to the server, for
    /// servers that want it replayed (DeepSeek's thinking mode with tools wants
    /// `reasoning_content`). None by default: most servers reject or ignore it.
    reasoning_replay_field: Option<String>,
}

impl std::fmt::Debug for OpenAiProvider {
    // By hand so the bearer token in `headers` never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.url)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    pub fn new(config: OpenAiConfig) -> Result<Self> {
        let base = config.base_url.trim().trim_end_matches('/');
        let url = format!("{base}/chat/completions");
        reqwest::Url::parse(&url)
            .map_err(|e| Error::Config(format!("OpenAI base URL {base:?}: {e}")))?;

        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (k, v) in &config.extra_headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| Error::Config(format!("header name {k:?}: {e}")))?;
            let value =
                HeaderValue::from_str(v).map_err(|e| Error::Config(format!("header {k}: {e}")))?;
            headers.insert(name, value);
        }
        if let Some(key) = config.api_key.as_deref().filter(|k| !k.is_empty()) {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| Error::Config("OPENAI_API_KEY is not a valid header value".into()))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }

        // No total timeout: a long answer is fine while bytes keep coming (idle is enforced
        // per chunk by the SSE reader).
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeouts.connect)
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {}", error_chain(&e))))?;

        Ok(OpenAiProvider {
            client,
            url,
            headers,
            idle: config.timeouts.idle,
            reasoning_replay_field: None,
        })
    }

    /// Send assistant thinking back in this field of assistant messages (e.g.
    /// `reasoning_content` for DeepSeek's thinking mode with tool calls).
    pub fn with_reasoning_replay(mut self, field: impl Into<String>) -> Self {
        self.reasoning_replay_field = Some(field.into());
        self
    }

    /// The endpoint this provider posts to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The JSON body sent for `request`. Public so callers can log or inspect it.
    pub fn request_body(&self, request: &LlmRequest<'_>) -> Value {
        // Serializing these structs cannot fail: every map key is a string.
        serde_json::to_value(self.wire_request(request)).unwrap_or_default()
    }

    /// The bytes POSTed for `request`: [`OpenAiProvider::request_body`], serialized
    /// straight from the wire structs.
    pub fn request_bytes(&self, request: &LlmRequest<'_>) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec(&self.wire_request(request))?)
    }

    fn wire_request<'a>(&'a self, request: &'a LlmRequest<'a>) -> WireRequest<'a> {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            messages.push(WireMessage::text("system", system));
        }
        messages.extend(request.messages.iter().map(|m| self.wire_message(m)));
        WireRequest {
            model: &request.model,
            messages,
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            temperature: f32_for_json(request.temperature),
            max_tokens: request.max_tokens,
            tools: request
                .tools
                .iter()
                .map(|t| WireTool {
                    kind: "function",
                    function: WireToolFunction {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
        }
    }

    fn wire_message<'a>(&'a self, m: &'a Message) -> WireMessage<'a> {
        match m.role {
            Role::System => WireMessage::text("system", &m.content),
            Role::User => WireMessage::text("user", &m.content),
            Role::Tool => WireMessage {
                tool_call_id: Some(m.tool_call_id.as_deref().unwrap_or_default()),
                ..WireMessage::text("tool", &m.content)
            },
            Role::Assistant => {
                // A turn that only calls tools has `null` content, as OpenAI sends it.
                let content = (!m.content.is_empty() || m.tool_calls.is_empty())
                    .then_some(m.content.as_str());
                let tool_calls = m
                    .tool_calls
                    .iter()
                    .map(|c| WireCallOut {
                        id: &c.id,
                        kind: "function",
                        function: WireCallFunction {
                            name: &c.name,
                            arguments: arguments_string(c),
                        },
                    })
                    .collect();
                // Thinking is not part of the Chat Completions input; only servers that ask
                // for it get it back (see `with_reasoning_replay`).
                let reasoning = self.reasoning_replay_field.as_deref().and_then(|field| {
                    let text: String = m.thinking.iter().map(|t| t.text.as_str()).collect();
                    (!text.is_empty()).then_some(Replay { field, text })
                });
                WireMessage {
                    role: "assistant",
                    tool_call_id: None,
                    content,
                    tool_calls,
                    reasoning,
                }
            }
        }
    }
}

// ---- request body ----

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    temperature: f64,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// One input message. `content` is `null` only for an assistant turn that just calls tools.
#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCallOut<'a>>,
    #[serde(flatten)]
    reasoning: Option<Replay<'a>>,
}

impl<'a> WireMessage<'a> {
    fn text(role: &'static str, content: &'a str) -> Self {
        WireMessage {
            role,
            tool_call_id: None,
            content: Some(content),
            tool_calls: Vec::new(),
            reasoning: None,
        }
    }
}

#[derive(Serialize)]
struct WireCallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireCallFunction<'a>,
}

#[derive(Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    arguments: String,
}

/// Earlier reasoning, under the field name the server wants it in.
struct Replay<'a> {
    field: &'a str,
    text: String,
}

impl Serialize for Replay<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(self.field, &self.text)?;
        map.end()
    }
}

/// Tool-call arguments as the JSON string the API wants. Arguments that were not valid JSON
/// were stored as `{"_raw": text}`: the model gets its own text back, not our wrapper.
fn arguments_string(call: &ToolCall) -> String {
    if let Value::Object(map) = &call.arguments
        && map.len() == 1
        && let Some(Value::String(raw)) = map.get("_raw")
    {
        return raw.clone();
    }
    call.arguments.to_string()
}

#[async_trait]
impl LlmProvider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream> {
        // Only the bytes wait for the answer, serialized straight from borrowed wire structs:
        // a JSON tree is several times their size, and a session's request is in flight
        // for the model's whole latency (the bench's 5 000 sessions peaked at 968 MiB with
        // trees, 726 without).
        let body = self.request_bytes(request)?;
        let resp = self
            .client
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body)
            .send()
            .await
            .map_err(|e| Error::Transport(format!("POST {}: {}", self.url, error_chain(&e))))?;

        let status = resp.status();
        if !status.is_success() {
            return Err(http_error(resp, self.idle).await);
        }

        let mut events = Box::pin(sse_events(resp, self.idle));
        let mut state = StreamState::default();
        let stream = futures::stream::poll_fn(move |cx| {
            loop {
                if let Some(item) = state.ready.pop_front() {
                    return std::task::Poll::Ready(Some(item));
                }
                if state.ended {
                    return std::task::Poll::Ready(None);
                }
                match events.poll_next_unpin(cx) {
                    std::task::Poll::Pending => return std::task::Poll::Pending,
                    std::task::Poll::Ready(Some(Ok(ev))) => state.on_event(&ev),
                    std::task::Poll::Ready(Some(Err(e))) => state.fail(e),
                    std::task::Poll::Ready(None) => state.on_eof(),
                }
            }
        });
        Ok(Box::pin(stream))
    }
}

/// Build the error for a non-2xx answer from its headers and body.
async fn http_error(resp: reqwest::Response, idle: Duration) -> Error {
    let status = resp.status();
    let retry_after = retry_after(resp.headers());
    // The body of an error answer is bounded by the idle timeout too: a server that sends
    // the status and then stalls must not hang the session.
    let body = match tokio::time::timeout(idle, resp.bytes()).await {
        Ok(Ok(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(Err(_)) | Err(_) => String::new(),
    };
    let (message, code) = parse_error_body(&body);
    let message = message.unwrap_or_else(|| {
        let raw = body.trim();
        if raw.is_empty() {
            status
                .canonical_reason()
                .unwrap_or("no error message")
                .to_string()
        } else {
            truncate(raw, MAX_RAW_ERROR)
        }
    });
    if is_context_length(status.as_u16(), code.as_deref(), &message) {
        return Error::ContextLength(message);
    }
    Error::Http {
        status: status.as_u16(),
        message,
        code,
        retry_after,
    }
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(3600.0)));
    }
    header("retry-after").and_then(parse_retry_after)
}

/// `(message, code)` from the error shapes compatible servers use: OpenAI's
/// `{"error": {"message", "type", "code"}}`, `{"error": "text"}`, and vLLM/FastAPI-style
/// top-level `message`/`detail`. The code is `error.code`, else `error.type`.
fn parse_error_body(body: &str) -> (Option<String>, Option<String>) {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return (None, None);
    };
    let err = match v.get("error") {
        Some(e @ Value::Object(_)) => e,
        Some(Value::String(s)) => return (Some(s.clone()), None),
        _ => &v,
    };
    let message = err
        .get("message")
        .or_else(|| err.get("detail"))
        .and_then(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        });
    (message, error_code(err))
}

fn error_code(err: &Value) -> Option<String> {
    let as_code = |v: Option<&Value>| match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    as_code(err.get("code")).or_else(|| as_code(err.get("type")))
}

fn is_context_length(status: u16, code: Option<&str>, message: &str) -> bool {
    if !matches!(status, 400 | 413) {
        return false;
    }
    if matches!(
        code,
        Some("context_length_exceeded" | "exceed_context_size_error")
    ) {
        return true;
    }
    let m = message.to_ascii_lowercase();
    m.contains("maximum context length") || m.contains("context_length_exceeded")
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

// ---- stream chunks ----

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Chunk {
    model: Option<String>,
    choices: Option<Vec<Choice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Choice {
    index: Option<u64>,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireToolCall {
    index: Option<usize>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireFunction {
    name: Option<String>,
    /// Normally a string fragment; a few servers send the arguments as an object.
    arguments: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<TokenDetails>,
    completion_tokens_details: Option<TokenDetails>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TokenDetails {
    cached_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
}

/// Turns SSE events into `LlmEvent`s. `Done` is held back until `[DONE]` or EOF because
/// usage usually arrives after the finish chunk and consumers may stop reading at `Done`.
#[derive(Default)]
struct StreamState {
    ready: VecDeque<Result<LlmEvent>>,
    ended: bool,
    model_sent: bool,
    finish: Option<FinishReason>,
    saw_tool_calls: bool,
    /// For servers that omit `index`: which index each call id got, and the last one used.
    index_of_id: HashMap<String, usize>,
    last_index: Option<usize>,
}

impl StreamState {
    fn fail(&mut self, e: Error) {
        self.ready.push_back(Err(e));
        self.ended = true;
    }

    fn on_event(&mut self, ev: &SseEvent) {
        let data = ev.data.trim();
        if data.is_empty() {
            return;
        }
        if data == "[DONE]" {
            self.complete();
            return;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            // A chunk cut short is what a stream closed mid-event looks like after the SSE
            // parser flushes it at EOF: that is the transport's fault, not a bad payload.
            Err(e) if e.is_eof() => {
                let msg = "stream ended before completion (truncated chunk)";
                self.fail(Error::Transport(msg.into()));
                return;
            }
            Err(e) => {
                let msg = format!("chunk is not JSON ({e}): {}", truncate(data, 200));
                self.fail(Error::Decode(msg));
                return;
            }
        };
        if ev.event.as_deref() == Some("error") {
            let err = value.get("error").unwrap_or(&value);
            self.fail(stream_error(err));
            return;
        }
        let chunk: Chunk = match serde_json::from_value(value) {
            Ok(c) => c,
            Err(e) => {
                self.fail(Error::Decode(format!("unexpected chunk shape: {e}")));
                return;
            }
        };
        if let Some(err) = chunk.error.as_ref().filter(|e| !e.is_null()) {
            self.fail(stream_error(err));
            return;
        }
        self.on_chunk(chunk);
    }

    fn on_chunk(&mut self, chunk: Chunk) {
        if !self.model_sent
            && let Some(model) = chunk.model.filter(|m| !m.is_empty())
        {
            self.model_sent = true;
            self.ready.push_back(Ok(LlmEvent::Model(model)));
        }
        let choices = chunk.choices.unwrap_or_default();
        // Only the first choice is ours: we never ask for `n > 1`.
        let choice = choices
            .iter()
            .find(|c| c.index.unwrap_or(0) == 0)
            .or(choices.first());
        if let Some(choice) = choice {
            if let Some(delta) = &choice.delta {
                self.on_delta(delta);
            }
            if let Some(reason) = choice.finish_reason.as_deref().filter(|r| !r.is_empty()) {
                self.finish = Some(finish_reason(reason));
            }
        }
        if let Some(u) = chunk.usage
            && (u.prompt_tokens.is_some() || u.completion_tokens.is_some())
        {
            let usage = Usage {
                input_tokens: u.prompt_tokens.unwrap_or(0),
                output_tokens: u.completion_tokens.unwrap_or(0),
                cache_read_tokens: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
                cache_write_tokens: 0,
                reasoning_tokens: u
                    .completion_tokens_details
                    .and_then(|d| d.reasoning_tokens)
                    .unwrap_or(0),
            };
            self.ready.push_back(Ok(LlmEvent::Usage(usage)));
        }
    }

    fn on_delta(&mut self, delta: &Delta) {
        let thinking = delta
            .reasoning_content
            .as_deref()
            .or(delta.reasoning.as_deref());
        if let Some(t) = thinking.filter(|t| !t.is_empty()) {
            self.ready
                .push_back(Ok(LlmEvent::ThinkingDelta(t.to_string())));
        }
        if let Some(t) = delta.content.as_deref().filter(|t| !t.is_empty()) {
            self.ready.push_back(Ok(LlmEvent::TextDelta(t.to_string())));
        }
        for call in delta.tool_calls.iter().flatten() {
            let id = call.id.clone().filter(|i| !i.is_empty());
            let index = self.call_index(call.index, id.as_deref());
            let function = call.function.as_ref();
            let name = function
                .and_then(|f| f.name.clone())
                .filter(|n| !n.is_empty());
            let arguments = match function.and_then(|f| f.arguments.as_ref()) {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => String::new(),
                Some(other) => other.to_string(),
            };
            if id.is_none() && name.is_none() && arguments.is_empty() {
                // Qwen and Claude-behind-a-gateway send empty fragments; they carry nothing.
                continue;
            }
            self.saw_tool_calls = true;
            self.ready.push_back(Ok(LlmEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            }));
        }
    }

    /// The index of a tool-call fragment: the server's `index` when it sends one (the
    /// normal case); otherwise a new index for a new id and the previous one for a
    /// continuation.
    fn call_index(&mut self, index: Option<usize>, id: Option<&str>) -> usize {
        let index = match (index, id) {
            (Some(i), _) => i,
            (None, Some(id)) => match self.index_of_id.get(id) {
                Some(&i) => i,
                None => self.last_index.map_or(0, |i| i + 1),
            },
            (None, None) => self.last_index.unwrap_or(0),
        };
        if let Some(id) = id {
            self.index_of_id.insert(id.to_string(), index);
        }
        self.last_index = Some(index);
        index
    }

    /// `[DONE]`, or EOF after a finish reason: emit `Done` once and stop.
    fn complete(&mut self) {
        let reason = match self.finish.take() {
            // Some servers say `stop` even when they return tool calls; the calls win.
            Some(FinishReason::Stop) | None if self.saw_tool_calls => FinishReason::ToolCalls,
            Some(r) => r,
            None => FinishReason::Stop,
        };
        self.ready.push_back(Ok(LlmEvent::Done(reason)));
        self.ended = true;
    }

    fn on_eof(&mut self) {
        if self.finish.is_some() {
            // Some servers close without `[DONE]`; the finish reason says the answer is whole.
            self.complete();
        } else {
            self.fail(Error::Transport("stream ended before completion".into()));
        }
    }
}

/// The events a whole recorded body decodes to, as [`OpenAiProvider::stream`] would yield
/// them, without HTTP.
#[cfg(test)]
pub(crate) fn decode_body(body: &[u8]) -> Vec<Result<LlmEvent>> {
    let mut parser = super::sse::SseParser::new();
    let mut events = parser.push(body);
    events.extend(parser.finish());
    let mut state = StreamState::default();
    let mut out = Vec::new();
    for ev in &events {
        if state.ended {
            break;
        }
        state.on_event(ev);
        out.extend(state.ready.drain(..));
    }
    if !state.ended {
        state.on_eof();
        out.extend(state.ready.drain(..));
    }
    out
}

fn finish_reason(s: &str) -> FinishReason {
    match s {
        "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
        "length" | "max_tokens" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        "error" => FinishReason::Error,
        other => FinishReason::Other(other.to_string()),
    }
}

/// An error reported inside a 200 stream. Retryable when the server says it is busy or
/// broken rather than that the request is wrong.
fn stream_error(err: &Value) -> Error {
    let message = match err {
        Value::String(s) => s.clone(),
        _ => err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| truncate(&err.to_string(), MAX_RAW_ERROR)),
    };
    let code = error_code(err);
    let kinds = [err.get("type"), err.get("code")];
    let retryable = kinds.iter().flatten().any(|v| match v {
        Value::String(s) => {
            let s = s.to_ascii_lowercase();
            [
                "server_error",
                "overloaded",
                "rate_limit",
                "rate limit",
                "internal",
                "unavailable",
                "timeout",
            ]
            .iter()
            .any(|k| s.contains(k))
        }
        Value::Number(n) => n
            .as_u64()
            .is_some_and(|c| matches!(c, 408 | 429 | 500..=599)),
        _ => false,
    });
    Error::Stream {
        message,
        code,
        retryable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn raw_arguments_are_sent_back_verbatim() {
        let call = ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: json!({"_raw": "{\"a\": 1"}),
        };
        assert_eq!(arguments_string(&call), "{\"a\": 1");
        let call = ToolCall {
            arguments: json!({"a": 1}),
            ..call
        };
        assert_eq!(arguments_string(&call), "{\"a\":1}");
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            parse_error_body(r#"{"error":{"message":"m","type":"t","code":null}}"#),
            (Some("m".into()), Some("t".into()))
        );
        assert_eq!(
            parse_error_body(
                r#"{"object":"error","message":"m","type":"BadRequestError","code":400}"#
            ),
            (Some("m".into()), Some("400".into()))
        );
        assert_eq!(
            parse_error_body(r#"{"error":"boom"}"#),
            (Some("boom".into()), None)
        );
        assert_eq!(parse_error_body("<html>"), (None, None));
    }

    #[test]
    fn missing_indexes_follow_ids() {
        let mut s = StreamState::default();
        assert_eq!(s.call_index(None, Some("a")), 0);
        assert_eq!(s.call_index(None, None), 0);
        assert_eq!(s.call_index(None, Some("b")), 1);
        assert_eq!(s.call_index(None, Some("a")), 0);
    }

    #[test]
    fn stream_error_classification() {
        let e = stream_error(&json!({"message": "busy", "type": "server_error"}));
        assert!(e.is_retryable());
        let e = stream_error(&json!({"message": "bad", "type": "invalid_request_error"}));
        assert!(!e.is_retryable());
        let e = stream_error(&json!({"message": "upstream", "code": 502}));
        assert!(e.is_retryable());
    }
}
