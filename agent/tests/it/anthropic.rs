//! The Anthropic provider through its real HTTP code, against the fake LLM server replaying
//! recorded streams (and a few written from the documented wire format) in small chunks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use agentq_agent::error::{Error, ErrorClass};
use agentq_agent::provider::anthropic::{AnthropicConfig, AnthropicProvider};
use agentq_agent::provider::{
    HttpTimeouts, LlmEvent, LlmProvider, LlmRequest, LlmStream, RateLimitInfo, ViewMessage,
};
use agentq_agent::schema::{FinishReason, Message, ThinkingBlock, ToolCall, ToolSpec, Usage};
use agentq_testkit::{FakeLlm, FakeResponse, fixture};
use futures::StreamExt;
use serde_json::{Value, json};

const CHUNK: usize = 5;

fn provider(url: &str, thinking_budget: Option<u32>) -> AnthropicProvider {
    AnthropicProvider::new(AnthropicConfig {
        base_url: url.to_string(),
        api_key: Some("sk-ant-test".into()),
        version: "2023-06-01".into(),
        timeouts: HttpTimeouts {
            connect: Duration::from_secs(2),
            idle: Duration::from_secs(5),
        },
        transport: Default::default(),
        thinking_budget,
    })
    .unwrap()
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Lookup the weather for a given city".into(),
        parameters: json!({
            "type": "object",
            "properties": {"location": {"type": "string"}, "units": {"type": "string", "enum": ["c", "f"]}},
            "required": ["location"]
        }),
    }
}

fn request(messages: Vec<Message>) -> LlmRequest<'static> {
    LlmRequest {
        model: "claude-sonnet-4-20250514".into(),
        system: Some("You are a weather bot.".into()),
        messages: messages.into_iter().map(ViewMessage::from).collect(),
        tools: vec![weather_tool()].into(),
        temperature: 0.1,
        max_tokens: 1024,
        session_id: "s-1".into(),
        web_search: None,
    }
}

fn fixture_str(name: &str) -> String {
    String::from_utf8(fixture(name)).unwrap()
}

/// What one response assembles into.
#[derive(Debug, Default)]
struct Collected {
    text: String,
    thinking: Vec<ThinkingBlock>,
    thinking_open: bool,
    /// By index: (id, name, argument text).
    tools: BTreeMap<usize, (String, String, String)>,
    usage: Option<Usage>,
    model: Option<String>,
    finish: Option<FinishReason>,
    events_after_done: usize,
    limits: Option<RateLimitInfo>,
    /// Events seen before the rate limits (they must come first).
    events_before_limits: usize,
}

impl Collected {
    fn apply(&mut self, ev: LlmEvent) {
        if self.finish.is_some() {
            self.events_after_done += 1;
        }
        if self.limits.is_none() && !matches!(ev, LlmEvent::RateLimits(_)) {
            self.events_before_limits += 1;
        }
        match ev {
            LlmEvent::RateLimits(l) => self.limits = Some(l),
            LlmEvent::TextDelta(t) => self.text.push_str(&t),
            LlmEvent::ThinkingDelta(t) => {
                if !self.thinking_open {
                    self.thinking.push(ThinkingBlock::default());
                    self.thinking_open = true;
                }
                self.thinking.last_mut().unwrap().text.push_str(&t);
            }
            LlmEvent::ThinkingSignature(s) => {
                if !self.thinking_open {
                    self.thinking.push(ThinkingBlock::default());
                }
                self.thinking.last_mut().unwrap().signature = Some(s);
                self.thinking_open = false;
            }
            LlmEvent::RedactedThinking(d) => {
                self.thinking.push(ThinkingBlock {
                    redacted: Some(d),
                    ..Default::default()
                });
                self.thinking_open = false;
            }
            LlmEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                let e = self.tools.entry(index).or_default();
                if let Some(id) = id.filter(|s| !s.is_empty()) {
                    e.0 = id;
                }
                if let Some(n) = name.filter(|s| !s.is_empty()) {
                    e.1 = n;
                }
                e.2.push_str(&arguments);
            }
            LlmEvent::Usage(u) => self.usage = Some(u),
            LlmEvent::Model(m) => self.model = Some(m),
            LlmEvent::Done(f) => self.finish = Some(f),
            // Block boundaries and the server tools' blocks: `web_search.rs` holds them.
            LlmEvent::TextBlock
            | LlmEvent::Citation(_)
            | LlmEvent::ServerToolDelta { .. }
            | LlmEvent::ServerToolResult { .. } => {}
        }
    }

    fn args(&self, index: usize) -> Value {
        ToolCall::parse_arguments(&self.tools[&index].2).value()
    }

    fn into_message(self) -> Message {
        let mut m = Message::assistant(self.text.clone());
        m.thinking = self.thinking.clone();
        m.tool_calls = self
            .tools
            .values()
            .map(|(id, name, args)| ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: ToolCall::parse_arguments(args),
            })
            .collect();
        m.usage = self.usage;
        m.finish_reason = self.finish;
        m
    }
}

