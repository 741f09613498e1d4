//! The Chat Completions request body, built from typed wire structs that borrow from the
//! neutral request.

use serde::Serialize;
use serde_json::Value;

use crate::provider::{LlmRequest, f32_for_json};
use crate::schema::{Message, Role, ToolCall};

/// The body for `request`; assistant turns carry their thinking in `replay_field` when set.
pub(super) fn wire_request<'a>(
    request: &'a LlmRequest<'a>,
    replay_field: Option<&'a str>,
) -> WireRequest<'a> {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(WireMessage::text("system", system));
    }
    messages.extend(
        request
            .messages
            .iter()
            .map(|m| wire_message(m, replay_field)),
    );
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

fn wire_message<'a>(m: &'a Message, replay_field: Option<&'a str>) -> WireMessage<'a> {
    match m.role {
        Role::System => WireMessage::text("system", &m.content),
        Role::User => WireMessage::text("user", &m.content),
        Role::Tool => WireMessage {
            tool_call_id: Some(m.tool_call_id.as_deref().unwrap_or_default()),
            ..WireMessage::text("tool", &m.content)
        },
        Role::Assistant => {
            // A turn that only calls tools has `null` content, as OpenAI sends it.
            let content =
                (!m.content.is_empty() || m.tool_calls.is_empty()).then_some(m.content.as_str());
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
            let reasoning = replay_field.and_then(|field| {
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

#[derive(Serialize)]
pub(super) struct WireRequest<'a> {
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
    if call.arguments.may_be_raw_wrapper()
        && let Value::Object(map) = call.arguments.value()
        && map.len() == 1
        && let Some(Value::String(raw)) = map.get("_raw")
    {
        return raw.clone();
    }
    call.arguments.text().to_owned()
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
            arguments: json!({"_raw": "{\"a\": 1"}).into(),
        };
        assert_eq!(arguments_string(&call), "{\"a\": 1");
        let call = ToolCall {
            arguments: json!({"a": 1}).into(),
            ..call
        };
        assert_eq!(arguments_string(&call), "{\"a\":1}");
    }
}
