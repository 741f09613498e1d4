//! The Messages API request body, built from typed wire structs that borrow from the
//! neutral request: strict user/assistant alternation, tool results first in the user turn
//! that answers the `tool_use` blocks, signed thinking replayed verbatim, and the web
//! search Anthropic runs itself offered as its server tool, with what it ran in earlier
//! answers sent back as it came.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::provider::{LlmRequest, f32_for_json};
use crate::schema::{Message, Role, ServerBlock, ToolCall, ToolSpec};
use crate::spec::{WEB_SEARCH_TOOL, WebSearch};

/// The version of Anthropic's web search tool this module speaks: the `type` of the
/// tool offered, whose blocks (`server_tool_use`, `web_search_tool_result`) it decodes.
pub(super) const WEB_SEARCH_TYPE: &str = "web_search_20250305";

#[derive(Serialize)]
pub(super) struct WireRequest<'a> {
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
#[serde(untagged)]
enum WireTool<'a> {
    Custom {
        name: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        description: &'a str,
        input_schema: Cow<'a, Value>,
    },
    /// Anthropic's own web search: it runs the searches during the answer.
    WebSearch {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'static str,
        max_uses: u32,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        allowed_domains: &'a [String],
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        blocked_domains: &'a [String],
    },
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
        #[serde(skip_serializing_if = "<[Value]>::is_empty")]
        citations: &'a [Value],
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
        input: ToolInput<'a>,
    },
    ToolResult {
        tool_use_id: String,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    ServerToolUse {
        id: String,
        name: &'a str,
        input: Cow<'a, Value>,
    },
    /// A server tool's result, whose type is the tool's own (`web_search_tool_result`).
    #[serde(untagged)]
    ServerToolResult {
        #[serde(rename = "type")]
        kind: &'a str,
        tool_use_id: String,
        content: &'a Value,
    },
}

/// One turn being built; blocks are only collapsed to a plain string at the end.
struct Turn<'a> {
    role: &'static str,
    blocks: Vec<WireBlock<'a>>,
}

pub(super) fn build_body(request: &LlmRequest<'_>, thinking_budget: Option<u32>) -> Value {
    // Serializing these structs cannot fail: every map key is a string.
    serde_json::to_value(wire_request(request, thinking_budget)).unwrap_or_default()
}

pub(super) fn wire_request<'a>(
    request: &'a LlmRequest<'a>,
    thinking_budget: Option<u32>,
) -> WireRequest<'a> {
    let searches = request.web_search.is_some();
    let (messages, stray_system) =
        convert_messages(request.messages.iter().map(|m| &**m), searches);
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
        tools: wire_tools(&request.tools, request.web_search.as_ref()),
        messages,
    }
}

/// The session's tools, then the web search when the request offers it. A local tool
/// of the search's name cannot be told from it by the model: it is left out (hosts
/// never register one).
fn wire_tools<'a>(tools: &'a [ToolSpec], web_search: Option<&'a WebSearch>) -> Vec<WireTool<'a>> {
    let mut out: Vec<WireTool<'a>> = tools
        .iter()
        .filter(|t| web_search.is_none() || t.name != WEB_SEARCH_TOOL)
        .map(wire_tool)
        .collect();
    if let Some(w) = web_search {
        out.push(WireTool::WebSearch {
            kind: WEB_SEARCH_TYPE,
            name: WEB_SEARCH_TOOL,
            max_uses: w.max_uses(),
            allowed_domains: &w.allowed_domains,
            blocked_domains: &w.blocked_domains,
        });
    }
    out
}

fn wire_tool(t: &ToolSpec) -> WireTool<'_> {
    let input_schema = match &t.parameters {
        Value::Object(o) if !o.is_empty() => Cow::Borrowed(&t.parameters),
        _ => Cow::Owned(json!({"type": "object", "properties": {}})),
    };
    WireTool::Custom {
        name: &t.name,
        description: &t.description,
        input_schema,
    }
}