async fn collect(mut s: LlmStream) -> (Collected, Option<Error>) {
    let mut c = Collected::default();
    while let Some(ev) = s.next().await {
        match ev {
            Ok(ev) => c.apply(ev),
            Err(e) => {
                assert!(
                    s.next().await.is_none(),
                    "the stream must end after an error"
                );
                return (c, Some(e));
            }
        }
    }
    (c, None)
}

async fn run_ok(fake: &FakeLlm, p: &AnthropicProvider, req: &LlmRequest<'_>) -> Collected {
    let (c, err) = collect(p.stream(req).await.unwrap()).await;
    assert!(err.is_none(), "unexpected error: {err:?}");
    assert!(c.finish.is_some(), "no Done event");
    assert_eq!(c.events_after_done, 0, "events after Done");
    assert!(fake.request_count() > 0);
    c
}

/// Both Anthropic rules the history conversion must keep.
fn assert_alternates(messages: &Value) {
    let msgs = messages.as_array().unwrap();
    assert_eq!(msgs[0]["role"], "user");
    for w in msgs.windows(2) {
        assert_ne!(
            w[0]["role"], w[1]["role"],
            "roles must alternate: {messages:#}"
        );
    }
    for m in msgs {
        if let Some(blocks) = m["content"].as_array() {
            let first_other = blocks
                .iter()
                .position(|b| b["type"] != "tool_result")
                .unwrap_or(blocks.len());
            assert!(
                blocks[first_other..]
                    .iter()
                    .all(|b| b["type"] != "tool_result"),
                "tool_result blocks must come first: {m:#}"
            );
        }
    }
}

#[tokio::test]
async fn text_and_tool_use_stream() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_text_tool_use.sse"),
        CHUNK,
    ));
    let p = provider(&fake.url, None);
    assert_eq!(p.name(), "anthropic");
    let c = run_ok(
        &fake,
        &p,
        &request(vec![Message::user("What's the weather in Paris?")]),
    )
    .await;

    assert_eq!(c.text, "I'll check the current weather in Paris for you.");
    assert_eq!(c.tools.len(), 1);
    // The tool is content block 1 but the first tool: index 0.
    let (id, name, _) = &c.tools[&0];
    assert_eq!(id, "toolu_01NRLabsLyVHZPKxbKvkfSMn");
    assert_eq!(name, "get_weather");
    assert_eq!(c.args(0), json!({"location": "Paris"}));
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
    assert_eq!(c.model.as_deref(), Some("claude-sonnet-4-20250514"));
    // message_start says output 1, message_delta 65: assigned, not 66.
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (377, 65));
    assert_eq!((u.cache_read_tokens, u.cache_write_tokens), (0, 0));

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.path, "/v1/messages");
    assert_eq!(r.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    let b = &r.body;
    assert_eq!(b["model"], "claude-sonnet-4-20250514");
    assert_eq!(b["system"], "You are a weather bot.");
    assert_eq!(b["max_tokens"], 1024);
    assert!((b["temperature"].as_f64().unwrap() - 0.1).abs() < 1e-6);
    assert_eq!(b["stream"], true);
    assert!(b.get("thinking").is_none());
    assert_eq!(b["tools"][0]["name"], "get_weather");
    assert_eq!(b["tools"][0]["input_schema"], weather_tool().parameters);
    assert!(b["tools"][0].get("parameters").is_none());
    assert_eq!(
        b["messages"],
        json!([{"role": "user", "content": "What's the weather in Paris?"}])
    );
}

