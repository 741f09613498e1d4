//! What the bench's model says, and the capacity part's fake OpenAI-compatible endpoint:
//! the fixtures' fake LLM in its stateless mode, which after a fixed latency streams (SSE)
//! either a call to `list_dir` or, once the history holds `iterations - 1` assistant turns,
//! a final answer. Stateless: the turn is read from the request, like the scripted
//! provider, so any worker can continue a session.

use std::time::Duration;

use agentq_fixtures::{FakeLlm, FakeResponse};
use bytes::Bytes;

use crate::turns::{BUILTIN, FINAL_TEXT, TURN_TEXT};

/// Serve the endpoint on a free port of 127.0.0.1; its base URL (for `OPENAI_BASE_URL`)
/// is [`base_url`]. It serves until the runtime ends.
pub async fn start(latency: Duration, iterations: u32) -> anyhow::Result<FakeLlm> {
    FakeLlm::start_stateless(latency, move |body| answer(body, iterations)).await
}

/// The OpenAI base URL of a fake started by [`start`].
pub fn base_url(fake: &FakeLlm) -> String {
    format!("{}/v1", fake.url)
}

/// Assistant turns in a request body, counted on the raw bytes: parsing a long history
/// as JSON thousands of times a second would make the fake, not the worker, the limit.
pub(crate) fn assistant_turns(body: &[u8]) -> usize {
    let needle = b"\"role\":\"assistant\"";
    body.windows(needle.len()).filter(|w| *w == needle).count()
}

/// The streamed answer to a request whose history holds `body`'s assistant turns.
fn answer(body: &[u8], iterations: u32) -> FakeResponse {
    answer_calling(body, iterations, BUILTIN)
}

/// [`answer`], with turns but the last calling `tool`.
pub(crate) fn answer_calling(body: &[u8], iterations: u32, tool: &str) -> FakeResponse {
    let turn = assistant_turns(body);
    let last = turn + 1 >= iterations as usize;
    let mut out = String::with_capacity(1024);
    if last {
        out.push_str(&chunk(
            serde_json::json!({"role": "assistant", "content": FINAL_TEXT}),
            None,
        ));
        out.push_str(&chunk(serde_json::json!({}), Some("stop")));
    } else {
        out.push_str(&chunk(
            serde_json::json!({"role": "assistant", "content": TURN_TEXT}),
            None,
        ));
        out.push_str(&call_chunk(turn, tool, &serde_json::json!({"path": "."})));
        out.push_str(&chunk(serde_json::json!({}), Some("tool_calls")));
    }
    finish(out)
}

/// One OpenAI stream chunk of `delta`, framed as an SSE event.
pub(crate) fn chunk(delta: serde_json::Value, finish: Option<&str>) -> String {
    let v = serde_json::json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {v}\n\n")
}

/// The chunk of turn `turn`'s one call to `tool` with `arguments`.
pub(crate) fn call_chunk(turn: usize, tool: &str, arguments: &serde_json::Value) -> String {
    chunk(
        serde_json::json!({"tool_calls": [{
            "index": 0,
            "id": format!("call_{turn}"),
            "type": "function",
            "function": {"name": tool, "arguments": arguments.to_string()},
        }]}),
        None,
    )
}

/// `out` followed by the usage chunk and `[DONE]`, as one body.
pub(crate) fn finish(mut out: String) -> FakeResponse {
    out.push_str(
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":200,\"completion_tokens\":40,\"total_tokens\":240}}\n\n",
    );
    out.push_str("data: [DONE]\n\n");
    FakeResponse::sse_chunks(vec![Bytes::from(out)])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_last_turn_answers_and_the_others_call_list_dir() {
        let history =
            br#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}]}"#;
        let text = |r: FakeResponse| String::from_utf8(r.chunks[0].1.to_vec()).unwrap();
        let mid = text(answer(history, 3));
        assert!(
            mid.contains("\"list_dir\"") && mid.contains("call_1"),
            "{mid}"
        );
        assert!(mid.ends_with("data: [DONE]\n\n"), "{mid}");
        let last = text(answer(history, 2));
        assert!(
            last.contains(FINAL_TEXT) && !last.contains("tool_calls\":["),
            "{last}"
        );
    }
}