/// Converts the history into alternating user/assistant turns. Returns the turns and the
/// text of any `System` messages found in the history (the API takes those only in
/// `system`). With `searches` (the request offers the web search), what the search ran in
/// earlier answers goes back as it came; without, only their text does.
fn convert_messages<'m>(
    messages: impl IntoIterator<Item = &'m Message>,
    searches: bool,
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
                let block = WireBlock::Text {
                    text: &m.content,
                    citations: &[],
                };
                match turns.last_mut() {
                    Some(t) if t.role == "user" => t.blocks.push(block),
                    _ => turns.push(Turn {
                        role: "user",
                        blocks: vec![block],
                    }),
                }
            }
            Role::Assistant => {
                let blocks = assistant_blocks(m, searches);
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
                [WireBlock::Text { text, .. }] if t.role == "user" => TurnContent::Text(text),
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

fn assistant_blocks(m: &Message, searches: bool) -> Vec<WireBlock<'_>> {
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
    if searches && !m.server_content.is_empty() {
        blocks.extend(m.server_content.iter().filter_map(server_block));
    } else if !m.content.is_empty() {
        blocks.push(WireBlock::Text {
            text: &m.content,
            citations: &[],
        });
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

/// One block of what a server tool ran in an answer, as it came (empty text, which the
/// API refuses, left out).
fn server_block(b: &ServerBlock) -> Option<WireBlock<'_>> {
    Some(match b {
        ServerBlock::Text { text, citations } => {
            if text.is_empty() {
                return None;
            }
            WireBlock::Text { text, citations }
        }
        ServerBlock::ToolUse { id, name, input } => WireBlock::ServerToolUse {
            id: wire_id(id),
            name,
            input: object_input(input),
        },
        ServerBlock::ToolResult {
            tool_use_id,
            kind,
            content,
        } => WireBlock::ServerToolResult {
            kind,
            tool_use_id: wire_id(tool_use_id),
            content,
        },
    })
}

/// A call's `tool_use.input`: its arguments' text as it is kept when that is an object
/// the model wrote, else the value [`object_input`] makes of it.
#[derive(Serialize)]
#[serde(untagged)]
enum ToolInput<'a> {
    Text(&'a RawValue),
    Value(Value),
}

/// `tool_use.input` must be an object; anything else is wrapped so the model sees it.
fn tool_input(c: &ToolCall) -> ToolInput<'_> {
    if c.arguments.text().starts_with('{') && !c.arguments.may_be_raw_wrapper() {
        return ToolInput::Text(c.arguments.raw());
    }
    ToolInput::Value(object_input(&c.arguments.value()).into_owned())
}

fn object_input(input: &Value) -> Cow<'_, Value> {
    match input {
        Value::Object(o) => match o.get("_raw") {
            Some(raw) if o.len() == 1 && !raw.is_string() => {
                Cow::Owned(json!({"_raw": raw.to_string()}))
            }
            _ => Cow::Borrowed(input),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::ThinkingBlock;

    fn req(messages: Vec<Message>) -> LlmRequest<'static> {
        LlmRequest {
            model: "claude-test".into(),
            system: Some("sys".into()),
            messages: messages
                .into_iter()
                .map(crate::provider::ViewMessage::from)
                .collect(),
            tools: Vec::new().into(),
            temperature: 0.1,
            max_tokens: 100,
            session_id: String::new(),
            web_search: None,
        }
    }

    fn call(id: &str, args: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: args.into(),
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
    fn what_a_search_ran_goes_back_only_while_the_search_is_offered() {
        let mut a = Message::assistant("Searching.Found.");
        a.server_content = vec![
            ServerBlock::Text {
                text: "Searching.".into(),
                citations: Vec::new(),
            },
            ServerBlock::ToolUse {
                id: "srvtoolu_1".into(),
                name: "web_search".into(),
                input: json!({"query": "q"}),
            },
            ServerBlock::ToolResult {
                tool_use_id: "srvtoolu_1".into(),
                kind: "web_search_tool_result".into(),
                content: json!([{"type": "web_search_result", "encrypted_content": "e"}]),
            },
            ServerBlock::Text {
                text: String::new(),
                citations: vec![json!({"encrypted_index": "i"})],
            },
            ServerBlock::Text {
                text: "Found.".into(),
                citations: vec![json!({"encrypted_index": "i"})],
            },
        ];
        let mut r = req(vec![Message::user("hi"), a, Message::user("and?")]);
        // Without the search (a session that lost it, a mode without tools) the provider
        // would refuse its blocks: the answer's text goes back alone.
        let body = build_body(&r, None);
        assert_eq!(
            body["messages"][1]["content"],
            json!([{"type": "text", "text": "Searching.Found."}])
        );
        r.web_search = Some(WebSearch::default());
        let body = build_body(&r, None);
        assert_eq!(
            body["messages"][1]["content"],
            json!([
                {"type": "text", "text": "Searching."},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
                 "input": {"query": "q"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
                 "content": [{"type": "web_search_result", "encrypted_content": "e"}]},
                {"type": "text", "text": "Found.", "citations": [{"encrypted_index": "i"}]},
            ])
        );
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