#[tokio::test]
async fn padded_live_tool_loop_streams() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_tool_use_padded.sse"),
        CHUNK,
    ));
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_after_tool_result_padded.sse"),
        CHUNK,
    ));
    let p = provider(&fake.url, None);

    let mut history = vec![Message::user("What is the weather in SF?")];
    let c = run_ok(&fake, &p, &request(history.clone())).await;
    assert_eq!(c.text, "");
    assert_eq!(c.tools[&0].0, "toolu_018acGYLtfR52q9yDbWaEdQZ");
    assert_eq!(
        c.args(0),
        json!({"location": "San Francisco, CA", "units": "f"})
    );
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
    assert_eq!(c.model.as_deref(), Some("claude-haiku-4-5-20251001"));
    assert_eq!(c.usage.unwrap().input_tokens, 656);

    history.push(c.into_message());
    history.push(Message::tool_result(
        "toolu_018acGYLtfR52q9yDbWaEdQZ",
        "get_weather",
        r#"{"location": "San Francisco, CA", "temperature": "68°F", "condition": "Sunny"}"#,
        false,
    ));
    let c2 = run_ok(&fake, &p, &request(history)).await;
    assert!(c2.text.contains("68"), "{}", c2.text);
    assert!(c2.tools.is_empty());
    assert_eq!(c2.finish, Some(FinishReason::Stop));

    // The second request sends the tool loop back the way the SDK's recording does.
    let recorded: Value =
        serde_json::from_slice(&fixture("anthropic_toolloop_stream.cassette.json")).unwrap();
    let sdk_msgs = &recorded[1]["request"]["body"]["messages"];
    let ours = &fake.requests()[1].body["messages"];
    assert_alternates(ours);
    assert_eq!(ours.as_array().unwrap().len(), 3);
    let sdk_use = &sdk_msgs[1]["content"][0];
    let our_use = &ours[1]["content"][0];
    for k in ["type", "id", "name", "input"] {
        assert_eq!(our_use[k], sdk_use[k], "tool_use.{k}");
    }
    let sdk_res = &sdk_msgs[2]["content"][0];
    let our_res = &ours[2]["content"][0];
    for k in ["type", "tool_use_id"] {
        assert_eq!(our_res[k], sdk_res[k], "tool_result.{k}");
    }
}

#[tokio::test]
async fn thinking_and_signature_kept_verbatim() {
    let lines = fixture_str("anthropic_stream_thinking_text.chunks.jsonl");
    let signature = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v["delta"]["signature"].as_str().map(str::to_string))
        .unwrap();
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        FakeResponse::anthropic_jsonl(&lines),
        CHUNK,
    ));
    let p = provider(&fake.url, Some(2048));
    let c = run_ok(&fake, &p, &request(vec![Message::user("925 / 5?")])).await;

    assert_eq!(c.thinking.len(), 1);
    let t = &c.thinking[0];
    assert_eq!(
        t.text,
        "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185"
    );
    assert_eq!(t.signature.as_deref(), Some(signature.as_str()));
    assert_eq!(c.text, "925 ÷ 5 = 185");
    assert_eq!(c.finish, Some(FinishReason::Stop));
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (69, 53));

    let b = &fake.requests()[0].body;
    assert!(
        b.get("temperature").is_none(),
        "temperature with thinking: {b}"
    );
    assert_eq!(
        b["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert!(b["max_tokens"].as_u64().unwrap() > 2048);
}

#[tokio::test]
async fn refusal_with_unknown_fields() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_thinking_refusal_padded.sse"),
        CHUNK,
    ));
    let p = provider(&fake.url, None);
    let c = run_ok(&fake, &p, &request(vec![Message::user("hi claudius")])).await;
    assert_eq!(c.finish, Some(FinishReason::ContentFilter));
    assert_eq!(c.text, "Hi");
    assert_eq!(c.thinking.len(), 1);
    assert_eq!(
        c.thinking[0].signature.as_deref(),
        Some("c3ludGhldGljLXNpZ25hdHVyZS1maXh0dXJlLWEtbm90LWEtcmVhbC1zaWduYXR1cmU=")
    );
    assert!(c.thinking[0].text.starts_with("Simple educ"));
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (28, 106));
    assert_eq!(c.model.as_deref(), Some("claude-fable-5"));
}

/// Frame `(type, json)` pairs the way the API does.
fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|v| format!("event: {}\ndata: {}\n\n", v["type"].as_str().unwrap(), v))
        .collect()
}

