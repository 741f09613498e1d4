//! The internal, provider-neutral conversation schema. Providers convert to and from it at
//! their edge; the loop, the store and the API only ever see these types.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool call requested by the model. `arguments` is always a JSON value: arguments that
/// were not valid JSON are kept as `{"_raw": "<text>"}` so the model can see and fix them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

impl ToolCall {
    /// Parse streamed argument text tolerantly, so a malformed call goes back to the model
    /// to fix instead of failing the turn: empty means `{}`, invalid JSON
    /// becomes `{"_raw": text}`.
    pub fn parse_arguments(raw: &str) -> Value {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Value::Object(Default::default());
        }
        match serde_json::from_str::<Value>(trimmed) {
            Ok(v) => v,
            Err(_) => serde_json::json!({ "_raw": raw }),
        }
    }
}

/// Reasoning the model produced. Anthropic thinking blocks must be replayed verbatim with
/// their `signature`; `redacted` holds the opaque data of a `redacted_thinking` block.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, ToSchema)]
pub struct ThinkingBlock {
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<String>,
}

/// What one LLM call (or a session, summed) spent: tokens, and the searches a provider ran
/// for it server-side, which are billed per search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Web searches the provider ran during the call. Left out of the stored and served
    /// form while 0, so a usage without searches reads and writes as it always has.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub web_search_requests: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// The largest count kept: the widest signed integer, which is what stores hold.
    pub const MAX_COUNT: u64 = i64::MAX as u64;

    /// Saturating at [`Usage::MAX_COUNT`]: the counts come from the provider, which may
    /// report anything, and a session's counts must stay storable.
    pub fn add(&mut self, other: &Usage) {
        let sum = |a: u64, b: u64| a.saturating_add(b).min(Self::MAX_COUNT);
        self.input_tokens = sum(self.input_tokens, other.input_tokens);
        self.output_tokens = sum(self.output_tokens, other.output_tokens);
        self.cache_read_tokens = sum(self.cache_read_tokens, other.cache_read_tokens);
        self.cache_write_tokens = sum(self.cache_write_tokens, other.cache_write_tokens);
        self.reasoning_tokens = sum(self.reasoning_tokens, other.reasoning_tokens);
        self.web_search_requests = sum(self.web_search_requests, other.web_search_requests);
    }

    /// Tokens in and out: what token budgets count (searches are priced, not tokens).
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Why one LLM response ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    #[default]
    Stop,
    ToolCalls,
    Length,
    ContentFilter,
    Error,
    /// The provider paused a long turn (its own tools ran long): sent back as it is, the
    /// answer goes on. Not an answer yet.
    Paused,
    Other(String),
}

/// One entry of a session's history. Assistant messages carry their tool calls; each tool
/// result is its own `Tool` message paired by `tool_call_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking: Vec<ThinkingBlock>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For assistant messages in which the provider ran a tool of its own (web search):
    /// the answer's text blocks and those tools' uses and results, in the order they came
    /// (`content` still holds the whole text). The provider needs them back as it sent
    /// them; they are never `tool_calls` and never run here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_content: Vec<ServerBlock>,
    /// For `Tool` messages: the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// For `Tool` messages: the tool's name (Anthropic and some servers want it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// For assistant messages: what this response cost and which model produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// For `Tool` messages: the arguments the call ran with when a person edited the
    /// model's before approving it (the model's stay on its call); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_arguments: Option<serde_json::Value>,
}

impl Message {
    fn bare(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            thinking: Vec::new(),
            tool_calls: Vec::new(),
            server_content: Vec::new(),
            tool_call_id: None,
            name: None,
            is_error: false,
            usage: None,
            model: None,
            finish_reason: None,
            edited_arguments: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::bare(Role::System, content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::bare(Role::User, content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::bare(Role::Assistant, content)
    }

    pub fn tool_result(
        tool_call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
        is_error: bool,
    ) -> Self {
        let mut m = Self::bare(Role::Tool, content);
        m.tool_call_id = Some(tool_call_id.into());
        m.name = Some(name.into());
        m.is_error = is_error;
        m
    }
}

/// One block of an answer in which the provider ran a tool of its own
/// (a message's `server_content`). The provider's data in it (a search's results, which
/// carry encrypted content; a citation's reference into them) is opaque and kept as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerBlock {
    /// A block of the answer's text, with the provider's citations of it.
    Text {
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        citations: Vec<Value>,
    },
    /// The model used one of the provider's own tools (`web_search`): the provider ran it.
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    /// What that tool gave back: a block of type `kind` (`web_search_tool_result`) whose
    /// `content` is sent back as it came.
    ToolResult {
        tool_use_id: String,
        kind: String,
        #[serde(default)]
        content: Value,
    },
}

impl ServerBlock {
    /// Whether this is a use of the provider's tool `name`.
    pub fn is_use_of(&self, name: &str) -> bool {
        matches!(self, ServerBlock::ToolUse { name: n, .. } if n == name)
    }
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}
