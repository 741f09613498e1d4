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
    #[schema(value_type = Value)]
    pub arguments: Arguments,
}

impl ToolCall {
    /// Parse streamed argument text tolerantly, so a malformed call goes back to the model
    /// to fix instead of failing the turn: empty means `{}`, invalid JSON
    /// becomes `{"_raw": text}`.
    pub fn parse_arguments(raw: &str) -> Arguments {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Arguments::default();
        }
        match serde_json::from_str::<Value>(trimmed) {
            Ok(v) => Arguments::from(&v),
            Err(_) => Arguments::from(&serde_json::json!({ "_raw": raw })),
        }
    }
}

/// A tool call's arguments, kept as their compact JSON text rather than as a parsed
/// value. Every call stays in its session's history, which a session holds in memory for
/// its whole life and sends back with every request: a parsed object is a B-tree node of
/// about 630 bytes even for `{"path": "."}`, its text a few bytes, and the text is written
/// into each request and each stored message as it is. What reads the arguments (a tool,
/// a guard, a policy) parses them with [`Arguments::value`].
///
/// The text is always that of a parsed value written again (keys in order, no spaces), so
/// two equal values have equal texts and equality compares the texts.
#[derive(Clone)]
pub struct Arguments(Box<serde_json::value::RawValue>);

impl Arguments {
    /// The arguments as a JSON value, parsed anew.
    pub fn value(&self) -> Value {
        // The text was written from a value, so it parses; `Null` is only a guard.
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }

    /// The compact JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }

    /// The text, to be written into JSON as it is.
    pub fn raw(&self) -> &serde_json::value::RawValue {
        &self.0
    }

    /// Whether these may be the `{"_raw": text}` that [`ToolCall::parse_arguments`] makes
    /// of text that was not JSON: an object whose first key is `_raw`. The text is
    /// canonical (keys in order, no spaces), so that is a prefix; a provider that gives the
    /// model its own text back checks the value only then.
    pub fn may_be_raw_wrapper(&self) -> bool {
        self.text().starts_with(r#"{"_raw":"#)
    }
}

impl From<&Value> for Arguments {
    fn from(v: &Value) -> Self {
        // Writing a `Value` cannot fail (its keys are strings); the fallback is a guard.
        let raw = serde_json::value::to_raw_value(v)
            .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned());
        Arguments(raw)
    }
}

impl From<Value> for Arguments {
    fn from(v: Value) -> Self {
        Arguments::from(&v)
    }
}

impl Default for Arguments {
    fn default() -> Self {
        Arguments::from(&Value::Object(Default::default()))
    }
}

impl PartialEq for Arguments {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl PartialEq<Value> for Arguments {
    fn eq(&self, other: &Value) -> bool {
        self.value() == *other
    }
}

impl std::fmt::Debug for Arguments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl std::fmt::Display for Arguments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text())
    }
}

impl Serialize for Arguments {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Arguments {
    /// Through a parsed value, whatever the input's form: the text is then the canonical
    /// one (see the type), and a deserializer that is not reading JSON text works too.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Value::deserialize(d).map(|v| Arguments::from(&v))
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
    #[schema(value_type = Option<Value>)]
    pub edited_arguments: Option<Arguments>,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_kept_as_canonical_text() {
        // Key order and spacing are the model's; the text kept is the value's.
        let a =
            ToolCall::parse_arguments(" { \"b\": [1, 2.5], \"a\": {\"y\": null, \"x\": \"é\"} } ");
        assert_eq!(a.text(), r#"{"a":{"x":"é","y":null},"b":[1,2.5]}"#);
        assert_eq!(
            a,
            ToolCall::parse_arguments(r#"{"a":{"y":null,"x":"é"},"b":[1,2.5]}"#)
        );
        assert_eq!(a, json!({"a": {"x": "é", "y": null}, "b": [1, 2.5]}));
        assert_ne!(a, ToolCall::parse_arguments(r#"{"a":{},"b":[1,2.5]}"#));
        assert_eq!(ToolCall::parse_arguments("  ").text(), "{}");
        assert_eq!(
            ToolCall::parse_arguments("{\"path\": ").value(),
            json!({"_raw": "{\"path\": "})
        );
        assert!(ToolCall::parse_arguments("{\"path\": ").may_be_raw_wrapper());
        assert!(!a.may_be_raw_wrapper());
        // A model's own `_raw` key, spaced or not, is found the same way.
        assert!(ToolCall::parse_arguments(r#"{ "_raw" : 5 }"#).may_be_raw_wrapper());
        // A fat pointer to the text, where a `Value` is 32 bytes and an object's map a
        // B-tree node of about 630.
        assert_eq!(std::mem::size_of::<Arguments>(), 16);
    }

    #[test]
    fn a_call_reads_and_writes_as_it_did_with_parsed_arguments() {
        let call = ToolCall {
            id: "c1".into(),
            name: "write_file".into(),
            arguments: json!({"path": "a.txt", "content": "x\ny"}).into(),
        };
        let text = serde_json::to_string(&call).unwrap();
        assert_eq!(
            text,
            r#"{"id":"c1","name":"write_file","arguments":{"content":"x\ny","path":"a.txt"}}"#
        );
        assert_eq!(serde_json::from_str::<ToolCall>(&text).unwrap(), call);
        // Through a `Value` both ways, as the API's views and the stores' rows go.
        let value = serde_json::to_value(&call).unwrap();
        assert_eq!(value["arguments"]["path"], "a.txt");
        assert_eq!(serde_json::from_value::<ToolCall>(value).unwrap(), call);
        // Written in the model's own spacing, read back canonical.
        let spaced =
            r#"{"id":"c1","name":"write_file","arguments":{ "path" : "a.txt", "content":"x\ny" }}"#;
        assert_eq!(serde_json::from_str::<ToolCall>(spaced).unwrap(), call);
    }
}