fn delta(index: u64, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn parallel_tools_stream() -> String {
    sse(&[
        json!({"type": "message_start", "message": {"id": "msg_par", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5-20250929", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 500, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 300, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "ping"}),
        delta(
            0,
            json!({"type": "thinking_delta", "thinking": "Two cities, "}),
        ),
        delta(
            0,
            json!({"type": "thinking_delta", "thinking": "two calls."}),
        ),
        delta(
            0,
            json!({"type": "signature_delta", "signature": "EqQBCgIYAhIM+sig/with==padding"}),
        ),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        delta(1, json!({"type": "text_delta", "text": "Checking both."})),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_A", "name": "get_weather", "input": {}, "caller": {"type": "direct"}}}),
        delta(2, json!({"type": "input_json_delta", "partial_json": ""})),
        delta(
            2,
            json!({"type": "input_json_delta", "partial_json": "{\"locat"}),
        ),
        delta(
            2,
            json!({"type": "input_json_delta", "partial_json": "ion\": \"Paris, Fr"}),
        ),
        delta(
            2,
            json!({"type": "input_json_delta", "partial_json": "ance\"}"}),
        ),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_B", "name": "get_weather", "input": {}, "caller": {"type": "direct"}}}),
        delta(
            3,
            json!({"type": "input_json_delta", "partial_json": "{\"location\": \"Tok"}),
        ),
        delta(
            3,
            json!({"type": "input_json_delta", "partial_json": "yo\", \"units\": \"c\"}"}),
        ),
        json!({"type": "content_block_stop", "index": 3}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 88}}),
        json!({"type": "message_stop"}),
    ])
}

#[tokio::test]
async fn parallel_tool_calls_round_trip() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(parallel_tools_stream(), CHUNK));
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_after_tool_result_padded.sse"),
        CHUNK,
    ));
    let p = provider(&fake.url, Some(1024));

    let mut history = vec![Message::user("Weather in Paris and Tokyo?")];
    let c = run_ok(&fake, &p, &request(history.clone())).await;
    assert_eq!(c.tools.len(), 2);
    assert_eq!(c.tools[&0].0, "toolu_A");
    assert_eq!(c.tools[&1].0, "toolu_B");
    assert_eq!(c.args(0), json!({"location": "Paris, France"}));
    assert_eq!(c.args(1), json!({"location": "Tokyo", "units": "c"}));
    assert_eq!(c.text, "Checking both.");
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
    let u = c.usage.unwrap();
    assert_eq!(
        (
            u.input_tokens,
            u.output_tokens,
            u.cache_read_tokens,
            u.cache_write_tokens
        ),
        (500, 88, 300, 20)
    );

    history.push(c.into_message());
    history.push(Message::tool_result(
        "toolu_A",
        "get_weather",
        "18°C, cloudy",
        false,
    ));
    history.push(Message::tool_result(
        "toolu_B",
        "get_weather",
        "city not found",
        true,
    ));
    run_ok(&fake, &p, &request(history)).await;

    let msgs = fake.requests()[1].body["messages"].clone();
    assert_alternates(&msgs);
    assert_eq!(
        msgs,
        json!([
            {"role": "user", "content": "Weather in Paris and Tokyo?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Two cities, two calls.", "signature": "EqQBCgIYAhIM+sig/with==padding"},
                {"type": "text", "text": "Checking both."},
                {"type": "tool_use", "id": "toolu_A", "name": "get_weather", "input": {"location": "Paris, France"}},
                {"type": "tool_use", "id": "toolu_B", "name": "get_weather", "input": {"location": "Tokyo", "units": "c"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_A", "content": "18°C, cloudy"},
                {"type": "tool_result", "tool_use_id": "toolu_B", "content": "city not found", "is_error": true},
            ]},
        ])
    );
}

