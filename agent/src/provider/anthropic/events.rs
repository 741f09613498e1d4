//! Decoding the Messages API stream: SSE events into [`LlmEvent`]s, with the event JSON
//! parsed into typed structs that are lenient the way the API's own SDKs are.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::provider::LlmEvent;
use crate::provider::lenient;
use crate::provider::sse::SseEvent;
use crate::schema::{FinishReason, Usage};

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
    /// A use of Anthropic's own tool (`server_tool_use`): its ordinal among those uses.
    Server {
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
    /// The `server_tool_use` blocks of this answer so far.
    server_uses: usize,
    /// Their ids: a result block is kept only for one of them, so that what is sent back
    /// pairs every result with its use.
    server_ids: HashSet<String>,
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

    fn block_start(&mut self, index: u64, mut cb: WireContentBlock, out: &mut Vec<LlmEvent>) {
        let kind = cb.kind.take().unwrap_or_default();
        let block = match kind.as_str() {
            "text" => {
                self.text_start(cb, out);
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
                let (arguments, whole) = whole_input(&cb.input);
                out.push(LlmEvent::ToolCallDelta {
                    index: ordinal,
                    id: cb.id,
                    name: cb.name,
                    arguments,
                });
                Block::Tool { ordinal, whole }
            }
            // Run by Anthropic during the answer (web search): kept, never a tool call.
            "server_tool_use" => {
                let ordinal = self.server_uses;
                self.server_uses += 1;
                if let Some(id) = cb.id.as_ref().filter(|id| !id.is_empty()) {
                    self.server_ids.insert(id.clone());
                }
                let (input, whole) = whole_input(&cb.input);
                out.push(LlmEvent::ServerToolDelta {
                    index: ordinal,
                    id: cb.id,
                    name: cb.name,
                    input,
                });
                Block::Server { ordinal, whole }
            }
            kind if kind.ends_with("_tool_result") && kind != "tool_result" => {
                if let Some(id) = cb.tool_use_id.filter(|id| self.server_ids.contains(id)) {
                    out.push(LlmEvent::ServerToolResult {
                        tool_use_id: id,
                        kind: kind.to_string(),
                        content: cb.content.unwrap_or(Value::Null),
                    });
                }
                Block::Ignored
            }
            _ => Block::Ignored,
        };
        self.blocks.insert(index, block);
    }

    fn text_start(&mut self, cb: WireContentBlock, out: &mut Vec<LlmEvent>) {
        out.push(LlmEvent::TextBlock);
        if let Some(t) = cb.text.filter(|t| !t.is_empty()) {
            out.push(LlmEvent::TextDelta(t));
        }
        if let Some(Value::Array(citations)) = cb.citations {
            out.extend(citations.into_iter().map(LlmEvent::Citation));
        }
    }

    fn block_delta(&mut self, index: u64, d: WireDelta, out: &mut Vec<LlmEvent>) {
        let block = self.blocks.get(&index).copied();
        let ty = d.kind.as_deref().unwrap_or_default();
        let text = match ty {
            "text_delta" => d.text,
            "input_json_delta" => d.partial_json,
            "thinking_delta" => d.thinking,
            "signature_delta" => d.signature,
            "citations_delta" => {
                if let (Some(Block::Text), Some(c @ Value::Object(_))) = (block, d.citation) {
                    out.push(LlmEvent::Citation(c));
                }
                return;
            }
            // Later additions carry nothing the schema keeps.
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
            (
                "input_json_delta",
                Some(Block::Server {
                    ordinal,
                    whole: false,
                }),
            ) => LlmEvent::ServerToolDelta {
                index: ordinal,
                id: None,
                name: None,
                input: text,
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
            (
                u.server_tool_use.web_search_requests,
                &mut self.usage.web_search_requests,
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
// of an unexpected JSON type is treated as absent (see [`lenient`](crate::provider::lenient)), unknown fields and
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
    /// A server tool's result block: the use it answers, and what it gave back.
    #[serde(deserialize_with = "lenient::string")]
    tool_use_id: Option<String>,
    content: Option<Value>,
    /// A text block's citations (streamed answers send them as deltas instead).
    citations: Option<Value>,
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
    /// `citations_delta`: one citation of the text block.
    citation: Option<Value>,
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
    #[serde(deserialize_with = "lenient::object")]
    server_tool_use: WireServerToolUsage,
}

/// `usage.server_tool_use`: what Anthropic's own tools ran for the answer.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireServerToolUsage {
    #[serde(deserialize_with = "lenient::u64")]
    web_search_requests: Option<u64>,
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

/// A `tool_use` or `server_tool_use` block's input when its start event carries it whole
/// (as JSON text, and `true`), else nothing (its deltas bring it).
fn whole_input(input: &Option<Value>) -> (String, bool) {
    match input {
        Some(input @ Value::Object(o)) if !o.is_empty() => (input.to_string(), true),
        _ => (String::new(), false),
    }
}

fn map_stop_reason(r: &str) -> FinishReason {
    match r {
        "end_turn" | "stop_sequence" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" => FinishReason::Length,
        "refusal" => FinishReason::ContentFilter,
        "pause_turn" => FinishReason::Paused,
        other => FinishReason::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
