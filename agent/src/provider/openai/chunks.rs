//! Decoding the streamed chunks: SSE events into [`LlmEvent`]s, leniently (compatible
//! servers differ in what they send), with `Done` held back until the stream is over.

use std::collections::{HashMap, VecDeque};

use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::Value;

use super::errors::{MAX_RAW_ERROR, error_code, truncate};
use crate::error::{Error, Result};
use crate::provider::sse::SseEvent;
use crate::provider::{LlmEvent, LlmStream};
use crate::schema::{FinishReason, Usage};

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

/// The events of one response's SSE stream. Ends after `[DONE]` (or after an EOF that
/// follows a finish reason) or at the first error.
pub(super) fn decode_stream<S>(events: S) -> LlmStream
where
    S: Stream<Item = Result<SseEvent>> + Send + 'static,
{
    let mut events = Box::pin(events);
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
    Box::pin(stream)
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
                web_search_requests: 0,
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
    let mut parser = crate::provider::sse::SseParser::new();
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

    use proptest::prelude::*;

    fn chunk() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#"{"model":"m","choices":[{"index":0,"delta":{"content":"hi"}}]}"#.to_string()),
            Just(r#"{"choices":[{"delta":{"reasoning_content":"r","reasoning":"s"}}]}"#.to_string()),
            Just(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":4294967295,"id":"c","function":{"name":"f","arguments":"{\"a\""}}]}}]}"#.to_string()),
            Just(r#"{"choices":[{"delta":{"tool_calls":[{"id":"d","function":{"arguments":{"a":1}}}]}}]}"#.to_string()),
            Just(r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":7}}]}}]}"#.to_string()),
            Just(r#"{"choices":[{"index":18446744073709551615,"finish_reason":"tool_calls"}]}"#.to_string()),
            Just(r#"{"choices":[{"finish_reason":"length"}],"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551615,"prompt_tokens_details":{"cached_tokens":18446744073709551615},"completion_tokens_details":{"reasoning_tokens":18446744073709551615}}}"#.to_string()),
            Just(r#"{"error":{"message":"busy","type":"server_error"}}"#.to_string()),
            Just(r#"{"choices":null,"usage":null}"#.to_string()),
            Just("[DONE]".to_string()),
            "[ -~\u{0}é🦀]{0,40}",
        ]
    }

    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            4 => chunk().prop_map(|c| format!("data: {c}\n\n").into_bytes()),
            1 => prop::collection::vec(any::<u8>(), 0..24),
        ];
        prop::collection::vec(line, 0..24).prop_map(|l| l.concat())
    }

    /// The events of `bytes` split at `sizes`, decoded as a live stream would be.
    fn decode_split(bytes: &[u8], sizes: &[usize]) -> usize {
        let mut parser = crate::provider::sse::SseParser::new();
        let mut state = StreamState::default();
        let mut events = Vec::new();
        let mut rest = bytes;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let n = sizes.next().copied().unwrap_or(1).clamp(1, rest.len());
            events.extend(parser.push(&rest[..n]));
            rest = &rest[n..];
        }
        events.extend(parser.finish());
        let mut out = 0;
        for ev in &events {
            if state.ended {
                break;
            }
            state.on_event(ev);
            out += state.ready.drain(..).count();
        }
        if !state.ended {
            state.on_eof();
        }
        out + state.ready.len()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes and almost-right chunk streams, arbitrarily split: decoding never
        /// panics, and the split does not change what comes out.
        #[test]
        fn any_stream_in_any_split_decodes_without_panic(
            bytes in stream(),
            sizes in prop::collection::vec(1usize..32, 1..16),
        ) {
            let whole = decode_body(&bytes).len();
            prop_assert_eq!(decode_split(&bytes, &sizes), whole);
        }

        #[test]
        fn arbitrary_bytes_decode_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_body(&bytes);
        }
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
