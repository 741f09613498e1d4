//! The assembler on the recorded streams and on made-up event sequences.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentq_testkit::{FakeResponse, fixture};
use serde_json::json;

use super::*;
use crate::provider::anthropic::StreamDecoder;
use crate::provider::openai;
use crate::provider::sse::SseParser;

/// The events an Anthropic body decodes to, up to `message_stop`.
fn anthropic_events(body: &[u8]) -> Vec<LlmEvent> {
    let mut parser = SseParser::new();
    let mut sse = parser.push(body);
    sse.extend(parser.finish());
    let mut decoder = StreamDecoder::new();
    let mut out = Vec::new();
    for ev in &sse {
        out.extend(decoder.handle(ev).unwrap());
        if decoder.is_done() {
            break;
        }
    }
    assert!(decoder.is_done(), "recording ends before message_stop");
    out
}

fn openai_events(body: &[u8]) -> Vec<LlmEvent> {
    openai::decode_body(body)
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

fn jsonl(name: &str) -> String {
    String::from_utf8(fixture(name)).unwrap()
}

/// Assemble `events`, checking that the emitted deltas add up to the message.
fn assemble(events: Vec<LlmEvent>) -> Assembled {
    let mut emitted = Vec::new();
    let mut emit = |e: AgentEvent| emitted.push(e);
    let mut a = StreamAssembler::default();
    for ev in events {
        a.push(ev, &mut emit);
    }
    let out = a.finish("requested-model", &mut emit);
    let (mut text, mut thinking) = (String::new(), String::new());
    for e in emitted {
        match e {
            AgentEvent::TextDelta { text: t } => text.push_str(&t),
            AgentEvent::ThinkingDelta { text: t } => thinking.push_str(&t),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(
        text, out.message.content,
        "text deltas add up to the answer"
    );
    let all_thinking: String = out.message.thinking.iter().map(|t| &*t.text).collect();
    assert_eq!(
        thinking, all_thinking,
        "thinking deltas add up to the blocks"
    );
    out
}

fn calls(a: &Assembled) -> Vec<(&str, &str, serde_json::Value)> {
    a.message
        .tool_calls
        .iter()
        .map(|c| (&*c.id, &*c.name, c.arguments.value()))
        .collect()
}

fn usage(a: &Assembled) -> (u64, u64) {
    let u = a.message.usage.unwrap();
    (u.input_tokens, u.output_tokens)
}

#[test]
fn openai_parallel_tools_join_by_index() {
    let a = assemble(openai_events(&fixture("openai_stream_parallel_tools.sse")));
    assert!(!a.empty_error);
    assert_eq!(a.message.role, crate::schema::Role::Assistant);
    assert_eq!(a.message.content, "");
    assert_eq!(
        calls(&a),
        vec![
            (
                "call_JMW1whyEaYG438VE1OIflxA2",
                "GetWeatherArgs",
                json!({"city": "Edinburgh", "country": "GB", "units": "c"})
            ),
            (
                "call_DNYTawLBoN8fj3KN6qU9N1Ou",
                "get_stock_price",
                json!({"ticker": "AAPL", "exchange": "NASDAQ"})
            ),
        ]
    );
    assert_eq!(usage(&a), (149, 60));
    assert_eq!(a.message.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!(a.message.finish_reason, Some(FinishReason::ToolCalls));
}

#[test]
fn openai_text_with_usage() {
    let a = assemble(openai_events(&fixture("openai_stream_text_usage.sse")));
    assert_eq!(
        a.message.content,
        "I'm unable to provide real-time weather updates. To get the current weather in San \
         Francisco, I recommend checking a reliable weather website or a weather app."
    );
    assert!(a.message.tool_calls.is_empty());
    assert!(a.message.thinking.is_empty());
    assert_eq!(usage(&a), (14, 30));
    assert_eq!(a.message.finish_reason, Some(FinishReason::Stop));
}

#[test]
fn openai_single_tool_and_index_starting_at_1() {
    let a = assemble(openai_events(&fixture("openai_stream_single_tool.sse")));
    assert_eq!(
        calls(&a),
        vec![(
            "call_c91SqDXlYFuETYv8mUHzz6pp",
            "GetWeatherArgs",
            json!({"city": "Edinburgh", "country": "UK", "units": "c"})
        )]
    );
    assert_eq!(usage(&a), (76, 24));

    let a = assemble(openai_events(&fixture(
        "compat_stream_tool_index_starts_at_1.sse",
    )));
    assert_eq!(a.message.content, "Reading it.");
    assert_eq!(
        calls(&a),
        vec![("toolu_sanitized", "read_file", json!({"path": "a.txt"}))]
    );
    // No usage in this recording: the message still carries a (zero) usage.
    assert_eq!(a.message.usage, Some(Usage::default()));
    assert_eq!(
        a.message.model.as_deref(),
        Some("claude-haiku-4-5-20251001")
    );
}

#[test]
fn compat_reasoning_becomes_one_thinking_block() {
    for (name, model, starts) in [
        (
            "compat_deepseek_stream_reasoning_tool.chunks.jsonl",
            "deepseek-reasoner",
            "The user is asking for the weather in San Francisco.",
        ),
        (
            "compat_xai_stream_reasoning_tool.chunks.jsonl",
            "grok-3-mini",
            "First, the user is asking about the weather",
        ),
    ] {
        let body = FakeResponse::openai_jsonl(&jsonl(name));
        let a = assemble(openai_events(body.as_bytes()));
        assert_eq!(a.message.model.as_deref(), Some(model), "{name}");
        assert_eq!(a.message.thinking.len(), 1, "{name}");
        assert!(a.message.thinking[0].text.starts_with(starts), "{name}");
        assert_eq!(a.message.thinking[0].signature, None);
        assert_eq!(a.message.content, "");
        assert_eq!(a.message.tool_calls.len(), 1, "{name}");
        assert_eq!(a.message.tool_calls[0].name, "weather");
        assert_eq!(
            a.message.tool_calls[0].arguments,
            json!({"location": "San Francisco"})
        );
    }
}

#[test]
fn compat_empty_ids_and_whole_arguments() {
    let body = FakeResponse::openai_jsonl(&jsonl("compat_qwen_stream_tool_empty_ids.chunks.jsonl"));
    let a = assemble(openai_events(body.as_bytes()));
    assert_eq!(
        calls(&a),
        vec![(
            "call_eee11723464a4b9eb8cee71d",
            "weather",
            json!({"location": "San Francisco"})
        )]
    );
    let body =
        FakeResponse::openai_jsonl(&jsonl("compat_groq_stream_tool_whole_args.chunks.jsonl"));
    let a = assemble(openai_events(body.as_bytes()));
    assert_eq!(calls(&a), vec![("tk85n1k4m", "weather", json!({}))]);
    assert_eq!(usage(&a), (210, 15));
}

#[test]
fn anthropic_text_then_tool_use() {
    let a = assemble(anthropic_events(&fixture(
        "anthropic_stream_text_tool_use.sse",
    )));
    assert_eq!(
        a.message.content,
        "I'll check the current weather in Paris for you."
    );
    assert_eq!(
        calls(&a),
        vec![(
            "toolu_01NRLabsLyVHZPKxbKvkfSMn",
            "get_weather",
            json!({"location": "Paris"})
        )]
    );
    // Usage is assigned from the running totals, not added up.
    assert_eq!(usage(&a), (377, 65));
    assert_eq!(a.message.model.as_deref(), Some("claude-sonnet-4-20250514"));
    assert_eq!(a.message.finish_reason, Some(FinishReason::ToolCalls));
}

#[test]
fn anthropic_padded_tool_loop() {
    let a = assemble(anthropic_events(&fixture(
        "anthropic_stream_tool_use_padded.sse",
    )));
    assert_eq!(a.message.content, "");
    assert_eq!(
        calls(&a),
        vec![(
            "toolu_018acGYLtfR52q9yDbWaEdQZ",
            "get_weather",
            json!({"location": "San Francisco, CA", "units": "f"})
        )]
    );
    let a = assemble(anthropic_events(&fixture(
        "anthropic_stream_after_tool_result_padded.sse",
    )));
    assert!(a.message.content.contains("68"), "{}", a.message.content);
    assert!(a.message.tool_calls.is_empty());
    assert_eq!(a.message.finish_reason, Some(FinishReason::Stop));
}

#[test]
fn anthropic_thinking_keeps_its_signature() {
    let lines = jsonl("anthropic_stream_thinking_text.chunks.jsonl");
    let a = assemble(anthropic_events(
        FakeResponse::anthropic_jsonl(&lines).as_bytes(),
    ));
    assert_eq!(a.message.thinking.len(), 1);
    let t = &a.message.thinking[0];
    assert_eq!(
        t.text,
        "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185"
    );
    assert!(t.signature.as_deref().is_some_and(|s| !s.is_empty()));
    assert_eq!(a.message.content, "925 ÷ 5 = 185");
    assert_eq!(usage(&a), (69, 53));

    let a = assemble(anthropic_events(&fixture(
        "anthropic_stream_thinking_refusal_padded.sse",
    )));
    assert_eq!(a.message.finish_reason, Some(FinishReason::ContentFilter));
    assert_eq!(a.message.content, "Hi");
    assert_eq!(a.message.thinking.len(), 1);
    assert_eq!(
        a.message.thinking[0].signature.as_deref(),
        Some("c3ludGhldGljLXNpZ25hdHVyZS1maXh0dXJlLWEtbm90LWEtcmVhbC1zaWduYXR1cmU=")
    );
    assert!(a.message.thinking[0].text.starts_with("Simple educ"));
}

fn text(t: &str) -> LlmEvent {
    LlmEvent::TextDelta(t.into())
}

fn call_delta(index: usize, id: Option<&str>, name: Option<&str>, args: &str) -> LlmEvent {
    LlmEvent::ToolCallDelta {
        index,
        id: id.map(str::to_string),
        name: name.map(str::to_string),
        arguments: args.into(),
    }
}

#[test]
fn think_tags_split_across_deltas() {
    let a = assemble(vec![
        text("Hi <thi"),
        text("nk>pon"),
        text("dering</th"),
        text("ink> there<"),
        text("b>"),
        LlmEvent::Done(FinishReason::Stop),
    ]);
    assert_eq!(a.message.content, "Hi  there<b>");
    assert_eq!(a.message.thinking.len(), 1);
    assert_eq!(a.message.thinking[0].text, "pondering");
    // No model reported: the requested one names the message.
    assert_eq!(a.message.model.as_deref(), Some("requested-model"));
}

#[test]
fn thinking_blocks_open_close_and_redact() {
    let a = assemble(vec![
        LlmEvent::ThinkingDelta("one".into()),
        LlmEvent::ThinkingDelta(String::new()),
        LlmEvent::ThinkingSignature("sig1".into()),
        // A signature with no open block gets a block of its own.
        LlmEvent::ThinkingSignature("sig2".into()),
        LlmEvent::RedactedThinking("opaque".into()),
        LlmEvent::ThinkingDelta("two".into()),
    ]);
    let blocks: Vec<(&str, Option<&str>, Option<&str>)> = a
        .message
        .thinking
        .iter()
        .map(|b| (&*b.text, b.signature.as_deref(), b.redacted.as_deref()))
        .collect();
    assert_eq!(
        blocks,
        vec![
            ("one", Some("sig1"), None),
            ("", Some("sig2"), None),
            ("", None, Some("opaque")),
            ("two", None, None),
        ]
    );
}

#[test]
fn tool_fragments_first_id_and_name_win_and_nameless_calls_are_dropped() {
    let a = assemble(vec![
        call_delta(2, Some("b"), Some("second"), "{\"x\":"),
        call_delta(0, Some(""), Some(""), ""),
        call_delta(0, None, Some("first"), "{}"),
        call_delta(2, Some("other"), Some("renamed"), "1}"),
        call_delta(5, Some("c"), None, "{\"lost\":true}"),
        call_delta(7, None, Some("broken"), "{\"a\": 1"),
        LlmEvent::Done(FinishReason::ToolCalls),
    ]);
    let got = calls(&a);
    assert_eq!(got.len(), 3, "{got:?}");
    // Ordered by index; a call that never got an id gets a fresh one.
    assert!(got[0].0.starts_with("call_") && got[0].0.len() > 5);
    assert_eq!((got[0].1, &got[0].2), ("first", &json!({})));
    assert_eq!(got[1], ("b", "second", json!({"x": 1})));
    assert_eq!(got[2].1, "broken");
    assert_eq!(got[2].2, json!({"_raw": "{\"a\": 1"}));
    assert_ne!(got[0].0, got[2].0);
}

/// The message is kept for the session's life by every session in flight: it keeps no
/// room its assembly grew and did not use.
#[test]
fn the_assembled_message_keeps_no_spare_room() {
    let long = "a sentence the model streams in pieces; ".repeat(3);
    let mut events: Vec<LlmEvent> = long
        .as_bytes()
        .chunks(7)
        .map(|c| text(std::str::from_utf8(c).unwrap()))
        .collect();
    events.push(call_delta(
        0,
        Some("a"),
        Some("list_dir"),
        "{\"path\": \".\"}",
    ));
    events.push(LlmEvent::Done(FinishReason::ToolCalls));
    let a = assemble(events);
    assert_eq!(a.message.content, long);
    assert_eq!(a.message.content.capacity(), long.len());
    assert_eq!(a.message.tool_calls.len(), 1);
    assert_eq!(a.message.tool_calls.capacity(), 1);
}

#[test]
fn usage_is_assigned_and_an_empty_error_finish_is_flagged() {
    let u = |i, o| Usage {
        input_tokens: i,
        output_tokens: o,
        ..Default::default()
    };
    let a = assemble(vec![
        LlmEvent::Usage(u(10, 1)),
        LlmEvent::Model("m1".into()),
        text("  "),
        LlmEvent::Usage(u(10, 7)),
        LlmEvent::Done(FinishReason::Error),
    ]);
    assert!(a.empty_error);
    assert_eq!(usage(&a), (10, 7));
    assert_eq!(a.message.model.as_deref(), Some("m1"));

    let a = assemble(vec![text("partial"), LlmEvent::Done(FinishReason::Error)]);
    assert!(!a.empty_error, "an error finish with content is kept");
    let a = assemble(vec![
        call_delta(0, Some("c"), Some("t"), ""),
        LlmEvent::Done(FinishReason::Error),
    ]);
    assert!(!a.empty_error, "an error finish with calls is kept");
}

fn server_delta(index: usize, id: Option<&str>, name: Option<&str>, input: &str) -> LlmEvent {
    LlmEvent::ServerToolDelta {
        index,
        id: id.map(str::to_string),
        name: name.map(str::to_string),
        input: input.into(),
    }
}

fn server_result(id: &str) -> LlmEvent {
    LlmEvent::ServerToolResult {
        tool_use_id: id.into(),
        kind: "web_search_tool_result".into(),
        content: json!([{"url": id}]),
    }
}

#[test]
fn server_content_keeps_the_blocks_in_order_and_only_what_can_go_back() {
    let a = assemble(vec![
        // Text before any block start, and a use whose input comes in fragments.
        text("Let me "),
        text("look."),
        server_delta(0, Some("s1"), Some("web_search"), ""),
        server_delta(0, None, None, "{\"query\":"),
        server_delta(0, Some("other"), Some("renamed"), "\"q\"}"),
        server_result("s1"),
        // A use that never named itself cannot go back, nor its result; a result
        // for no use of this answer neither.
        server_delta(1, Some("s2"), None, "{}"),
        server_result("s2"),
        server_result("nobody"),
        LlmEvent::TextBlock,
        LlmEvent::Citation(json!({"cited_text": "q"})),
        text("Found "),
        text("it"),
        LlmEvent::TextBlock,
        LlmEvent::TextBlock,
        text("."),
        call_delta(0, Some("c1"), Some("read_file"), "{}"),
        LlmEvent::Done(FinishReason::ToolCalls),
    ]);
    assert_eq!(a.message.content, "Let me look.Found it.");
    assert_eq!(calls(&a), vec![("c1", "read_file", json!({}))]);
    let kept: Vec<serde_json::Value> = a
        .message
        .server_content
        .iter()
        .map(|b| serde_json::to_value(b).unwrap())
        .collect();
    assert_eq!(
        kept,
        vec![
            json!({"type": "text", "text": "Let me look."}),
            json!({"type": "tool_use", "id": "s1", "name": "web_search",
                   "input": {"query": "q"}}),
            json!({"type": "tool_result", "tool_use_id": "s1",
                   "kind": "web_search_tool_result", "content": [{"url": "s1"}]}),
            json!({"type": "text", "text": "Found it", "citations": [{"cited_text": "q"}]}),
            json!({"type": "text", "text": "."}),
        ]
    );
}

#[test]
fn without_a_server_tool_there_is_no_server_content() {
    let a = assemble(vec![
        LlmEvent::TextBlock,
        LlmEvent::Citation(json!({"cited_text": "q"})),
        text("plain"),
        server_delta(0, None, Some("web_search"), "{}"),
        LlmEvent::Done(FinishReason::Stop),
    ]);
    assert_eq!(a.message.content, "plain");
    assert!(a.message.server_content.is_empty());
}

#[test]
fn first_token_events() {
    assert!(is_token(&text("")));
    assert!(is_token(&LlmEvent::ThinkingDelta(String::new())));
    assert!(is_token(&call_delta(0, None, None, "")));
    assert!(!is_token(&LlmEvent::Model("m".into())));
    assert!(!is_token(&LlmEvent::Usage(Usage::default())));
    assert!(!is_token(&LlmEvent::ThinkingSignature("s".into())));
    assert!(!is_token(&LlmEvent::Done(FinishReason::Stop)));
}
