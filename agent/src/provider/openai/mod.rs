//! The OpenAI-compatible Chat Completions provider (OpenAI, vLLM, Ollama, llama.cpp,
//! OpenRouter, DeepSeek, Groq, xAI…). It owns the wire format: the request body built from
//! the neutral [`LlmRequest`], the streamed chunk structs, the mapping of chunks to
//! [`LlmEvent`]s, and the classification of HTTP and in-stream errors.
//!
//! Parsing is lenient on purpose: compatible servers differ in which fields they send,
//! send `null` where OpenAI omits a key, start tool-call indexes at 1, repeat ids as `""`,
//! and put usage in the finish chunk or in a separate `choices: []` chunk.
//!
//! `request` builds the body; `chunks` turns the streamed chunks into events.

use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::endpoint;
use super::sse::{error_body, sse_events};
use super::transport::{HttpPool, Transport};
use super::{
    HttpTimeouts, LlmProvider, LlmRequest, LlmStream, RateLimitInfo, retry_after, with_limits,
};
use crate::error::{Error, Result};

mod chunks;
mod errors;
mod request;

#[cfg(test)]
pub(crate) use chunks::decode_body;
use chunks::decode_stream;
use errors::{MAX_RAW_ERROR, is_context_length, parse_error_body, truncate};
use request::wire_request;

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Up to and including the version segment, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeouts: HttpTimeouts,
    pub transport: Transport,
    /// Sent with every request (e.g. OpenRouter's `HTTP-Referer`, an org or project id).
    pub extra_headers: Vec<(String, String)>,
}

impl OpenAiConfig {
    /// `OPENAI_BASE_URL` (default `https://api.openai.com/v1`) and `OPENAI_API_KEY`, read
    /// from the process environment: only for a caller acting on the operator's behalf
    /// (the provider factory never calls it). An empty key means none: local servers
    /// (Ollama, llama.cpp) need no key.
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
            transport: Transport::default(),
            extra_headers: Vec::new(),
        }
    }
}

pub struct OpenAiProvider {
    http: HttpPool,
    url: String,
    headers: HeaderMap,
    idle: Duration,
    /// The assistant-message field that carries earlier reasoning back to the server, for
    /// servers that want it replayed (DeepSeek's thinking mode with tools wants
    /// `reasoning_content`). None by default: most servers reject or ignore it.
    reasoning_replay_field: Option<String>,
    /// [`LlmProvider::limit_key`], computed once (it digests the key).
    limit_key: String,
    /// Whether a key goes with each request (for what a 401 says).
    keyed: bool,
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
        let parsed = reqwest::Url::parse(&url)
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

        let headers_have_key = headers.contains_key(AUTHORIZATION);
        let http = HttpPool::new(config.timeouts, config.transport, &parsed)?;
        let limit_key = super::limit_key("openai", base, config.api_key.as_deref());

        Ok(OpenAiProvider {
            http,
            url,
            headers,
            idle: config.timeouts.idle,
            reasoning_replay_field: None,
            limit_key,
            keyed: headers_have_key,
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
        serde_json::to_value(wire_request(
            request,
            self.reasoning_replay_field.as_deref(),
        ))
        .unwrap_or_default()
    }

    /// The bytes POSTed for `request`: [`OpenAiProvider::request_body`], serialized
    /// straight from the wire structs.
    /// A request offering the web search is refused (see [`no_web_search`]).
    pub fn request_bytes(&self, request: &LlmRequest<'_>) -> Result<Vec<u8>> {
        no_web_search(request)?;
        Ok(serde_json::to_vec(&wire_request(
            request,
            self.reasoning_replay_field.as_deref(),
        ))?)
    }
}

/// Chat completions offer a search only to their search models, which take no tools: an
/// agent's request cannot have both, so one asking for the web search is refused rather
/// than answered without it.
fn no_web_search(request: &LlmRequest<'_>) -> Result<()> {
    if request.web_search.is_some() {
        return Err(crate::provider::no_web_search("openai"));
    }
    Ok(())
}

#[async_trait]
impl LlmProvider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    fn limit_key(&self) -> String {
        self.limit_key.clone()
    }

    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream> {
        // Only the bytes wait for the answer, serialized straight from borrowed wire structs:
        // a JSON tree is several times their size, and a session's request is in flight
        // for the model's whole latency (the bench's 5 000 sessions peaked at 968 MiB with
        // trees, 726 without).
        let body = self.request_bytes(request)?;
        let call = self.http.call()?;
        let req = call
            .post(&self.url)
            .headers(self.headers.clone())
            .body(body);
        let resp = self.http.send(req, &self.url, self.idle).await?;

        let status = resp.status();
        if status.is_redirection() {
            return Err(endpoint::redirect_error(&self.url, &resp));
        }
        if !status.is_success() {
            let err = http_error(resp, self.idle).await;
            return Err(endpoint::name_the_key(err, "OPENAI_API_KEY", self.keyed));
        }

        let limits = RateLimitInfo::from_openai_headers(resp.headers());
        Ok(with_limits(
            limits,
            decode_stream(call.hold(sse_events(resp, self.idle))),
        ))
    }
}

/// Build the error for a non-2xx answer from its headers and body.
async fn http_error(resp: reqwest::Response, idle: Duration) -> Error {
    let status = resp.status();
    let retry_after = retry_after(resp.headers());
    let limits = RateLimitInfo::from_openai_headers(resp.headers());
    // The body of an error answer is bounded by the idle timeout too: a server that sends
    // the status and then stalls must not hang the session.
    let body = error_body(resp, idle).await;
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
        limits: (!limits.is_empty()).then(|| Box::new(limits)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
