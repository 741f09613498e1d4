//! The `LlmProvider` trait and the neutral request/stream types. Each provider module owns
//! its wire structs and converts at this boundary; vendor payloads never leave this folder.

use std::borrow::Cow;
use std::ops::Deref;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::schema::{FinishReason, Message, ToolSpec, Usage};
use crate::spec::WebSearch;

pub use ratelimit::RateLimitInfo;

pub mod anthropic;
pub mod endpoint;
pub mod factory;
mod lenient;
pub mod openai;
pub mod ratelimit;
pub mod scripted;
pub mod sse;
pub mod transport;

/// One request to a model. `messages` is the request view: already windowed, compacted and
/// repaired by the loop; it never contains `System` messages (the prompt is in `system`).
///
/// It borrows from the session's state (the history can be long, and a request is built
/// for every iteration): a message the view did not change is not copied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest<'a> {
    pub model: String,
    pub system: Option<Cow<'a, str>>,
    pub messages: Vec<ViewMessage<'a>>,
    pub tools: Cow<'a, [ToolSpec]>,
    pub temperature: f32,
    pub max_tokens: u32,
    /// The session this request belongs to; providers may use it as a user/trace id.
    #[serde(default)]
    pub session_id: String,
    /// Offer the provider's own web search beside `tools` (it runs the searches; see
    /// [`LlmProvider::web_search`]). Only sent to a provider that can: one that cannot
    /// refuses the request rather than answer without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search: Option<WebSearch>,
}

impl LlmRequest<'_> {
    /// The same request, owning everything (to keep it past the state it came from).
    pub fn into_owned(self) -> LlmRequest<'static> {
        LlmRequest {
            model: self.model,
            system: self.system.map(|s| Cow::Owned(s.into_owned())),
            messages: self
                .messages
                .into_iter()
                .map(|m| ViewMessage::from(m.into_owned()))
                .collect(),
            tools: Cow::Owned(self.tools.into_owned()),
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            session_id: self.session_id,
            web_search: self.web_search,
        }
    }
}

/// One message of a request's view: the history's own, borrowed, or one the view made (a
/// synthesized result, a compacted output). A pointer either way: a request is held for
/// its call's whole latency, and a `Cow<Message>` is as large as a message (288 bytes)
/// for every message the view shows.
#[derive(Debug, Clone)]
pub enum ViewMessage<'a> {
    Borrowed(&'a Message),
    Owned(Box<Message>),
}

impl ViewMessage<'_> {
    /// The message, made the view's own copy first if it was borrowed.
    pub fn to_mut(&mut self) -> &mut Message {
        if let ViewMessage::Borrowed(m) = *self {
            *self = ViewMessage::Owned(Box::new(m.clone()));
        }
        match self {
            ViewMessage::Owned(m) => m,
            ViewMessage::Borrowed(_) => unreachable!("made owned above"),
        }
    }

    pub fn into_owned(self) -> Message {
        match self {
            ViewMessage::Borrowed(m) => m.clone(),
            ViewMessage::Owned(m) => *m,
        }
    }
}

impl Deref for ViewMessage<'_> {
    type Target = Message;

    fn deref(&self) -> &Message {
        match self {
            ViewMessage::Borrowed(m) => m,
            ViewMessage::Owned(m) => m,
        }
    }
}

impl std::borrow::Borrow<Message> for ViewMessage<'_> {
    fn borrow(&self) -> &Message {
        self
    }
}

impl<'a> From<&'a Message> for ViewMessage<'a> {
    fn from(m: &'a Message) -> Self {
        ViewMessage::Borrowed(m)
    }
}

impl From<Message> for ViewMessage<'_> {
    fn from(m: Message) -> Self {
        ViewMessage::Owned(Box::new(m))
    }
}

/// Equal when the messages are, borrowed or not.
impl PartialEq for ViewMessage<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Serialize for ViewMessage<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for ViewMessage<'_> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Message::deserialize(d).map(ViewMessage::from)
    }
}

/// What a provider streams back. Tool-call fragments are keyed by `index`; the loop
/// assembles them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LlmEvent {
    TextDelta(String),
    /// Appends to the current thinking block (opens one if none is open).
    ThinkingDelta(String),
    /// Sets the signature of the current thinking block and closes it.
    ThinkingSignature(String),
    /// A complete `redacted_thinking` block.
    RedactedThinking(String),
    ToolCallDelta {
        index: usize,
        /// Present on the first fragment; later fragments may repeat it or send "".
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
    /// A text block of the answer begins (providers whose answers are made of blocks):
    /// what follows is a block of its own where the answer is kept block by block.
    TextBlock,
    /// A citation of the text block being streamed, as the provider sent it (opaque).
    Citation(serde_json::Value),
    /// A fragment of a use of the provider's own tool (web search), keyed by `index` like
    /// a tool call's: kept in the transcript, never run here.
    ServerToolDelta {
        index: usize,
        id: Option<String>,
        name: Option<String>,
        input: String,
    },
    /// What the provider's own tool gave back for the use `tool_use_id`: a block of type
    /// `kind`, kept as it came.
    ServerToolResult {
        tool_use_id: String,
        kind: String,
        content: serde_json::Value,
    },
    /// The usage so far, as a total: the assembler assigns, never adds.
    Usage(Usage),
    /// The model that answered, when the provider reports it.
    Model(String),
    Done(FinishReason),
    /// The rate-limit state the answer's headers announced; sent first, when any. Not
    /// part of the message: the loop reports it to its admission.
    RateLimits(RateLimitInfo),
}

