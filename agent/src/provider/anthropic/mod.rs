//! The Anthropic Messages provider: converts the neutral history into Messages API turns
//! (content blocks, strict role alternation, tool results paired with the preceding
//! `tool_use`, thinking blocks replayed with their signatures) and decodes the streamed
//! answer into [`LlmEvent`]s. The wire format stays inside this module:
//! `request` builds the body, `events` decodes the stream.

use std::collections::VecDeque;
use std::pin::Pin;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::provider::endpoint;
use crate::provider::sse::{SseEvent, error_body, sse_events};
use crate::provider::transport::{HttpPool, Transport};
use crate::provider::{
    HttpTimeouts, LlmEvent, LlmProvider, LlmRequest, LlmStream, RateLimitInfo, retry_after,
    with_limits,
};

mod events;
mod request;

pub use events::StreamDecoder;
use request::{build_body, wire_request};

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
    pub transport: Transport,
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
            transport: Transport::default(),
            thinking_budget: None,
        }
    }
}

impl AnthropicConfig {
    /// `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`) and `ANTHROPIC_API_KEY`,
    /// read from the process environment: only for a caller acting on the operator's
    /// behalf (the provider factory never calls it).
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
    http: HttpPool,
    config: AnthropicConfig,
    url: String,
    /// [`LlmProvider::limit_key`], computed once (it digests the key).
    limit_key: String,
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
        let parsed = reqwest::Url::parse(&url)
            .map_err(|e| Error::Config(format!("anthropic base URL {base:?}: {e}")))?;
        if let Some(key) = &config.api_key
            && reqwest::header::HeaderValue::from_str(key).is_err()
        {
            return Err(Error::Config(
                "ANTHROPIC_API_KEY contains characters not allowed in a header".into(),
            ));
        }
        let http = HttpPool::new(config.timeouts, config.transport, &parsed)?;
        let limit_key = crate::provider::limit_key("anthropic", base, config.api_key.as_deref());
        Ok(AnthropicProvider {
            http,
            config,
            url,
            limit_key,
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

    fn limit_key(&self) -> String {
        self.limit_key.clone()
    }

    fn web_search(&self) -> bool {
        true
    }

    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream> {
        // Only the bytes wait for the answer, not a JSON tree several times their size (a
        // session's request is in flight for the model's whole latency).
        let body = self.request_bytes(request)?;
        let call = self.http.call()?;
        let mut req = call
            .post(&self.url)
            .header("anthropic-version", &self.config.version)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(body);
        if let Some(key) = &self.config.api_key {
            req = req.header("x-api-key", key);
        }
        let resp = self
            .http
            .send(req, &self.url, self.config.timeouts.idle)
            .await?;
        let status = resp.status();
        if status.is_redirection() {
            return Err(endpoint::redirect_error(&self.url, &resp));
        }
        if !status.is_success() {
            let err = http_error(resp, self.config.timeouts.idle).await;
            let keyed = self.config.api_key.is_some();
            return Err(endpoint::name_the_key(err, "ANTHROPIC_API_KEY", keyed));
        }
        let limits = RateLimitInfo::from_anthropic_headers(resp.headers());
        let events = call.hold(sse_events(resp, self.config.timeouts.idle));
        Ok(with_limits(limits, decode_stream(events)))
    }
}

async fn http_error(resp: reqwest::Response, idle: std::time::Duration) -> Error {
    let status = resp.status();
    let retry_after = retry_after(resp.headers());
    let limits = RateLimitInfo::from_anthropic_headers(resp.headers());
    // An error body that never finishes must not hang the caller; the status says enough.
    let text = error_body(resp, idle).await;
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
        limits: (!limits.is_empty()).then(|| Box::new(limits)),
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
