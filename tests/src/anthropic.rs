//! Anthropic answers written by hand, event by event as the Messages API streams them: for
//! the answers no recorded fixture covers (a provider's own tools, a paused turn).

use serde_json::{Value, json};

use crate::{FakeResponse, fixture};

/// An Anthropic stream of these events, in chunks of `chunk` bytes.
pub fn stream(events: &[Value], chunk: usize) -> FakeResponse {
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    FakeResponse::sse(FakeResponse::anthropic_jsonl(&lines.join("\n")), chunk)
}

/// The events of the fixture `name` (one JSON event a line).
pub fn fixture_events(name: &str) -> Vec<Value> {
    let text = String::from_utf8(fixture(name))
        .unwrap_or_else(|e| panic!("fixture {name} is not UTF-8: {e}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("fixture {name}: {e}: {l}")))
        .collect()
}

/// The events of a block: its start (with `block`), its deltas, its stop.
pub fn block(index: usize, block: Value, deltas: &[Value]) -> Vec<Value> {
    let mut out =
        vec![json!({"type": "content_block_start", "index": index, "content_block": block})];
    out.extend(
        deltas
            .iter()
            .map(|d| json!({"type": "content_block_delta", "index": index, "delta": d})),
    );
    out.push(json!({"type": "content_block_stop", "index": index}));
    out
}

pub fn text_block(index: usize, text: &str) -> Vec<Value> {
    block(
        index,
        json!({"type": "text", "text": ""}),
        &[json!({"type": "text_delta", "text": text})],
    )
}

/// A use of a server tool: `input` streamed after an empty start input, as documented.
pub fn server_use(index: usize, id: &str, name: &str, input: &Value) -> Vec<Value> {
    block(
        index,
        json!({"type": "server_tool_use", "id": id, "name": name, "input": {}}),
        &[json!({"type": "input_json_delta", "partial_json": input.to_string()})],
    )
}

/// What an answer of `model` spent, as its start and its end report it.
pub struct Spent {
    pub input: u64,
    pub output: u64,
    pub searches: u64,
}

/// A whole answer of `model`: `blocks`' events between the message's start and its end.
pub fn answer(model: &str, blocks: Vec<Vec<Value>>, stop: &str, spent: Spent) -> Vec<Value> {
    let mut out = vec![json!({"type": "message_start", "message": {
        "id": "msg_written", "type": "message", "role": "assistant", "model": model,
        "content": [], "usage": {"input_tokens": spent.input, "output_tokens": 1}}})];
    out.extend(blocks.into_iter().flatten());
    out.push(
        json!({"type": "message_delta", "delta": {"stop_reason": stop},
        "usage": {"output_tokens": spent.output,
            "server_tool_use": {"web_search_requests": spent.searches}}}),
    );
    out.push(json!({"type": "message_stop"}));
    out
}