pub type LlmStream = Pin<Box<dyn Stream<Item = Result<LlmEvent>> + Send>>;

#[async_trait]
pub trait LlmProvider: Send + Sync {
    /// `openai`, `anthropic`, `scripted`: used in metrics and spans.
    fn name(&self) -> &str;

    /// Send one request. Errors before the first byte (HTTP status, connect) come back
    /// here; errors after it come through the stream.
    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream>;

    /// What the fleet's rate limits for this provider are keyed by: calls with the same
    /// key draw on the same provider quota. Made of the provider's name, its endpoint and
    /// a short digest of its API key (never the key itself; see [`limit_key`]), so that
    /// workers with the same endpoint and key share limits and tenants with their own
    /// keys do not.
    fn limit_key(&self) -> String {
        self.name().to_string()
    }

    /// Whether the provider runs a web search itself when a request offers one
    /// ([`LlmRequest::web_search`]). A host never runs a session that asks for it on a
    /// provider that cannot: there is no local stand-in.
    fn web_search(&self) -> bool {
        false
    }
}

/// What a provider that cannot search the web answers a request that offers the search
/// (hosts check [`LlmProvider::web_search`] first; this is the last line).
pub(crate) fn no_web_search(provider: &str) -> crate::error::Error {
    crate::error::Error::Config(format!(
        "`{}` is a search the provider runs itself, and provider `{provider}` cannot: \
         run the session on anthropic, or leave the tool out",
        crate::spec::WEB_SEARCH_TOOL
    ))
}

/// Timeouts for streaming HTTP providers. There is deliberately no total timeout: a long
/// answer is fine as long as bytes keep coming.
#[derive(Debug, Clone, Copy)]
pub struct HttpTimeouts {
    pub connect: Duration,
    /// Longest silence allowed between two chunks (and before the first one).
    pub idle: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        HttpTimeouts {
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(120),
        }
    }
}

/// An `f32` as the f64 its decimal form denotes, for request bodies: `0.1f32` goes out as
/// `0.1` (what the session asked for), not as `0.10000000149011612` (the f32 widened).
pub(crate) fn f32_for_json(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(f64::from(x))
}

/// Parse a `Retry-After` header: delta-seconds (possibly fractional) or an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Some(Duration::from_secs_f64(secs.min(3600.0)));
        }
        return None;
    }
    let when = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// How long an error answer asks the client to wait: `retry-after-ms` (OpenAI's and
/// Anthropic's SDKs read it first), else `Retry-After`.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(3600.0)));
    }
    header("retry-after").and_then(parse_retry_after)
}

/// `stream`, led by the rate-limit state its answer's headers announced (when they
/// announced any): the loop hands it to its admission, the assembler ignores it.
pub(crate) fn with_limits(limits: RateLimitInfo, stream: LlmStream) -> LlmStream {
    use futures::StreamExt;
    if limits.is_empty() {
        return stream;
    }
    Box::pin(
        futures::stream::once(std::future::ready(Ok(LlmEvent::RateLimits(limits)))).chain(stream),
    )
}

/// [`LlmProvider::limit_key`] from its parts: `name|endpoint|key digest`. The endpoint
/// is normalized (scheme and host lowercased, trailing slashes dropped) so spellings of
/// one URL share a key; no key at all is `-`.
pub fn limit_key(name: &str, endpoint: &str, api_key: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let endpoint = normalize_endpoint(endpoint);
    let digest = match api_key.filter(|k| !k.is_empty()) {
        Some(k) => {
            let d = Sha256::digest(k.as_bytes());
            d.iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        }
        None => "-".to_string(),
    };
    format!("{name}|{endpoint}|{digest}")
}

fn normalize_endpoint(endpoint: &str) -> String {
    let trimmed = endpoint.trim().trim_end_matches('/');
    match reqwest::Url::parse(trimmed) {
        // `Url` lowercases the scheme and host and drops a default port.
        Ok(u) => u.as_str().trim_end_matches('/').to_string(),
        Err(_) => trimmed.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_view_message_is_a_pointer_and_copies_only_when_changed() {
        // What a request holds per message for its call's whole latency.
        assert!(std::mem::size_of::<ViewMessage<'_>>() <= 2 * std::mem::size_of::<usize>());
        let history = Message::user("task");
        let mut shown = ViewMessage::from(&history);
        assert!(matches!(shown, ViewMessage::Borrowed(_)));
        shown.to_mut().content.push_str(" (shortened)");
        assert!(matches!(shown, ViewMessage::Owned(_)));
        assert_eq!(history.content, "task");
        assert_eq!(shown.content, "task (shortened)");
        assert_ne!(shown, ViewMessage::from(&history));
        assert_eq!(
            ViewMessage::from(history.clone()),
            ViewMessage::from(&history)
        );
        let json = serde_json::to_string(&shown).unwrap();
        let back: ViewMessage<'_> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, shown);
    }
}