#[test]
fn history_conversion_merges_turns() {
    let p = provider("http://127.0.0.1:9", None);
    let mut a1 = Message::assistant("");
    a1.thinking = vec![
        // Reasoning another model produced as <think> text: no signature, not replayable.
        ThinkingBlock {
            text: "let me think".into(),
            ..Default::default()
        },
        ThinkingBlock {
            redacted: Some("EmwKAhgBEgy3va3pzix/LafPsn4a".into()),
            ..Default::default()
        },
    ];
    a1.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: json!({"_raw": "{\"location\": \"Par"}).into(),
    }];
    let history = vec![
        Message::user("first"),
        Message::user("second"),
        a1,
        Message::tool_result("call_1", "get_weather", "bad arguments", true),
        Message::user("try again"),
        Message::assistant("Sorry."),
        Message::assistant("Here it is."),
    ];
    let body = p.request_body(&request(history));
    let msgs = &body["messages"];
    assert_alternates(msgs);
    assert_eq!(
        *msgs,
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "first"},
                {"type": "text", "text": "second"},
            ]},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"_raw": "{\"location\": \"Par"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "bad arguments", "is_error": true},
                {"type": "text", "text": "try again"},
            ]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Sorry."},
                {"type": "text", "text": "Here it is."},
            ]},
        ])
    );

    let mut no_tools = request(vec![Message::user("hi")]);
    no_tools.tools = Cow::Borrowed(&[]);
    no_tools.system = None;
    let body = p.request_body(&no_tools);
    assert!(body.get("tools").is_none());
    assert!(body.get("system").is_none());
}

#[tokio::test]
async fn error_event_after_200_is_retryable_stream_error() {
    let body = sse(&[
        json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        delta(0, json!({"type": "text_delta", "text": "Hel"})),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(body, CHUNK));
    let p = provider(&fake.url, None);
    let (c, err) = collect(p.stream(&request(vec![Message::user("hi")])).await.unwrap()).await;
    assert_eq!(c.text, "Hel");
    match err.unwrap() {
        e @ Error::Stream { .. } => {
            assert!(e.is_retryable());
            let Error::Stream { message, code, .. } = e else {
                unreachable!()
            };
            assert_eq!(message, "Overloaded");
            assert_eq!(code.as_deref(), Some("overloaded_error"));
        }
        other => panic!("expected a stream error, got {other:?}"),
    }

    // An invalid_request_error in the stream is not worth retrying.
    let body = sse(&[
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
    ]);
    fake.push(FakeResponse::sse(body, CHUNK));
    let (_, err) = collect(p.stream(&request(vec![Message::user("hi")])).await.unwrap()).await;
    assert_eq!(err.unwrap().class(), ErrorClass::Fatal);
}

#[tokio::test]
async fn stream_cut_midway_is_retryable_transport() {
    let fake = FakeLlm::start().await.unwrap();
    let bytes = fixture("anthropic_stream_text_tool_use.sse");
    let n = bytes.len() / CHUNK / 2;
    fake.push(FakeResponse::sse(&bytes, CHUNK).cut_after(n));
    // A clean EOF before message_stop: the answer is just as incomplete.
    let mut clean = FakeResponse::sse(&bytes, CHUNK);
    clean.chunks.truncate(n);
    fake.push(clean);
    let p = provider(&fake.url, None);
    for _ in 0..2 {
        let (c, err) = collect(p.stream(&request(vec![Message::user("hi")])).await.unwrap()).await;
        assert!(c.finish.is_none());
        let err = err.expect("an error");
        assert!(matches!(err, Error::Transport(_)), "{err:?}");
        assert!(err.is_retryable());
    }
}

async fn http_error(status: u16, body: &str, headers: &[(&str, &str)]) -> Error {
    let fake = FakeLlm::start().await.unwrap();
    let mut r = FakeResponse::json(status, body);
    for (k, v) in headers {
        r = r.with_header(k, v);
    }
    fake.push(r);
    let p = provider(&fake.url, None);
    match p.stream(&request(vec![Message::user("hi")])).await {
        Ok(_) => panic!("expected HTTP {status} to fail"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn rate_limit_429_honours_retry_after() {
    let recorded: Value =
        serde_json::from_slice(&fixture("anthropic_error_429_rate_limit.response.json")).unwrap();
    let body = recorded["body"].to_string();
    let e = http_error(
        429,
        &body,
        &[("retry-after", "3"), ("x-should-retry", "true")],
    )
    .await;
    assert_eq!(
        e.class(),
        ErrorClass::Retryable {
            after: Some(Duration::from_secs(3))
        }
    );
    let Error::Http {
        status,
        message,
        code,
        retry_after,
        ..
    } = e
    else {
        panic!("{e:?}")
    };
    assert_eq!(status, 429);
    assert_eq!(code.as_deref(), Some("rate_limit_error"));
    assert!(message.starts_with("This request would exceed"));
    assert_eq!(retry_after, Some(Duration::from_secs(3)));
}

#[tokio::test]
async fn overloaded_529_and_500_are_retryable() {
    let e = http_error(
        529,
        &fixture_str("anthropic_error_529_overloaded.body.json"),
        &[],
    )
    .await;
    assert_eq!(e.class(), ErrorClass::Retryable { after: None });
    assert!(
        matches!(&e, Error::Http { status: 529, code: Some(c), message, .. } if c == "overloaded_error" && message == "Overloaded"),
        "{e:?}"
    );

    let e = http_error(
        500,
        &fixture_str("anthropic_error_500_api_error.body.json"),
        &[],
    )
    .await;
    assert!(e.is_retryable());
    assert!(
        matches!(&e, Error::Http { status: 500, code: Some(c), message, .. } if c == "api_error" && message == "Internal server error"),
        "{e:?}"
    );
    assert!(e.to_string().contains("Internal server error"));
}

#[tokio::test]
async fn prompt_too_long_is_context_length() {
    let e = http_error(
        400,
        &fixture_str("anthropic_error_400_prompt_too_long.body.json"),
        &[],
    )
    .await;
    match &e {
        Error::ContextLength(m) => assert!(m.contains("200251 tokens > 200000 maximum")),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.class(), ErrorClass::Fatal);
}

#[tokio::test]
async fn auth_401_and_other_400_are_fatal() {
    let e = http_error(
        401,
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
        &[],
    )
    .await;
    assert_eq!(e.class(), ErrorClass::Fatal);
    assert!(
        matches!(&e, Error::Http { status: 401, code: Some(c), .. } if c == "authentication_error")
    );

    let recorded: Value = serde_json::from_slice(&fixture(
        "anthropic_error_400_tool_result_pairing.cassette.json",
    ))
    .unwrap();
    let body = recorded[1]["response"]["body"].to_string();
    let e = http_error(400, &body, &[("x-should-retry", "false")]).await;
    assert_eq!(e.class(), ErrorClass::Fatal);
    assert!(e.to_string().contains("tool_use_id"), "{e}");

    // A body that is not the documented JSON still gives a useful message.
    let e = http_error(502, "<html>Bad Gateway</html>", &[]).await;
    assert!(e.is_retryable());
    assert!(e.to_string().contains("Bad Gateway"), "{e}");
}

#[tokio::test]
async fn connect_error_names_the_url() {
    // Reserve a port, then free it so nothing listens there.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    let p = provider(&url, None);
    let e = match p.stream(&request(vec![Message::user("hi")])).await {
        Ok(_) => panic!("nothing listens there"),
        Err(e) => e,
    };
    assert!(matches!(e, Error::Transport(_)), "{e:?}");
    assert!(e.is_retryable());
    assert!(e.to_string().contains(&url), "{e}");
}

#[test]
fn bad_config_is_rejected() {
    let cfg = AnthropicConfig {
        base_url: "not a url".into(),
        ..AnthropicConfig::default()
    };
    assert!(matches!(AnthropicProvider::new(cfg), Err(Error::Config(_))));
    assert_eq!(AnthropicConfig::default().version, "2023-06-01");
}

/// The temperature goes out as the decimal the session asked for (an `f32` widened to f64
/// would read `0.10000000149011612`), in the bytes POSTed and as the server parses them.
#[tokio::test]
async fn temperature_is_sent_as_the_decimal_asked_for() {
    for (asked, sent) in [
        (0.1f32, r#""temperature":0.1,"#),
        (0.7, r#""temperature":0.7,"#),
        (0.3, r#""temperature":0.3,"#),
        // Clamped to the API's 0..=1.
        (1.7, r#""temperature":1.0,"#),
    ] {
        let p = provider("http://127.0.0.1:9", None);
        let mut req = request(vec![Message::user("hi")]);
        req.temperature = asked;
        let bytes = String::from_utf8(p.request_bytes(&req).unwrap()).unwrap();
        assert!(bytes.contains(sent), "{asked}: {bytes}");
        let body = serde_json::to_string(&p.request_body(&req)).unwrap();
        assert!(body.contains(sent), "{asked}: {body}");
    }

    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_text_tool_use.sse"),
        CHUNK,
    ));
    let p = provider(&fake.url, None);
    run_ok(&fake, &p, &request(vec![Message::user("hi")])).await;
    let received = serde_json::to_string(&fake.requests()[0].body).unwrap();
    assert!(received.contains(r#""temperature":0.1,"#), "{received}");
}

#[tokio::test]
async fn rate_limit_headers_lead_a_2xx_stream() {
    let fake = FakeLlm::start().await.unwrap();
    let reset = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc3339();
    let mut r = FakeResponse::sse(fixture("anthropic_stream_text_tool_use.sse"), CHUNK);
    for (k, v) in [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("anthropic-ratelimit-requests-reset", reset.as_str()),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        ("anthropic-ratelimit-input-tokens-reset", reset.as_str()),
    ] {
        r = r.with_header(k, v);
    }
    fake.push(r);
    let p = provider(&fake.url, None);
    let c = run_ok(&fake, &p, &request(vec![Message::user("hi")])).await;
    let l = c.limits.expect("the headers' limits");
    assert_eq!(c.events_before_limits, 0, "the limits come first");
    assert_eq!(l.limit_requests, Some(50));
    assert_eq!(l.remaining_requests, Some(49));
    assert_eq!(l.limit_tokens, Some(40_000));
    assert_eq!(l.remaining_tokens, Some(39_000));
    let left = l.reset_requests.unwrap();
    assert!(left <= Duration::from_secs(30) && left >= Duration::from_secs(20));
    // An answer without the headers has no such event.
    fake.push(FakeResponse::sse(
        fixture("anthropic_stream_text_tool_use.sse"),
        CHUNK,
    ));
    let c = run_ok(&fake, &p, &request(vec![Message::user("hi")])).await;
    assert!(c.limits.is_none());
}

#[tokio::test]
async fn a_429_carries_the_recorded_rate_limit_headers() {
    // The header values of a recorded 2024 Anthropic 429 (no retry-after), with the
    // body of another recording.
    let recorded: Value =
        serde_json::from_slice(&fixture("anthropic_error_429_rate_limit.response.json")).unwrap();
    let e = http_error(
        429,
        &recorded["body"].to_string(),
        &[
            ("anthropic-ratelimit-requests-limit", "5"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2024-03-26T20:00:00Z"),
            ("anthropic-ratelimit-tokens-limit", "25000"),
            ("anthropic-ratelimit-tokens-remaining", "16000"),
            ("anthropic-ratelimit-tokens-reset", "2024-03-26T20:00:00Z"),
            ("x-should-retry", "true"),
            ("retry-after-ms", "1200"),
        ],
    )
    .await;
    assert_eq!(e.rate_limited(), Some(Some(Duration::from_millis(1200))));
    let l = e.rate_limits().expect("limits on the error");
    assert_eq!(l.limit_requests, Some(5));
    assert_eq!(l.remaining_requests, Some(0));
    // The recorded reset is long past: nothing left to wait for.
    assert_eq!(l.reset_requests, Some(Duration::ZERO));
    assert_eq!(l.remaining_tokens, Some(16_000));
    // A 529 is a refusal for capacity too; a 500 is a real failure.
    let e = http_error(
        529,
        &fixture_str("anthropic_error_529_overloaded.body.json"),
        &[],
    )
    .await;
    assert_eq!(e.rate_limited(), Some(None));
    let e = http_error(
        500,
        &fixture_str("anthropic_error_500_api_error.body.json"),
        &[],
    )
    .await;
    assert_eq!(e.rate_limited(), None);
}

#[test]
fn limit_keys_share_an_endpoint_and_key_and_never_hold_the_key() {
    let key = |url: &str, k: Option<&str>| {
        AnthropicProvider::new(AnthropicConfig {
            base_url: url.into(),
            api_key: k.map(str::to_string),
            ..AnthropicConfig::default()
        })
        .unwrap()
        .limit_key()
    };
    let a = key("https://API.anthropic.com/", Some("sk-ant-secret-1"));
    assert_eq!(a, key("https://api.anthropic.com", Some("sk-ant-secret-1")));
    assert_ne!(a, key("https://api.anthropic.com", Some("sk-ant-secret-2")));
    assert_ne!(a, key("https://gateway.example", Some("sk-ant-secret-1")));
    assert!(!a.contains("secret"), "{a}");
    assert!(a.starts_with("anthropic|https://api.anthropic.com|"), "{a}");
    assert!(key("https://api.anthropic.com", None).ends_with("|-"));
}
