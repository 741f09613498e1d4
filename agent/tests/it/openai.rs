//! The OpenAI-compatible provider against the fake LLM server: recorded streams replayed byte
//! for byte in small chunks, error answers, and what the provider sends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use agentq_agent::Error;
use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::provider::{
    HttpTimeouts, LlmEvent, LlmProvider, LlmRequest, RateLimitInfo, ViewMessage,
};
use agentq_agent::schema::{FinishReason, Message, ToolCall, ToolSpec, Usage};
use agentq_testkit::{FakeLlm, FakeResponse, fixture};
use futures::StreamExt;
use serde_json::{Value, json};

/// Small enough that tool-call arguments and JSON keys are split across chunks.
const CHUNK: usize = 7;

#[derive(Debug, Default, Clone, PartialEq)]
struct Call {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

#[derive(Debug, Default)]
struct Collected {
    text: String,
    thinking: String,
    calls: BTreeMap<usize, Call>,
    usage: Option<Usage>,
    model: Option<String>,
    models_seen: usize,
    finish: Option<FinishReason>,
    dones: usize,
    error: Option<Error>,
    events_after_done: usize,
    limits: Option<RateLimitInfo>,
    events_before_limits: usize,
}

async fn collect(provider: &OpenAiProvider, req: &LlmRequest<'_>) -> Collected {
    let mut stream = provider.stream(req).await.expect("request accepted");
    let mut c = Collected::default();
    while let Some(item) = stream.next().await {
        if c.dones > 0 {
            c.events_after_done += 1;
        }
        if c.limits.is_none() && !matches!(item, Ok(LlmEvent::RateLimits(_))) {
            c.events_before_limits += 1;
        }
        match item {
            Ok(LlmEvent::RateLimits(l)) => c.limits = Some(l),
            Ok(LlmEvent::TextDelta(t)) => c.text.push_str(&t),
            Ok(LlmEvent::ThinkingDelta(t)) => c.thinking.push_str(&t),
            Ok(LlmEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            }) => {
                let call = c.calls.entry(index).or_default();
                if let Some(id) = id {
                    assert!(!id.is_empty(), "empty id must be None");
                    call.id.get_or_insert(id);
                }
                if let Some(name) = name {
                    call.name.get_or_insert(name);
                }
                call.arguments.push_str(&arguments);
            }
            Ok(LlmEvent::Usage(u)) => c.usage = Some(u),
            Ok(LlmEvent::Model(m)) => {
                c.models_seen += 1;
                c.model = Some(m);
            }
            Ok(LlmEvent::Done(r)) => {
                c.dones += 1;
                c.finish = Some(r);
            }
            Ok(other) => panic!("unexpected event {other:?}"),
            Err(e) => {
                c.error = Some(e);
                break;
            }
        }
    }
    c
}

fn call(id: &str, name: &str, arguments: &str) -> Call {
    Call {
        id: Some(id.into()),
        name: Some(name.into()),
        arguments: arguments.into(),
    }
}

fn provider(fake: &FakeLlm) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: fake.url.clone(),
        api_key: Some("sk-test".into()),
        timeouts: HttpTimeouts {
            connect: Duration::from_secs(2),
            idle: Duration::from_secs(5),
        },
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .expect("provider")
}

fn request() -> LlmRequest<'static> {
    LlmRequest {
        model: "gpt-4o".into(),
        system: Some("You are terse.".into()),
        messages: vec![Message::user("What's the weather like in SF?").into()],
        tools: vec![ToolSpec {
            name: "weather".into(),
            description: "Current weather".into(),
            parameters: json!({"type":"object","properties":{"location":{"type":"string"}}}),
        }]
        .into(),
        temperature: 0.1,
        max_tokens: 8192,
        session_id: "s1".into(),
        web_search: None,
    }
}

async fn replay(body: impl AsRef<[u8]>) -> Collected {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(body, CHUNK));
    collect(&provider(&fake), &request()).await
}

async fn replay_jsonl(name: &str) -> Collected {
    let lines = String::from_utf8(fixture(name)).unwrap();
    replay(FakeResponse::openai_jsonl(&lines)).await
}

/// The concatenated `reasoning_content` of a JSON-lines recording, computed independently of
/// the provider.
fn reasoning_of(name: &str) -> String {
    let lines = String::from_utf8(fixture(name)).unwrap();
    lines
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["choices"][0]["delta"]["reasoning_content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

fn assert_clean(c: &Collected) {
    assert!(c.error.is_none(), "unexpected error {:?}", c.error);
    assert_eq!(c.dones, 1, "exactly one Done");
    assert_eq!(c.events_after_done, 0, "Done is the last event");
    assert!(c.models_seen <= 1, "Model is sent once");
}

// ---- recorded streams ----

#[tokio::test]
async fn parallel_tool_calls_are_assembled_by_index() {
    let c = replay(fixture("openai_stream_parallel_tools.sse")).await;
    assert_clean(&c);
    assert_eq!(c.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!(c.text, "");
    assert_eq!(c.calls.len(), 2);
    assert_eq!(
        c.calls[&0],
        call(
            "call_JMW1whyEaYG438VE1OIflxA2",
            "GetWeatherArgs",
            r#"{"city": "Edinburgh", "country": "GB", "units": "c"}"#
        )
    );
    assert_eq!(
        c.calls[&1],
        call(
            "call_DNYTawLBoN8fj3KN6qU9N1Ou",
            "get_stock_price",
            r#"{"ticker": "AAPL", "exchange": "NASDAQ"}"#
        )
    );
    for call in c.calls.values() {
        assert!(
            ToolCall::parse_arguments(&call.arguments)
                .value()
                .get("_raw")
                .is_none()
        );
    }
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (149, 60));
    assert_eq!(u.reasoning_tokens, 0);
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn single_tool_call() {
    let c = replay(fixture("openai_stream_single_tool.sse")).await;
    assert_clean(&c);
    assert_eq!(c.calls.len(), 1);
    assert_eq!(
        c.calls[&0],
        call(
            "call_c91SqDXlYFuETYv8mUHzz6pp",
            "GetWeatherArgs",
            r#"{"city":"Edinburgh","country":"UK","units":"c"}"#
        )
    );
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (76, 24));
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn text_and_usage() {
    let c = replay(fixture("openai_stream_text_usage.sse")).await;
    assert_clean(&c);
    assert_eq!(
        c.text,
        "I'm unable to provide real-time weather updates. To get the current weather in San \
         Francisco, I recommend checking a reliable weather website or a weather app."
    );
    assert!(c.calls.is_empty());
    assert!(c.thinking.is_empty());
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (14, 30));
    assert_eq!(c.finish, Some(FinishReason::Stop));
}

#[tokio::test]
async fn deepseek_reasoning_then_tool_with_usage_in_finish_chunk() {
    let name = "compat_deepseek_stream_reasoning_tool.chunks.jsonl";
    let c = replay_jsonl(name).await;
    assert_clean(&c);
    assert_eq!(c.model.as_deref(), Some("deepseek-reasoner"));
    let expected = reasoning_of(name);
    assert!(expected.starts_with("The user is asking for the weather in San Francisco."));
    assert_eq!(c.thinking, expected);
    assert_eq!(c.text, "");
    assert_eq!(
        c.calls[&0],
        call(
            "call_00_ioIn7yN9p1ZOMNpDLwd4MgAF",
            "weather",
            r#"{"location": "San Francisco"}"#
        )
    );
    assert_eq!(
        c.usage,
        Some(Usage {
            input_tokens: 339,
            output_tokens: 83,
            cache_read_tokens: 320,
            cache_write_tokens: 0,
            reasoning_tokens: 39,
            web_search_requests: 0,
        })
    );
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn groq_whole_arguments_in_one_chunk() {
    let c = replay_jsonl("compat_groq_stream_tool_whole_args.chunks.jsonl").await;
    assert_clean(&c);
    assert_eq!(c.calls.len(), 1);
    assert_eq!(c.calls[&0], call("tk85n1k4m", "weather", "{}"));
    let u = c.usage.unwrap();
    assert_eq!((u.input_tokens, u.output_tokens), (210, 15));
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn qwen_empty_ids_on_later_fragments() {
    let c = replay_jsonl("compat_qwen_stream_tool_empty_ids.chunks.jsonl").await;
    assert_clean(&c);
    assert_eq!(c.calls.len(), 1);
    assert_eq!(
        c.calls[&0],
        call(
            "call_eee11723464a4b9eb8cee71d",
            "weather",
            r#"{"location": "San Francisco"}"#
        )
    );
    let u = c.usage.unwrap();
    assert_eq!(
        (u.input_tokens, u.output_tokens, u.cache_read_tokens),
        (295, 22, 0)
    );
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn xai_reasoning_and_whole_tool_call() {
    let name = "compat_xai_stream_reasoning_tool.chunks.jsonl";
    let c = replay_jsonl(name).await;
    assert_clean(&c);
    assert_eq!(c.model.as_deref(), Some("grok-3-mini"));
    assert_eq!(c.thinking, reasoning_of(name));
    assert!(
        c.thinking
            .starts_with("First, the user is asking about the weather")
    );
    assert_eq!(
        c.calls[&0],
        call(
            "call_79382389",
            "weather",
            r#"{"location":"San Francisco"}"#
        )
    );
    assert_eq!(
        c.usage,
        Some(Usage {
            input_tokens: 307,
            output_tokens: 26,
            cache_read_tokens: 306,
            cache_write_tokens: 0,
            reasoning_tokens: 227,
            web_search_requests: 0,
        })
    );
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn tool_index_starting_at_1() {
    let c = replay(fixture("compat_stream_tool_index_starts_at_1.sse")).await;
    assert_clean(&c);
    assert_eq!(c.text, "Reading it.");
    assert_eq!(c.calls.len(), 1);
    assert_eq!(
        c.calls[&1],
        call("toolu_sanitized", "read_file", r#"{"path": "a.txt"}"#)
    );
    // No usage chunk in this recording.
    assert_eq!(c.usage, None);
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn byte_at_a_time_matches_chunked() {
    let body = fixture("openai_stream_parallel_tools.sse");
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(&body, 1));
    let one = collect(&provider(&fake), &request()).await;
    let seven = replay(&body).await;
    assert_clean(&one);
    assert_eq!(one.calls, seven.calls);
    assert_eq!(one.usage, seven.usage);
}

// ---- stream endings and in-stream errors ----

#[tokio::test]
async fn done_without_finish_reason_infers_it() {
    let text = "data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"\"}]}\n\n\
                data: {\"choices\":null,\"usage\":{}}\n\n\
                data: [DONE]\n\n";
    let c = replay(text).await;
    assert_clean(&c);
    assert_eq!(c.text, "hi");
    assert_eq!(c.usage, None, "an empty usage object is not a usage report");
    assert_eq!(c.finish, Some(FinishReason::Stop));

    let tools = "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n\
                 data: [DONE]\n\n";
    let c = replay(tools).await;
    assert_clean(&c);
    assert_eq!(c.finish, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn finish_reasons_map() {
    for (wire, expected) in [
        ("length", FinishReason::Length),
        ("content_filter", FinishReason::ContentFilter),
        ("stop", FinishReason::Stop),
    ] {
        let body = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"x\"}},\"finish_reason\":\"{wire}\"}}]}}\n\ndata: [DONE]\n\n"
        );
        let c = replay(body).await;
        assert_clean(&c);
        assert_eq!(c.finish, Some(expected));
    }
}

#[tokio::test]
async fn mid_stream_error_event() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n\
                data: {\"error\":{\"message\":\"The server is overloaded\",\"type\":\"server_error\",\"code\":null}}\n\n";
    let c = replay(body).await;
    assert_eq!(c.text, "Hel");
    assert_eq!(c.dones, 0);
    match c.error {
        Some(
            ref e @ Error::Stream {
                ref message,
                ref code,
                retryable,
            },
        ) => {
            assert_eq!(message, "The server is overloaded");
            assert_eq!(code.as_deref(), Some("server_error"));
            assert!(retryable);
            assert!(e.is_retryable());
        }
        other => panic!("expected a stream error, got {other:?}"),
    }

    let body = "data: {\"error\":{\"message\":\"Invalid schema for function 'f'\",\"type\":\"invalid_request_error\",\"code\":\"invalid_function_parameters\"}}\n\n";
    let c = replay(body).await;
    match c.error {
        Some(ref e @ Error::Stream { ref code, .. }) => {
            assert_eq!(code.as_deref(), Some("invalid_function_parameters"));
            assert!(!e.is_retryable());
        }
        other => panic!("expected a stream error, got {other:?}"),
    }
}

#[tokio::test]
async fn stream_cut_midway_is_retryable_transport_error() {
    let body = fixture("openai_stream_parallel_tools.sse");
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(&body, CHUNK).cut_after(200));
    let c = collect(&provider(&fake), &request()).await;
    assert_eq!(c.dones, 0);
    let e = c.error.expect("an error");
    assert!(matches!(e, Error::Transport(_)), "{e:?}");
    assert!(e.is_retryable());
}

#[tokio::test]
async fn eof_without_done_or_finish_is_transport_error() {
    let body = fixture("openai_stream_parallel_tools.sse");
    // Ends cleanly, but long before the finish chunk.
    let c = replay(&body[..body.len() / 2]).await;
    assert_eq!(c.dones, 0);
    match c.error {
        Some(Error::Transport(ref m)) => assert!(m.contains("stream ended before completion")),
        ref other => panic!("expected transport error, got {other:?}"),
    }
    // Ends cleanly on an event boundary, still before the finish chunk.
    let text = String::from_utf8(body).unwrap();
    let cut = text[..text.len() / 2].rfind("\n\n").unwrap() + 2;
    let c = replay(&text[..cut]).await;
    assert_eq!(c.dones, 0);
    assert!(c.calls.contains_key(&0));
    match c.error {
        Some(Error::Transport(ref m)) => assert_eq!(m, "stream ended before completion"),
        ref other => panic!("expected transport error, got {other:?}"),
    }
}

#[tokio::test]
async fn idle_timeout_between_chunks() {
    let body = fixture("openai_stream_text_usage.sse");
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(&body, 4096).with_delay(Duration::from_millis(800)));
    let p = OpenAiProvider::new(OpenAiConfig {
        base_url: fake.url.clone(),
        api_key: None,
        timeouts: HttpTimeouts {
            connect: Duration::from_secs(2),
            idle: Duration::from_millis(200),
        },
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .unwrap();
    let c = collect(&p, &request()).await;
    match c.error {
        Some(ref e @ Error::Transport(ref m)) => {
            assert!(m.contains("no data for"), "{m}");
            assert!(e.is_retryable());
        }
        ref other => panic!("expected idle timeout, got {other:?}"),
    }
}

// ---- HTTP errors ----

async fn http_error(resp: FakeResponse) -> Error {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(resp);
    match provider(&fake).stream(&request()).await {
        Ok(_) => panic!("expected an HTTP error"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn http_429_with_retry_after() {
    let body = String::from_utf8(fixture("openai_error_429_rate_limit.body.json")).unwrap();
    let e = http_error(FakeResponse::json(429, body).with_header("retry-after", "2")).await;
    match &e {
        Error::Http {
            status,
            message,
            code,
            retry_after,
            ..
        } => {
            assert_eq!(*status, 429);
            assert!(message.starts_with("Rate limit reached for gpt-4o-mini"));
            assert_eq!(code.as_deref(), Some("rate_limit_exceeded"));
            assert_eq!(*retry_after, Some(Duration::from_secs(2)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        e.class(),
        agentq_agent::ErrorClass::Retryable {
            after: Some(Duration::from_secs(2))
        }
    );
}

#[tokio::test]
async fn http_429_retry_after_ms_wins() {
    let e = http_error(
        FakeResponse::json(
            429,
            r#"{"error":{"message":"slow down","type":"requests"}}"#,
        )
        .with_header("retry-after-ms", "1500")
        .with_header("retry-after", "9"),
    )
    .await;
    match e {
        Error::Http { retry_after, .. } => {
            assert_eq!(retry_after, Some(Duration::from_millis(1500)))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn http_500_is_retryable_with_provider_message() {
    let body = String::from_utf8(fixture("openai_error_500_server_error.body.json")).unwrap();
    let e = http_error(FakeResponse::json(500, body)).await;
    assert!(e.is_retryable());
    match &e {
        Error::Http {
            status,
            message,
            code,
            retry_after,
            ..
        } => {
            assert_eq!(*status, 500);
            assert!(message.starts_with("The server had an error processing your request."));
            assert!(message.contains("e5c949c8ec2c86be225544e5eefcbe4d"));
            assert_eq!(code.as_deref(), Some("server_error"));
            assert_eq!(*retry_after, None);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn http_400_context_length_is_fatal() {
    let body = String::from_utf8(fixture("openai_error_400_context_length.body.json")).unwrap();
    let e = http_error(FakeResponse::json(400, body)).await;
    match &e {
        Error::ContextLength(m) => assert!(m.contains("maximum context length is 4097 tokens")),
        other => panic!("{other:?}"),
    }
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn http_400_unsupported_parameter_is_fatal() {
    let body =
        String::from_utf8(fixture("openai_error_400_unsupported_parameter.body.json")).unwrap();
    let e = http_error(FakeResponse::json(400, body)).await;
    assert!(!e.is_retryable());
    match &e {
        Error::Http {
            status,
            message,
            code,
            ..
        } => {
            assert_eq!(*status, 400);
            assert!(message.contains("Use 'max_completion_tokens' instead"));
            assert_eq!(code.as_deref(), Some("unsupported_parameter"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn http_error_with_non_json_body() {
    let e = http_error(FakeResponse::json(502, "<html>Bad gateway</html>")).await;
    assert!(e.is_retryable());
    match e {
        Error::Http {
            status, message, ..
        } => {
            assert_eq!(status, 502);
            assert_eq!(message, "<html>Bad gateway</html>");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn connect_error_names_the_url() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let p = OpenAiProvider::new(OpenAiConfig {
        base_url: format!("http://{addr}/v1/"),
        api_key: None,
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .unwrap();
    match p.stream(&request()).await {
        Err(e @ Error::Transport(_)) => {
            assert!(
                e.to_string()
                    .contains(&format!("{addr}/v1/chat/completions"))
            );
            assert!(e.is_retryable());
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("expected a connect error"),
    }
}

#[test]
fn bad_config_is_a_config_error() {
    let bad = OpenAiProvider::new(OpenAiConfig {
        base_url: "not a url".into(),
        api_key: None,
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    });
    assert!(matches!(bad, Err(Error::Config(_))));
}

// ---- what is sent ----

#[tokio::test]
async fn request_shape() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("openai_stream_text_usage.sse"),
        64,
    ));
    let p = OpenAiProvider::new(OpenAiConfig {
        base_url: format!("{}/v1/", fake.url),
        api_key: Some("sk-test".into()),
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: vec![("X-Title".into(), "agentq".into())],
    })
    .unwrap();
    assert_eq!(p.name(), "openai");

    let mut req = request();
    let mut assistant = Message::assistant("");
    assistant.thinking = vec![agentq_agent::schema::ThinkingBlock {
        text: "secret reasoning".into(),
        ..Default::default()
    }];
    assistant.tool_calls = vec![
        ToolCall {
            id: "call_1".into(),
            name: "weather".into(),
            arguments: json!({"location": "SF"}).into(),
        },
        ToolCall {
            id: "call_2".into(),
            name: "weather".into(),
            arguments: json!({"_raw": "{\"location\": \"LA"}).into(),
        },
    ];
    req.messages.push(ViewMessage::from(assistant));
    req.messages.push(ViewMessage::from(Message::tool_result(
        "call_1", "weather", "sunny", false,
    )));
    req.messages.push(ViewMessage::from(Message::tool_result(
        "call_2",
        "weather",
        "invalid JSON",
        true,
    )));
    req.messages
        .push(ViewMessage::from(Message::assistant("It is sunny in SF.")));
    req.messages
        .push(ViewMessage::from(Message::user("Thanks")));

    let c = collect(&p, &req).await;
    assert_clean(&c);

    let sent = fake.requests();
    assert_eq!(sent.len(), 1);
    let r = &sent[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert_eq!(r.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(r.header("x-title"), Some("agentq"));
    let b = &r.body;
    assert_eq!(b["model"], "gpt-4o");
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["temperature"].as_f64(), Some(0.1));
    assert_eq!(b["max_tokens"], 8192);
    assert_eq!(
        b["tools"],
        json!([{
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather",
                "parameters": {"type":"object","properties":{"location":{"type":"string"}}},
            }
        }])
    );
    assert_eq!(
        b["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What's the weather like in SF?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"location\":\"SF\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"location\": \"LA"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "invalid JSON"},
            {"role": "assistant", "content": "It is sunny in SF."},
            {"role": "user", "content": "Thanks"},
        ])
    );
    // Arguments go out as JSON strings that parse back to what was stored.
    let args = b["messages"][2]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(args).unwrap(),
        json!({"location": "SF"})
    );
}

#[tokio::test]
async fn no_tools_key_and_no_auth_without_key() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("openai_stream_text_usage.sse"),
        64,
    ));
    let p = OpenAiProvider::new(OpenAiConfig {
        base_url: fake.url.clone(),
        api_key: None,
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .unwrap();
    let mut req = request();
    req.tools = Cow::Borrowed(&[]);
    req.system = None;
    let c = collect(&p, &req).await;
    assert_clean(&c);
    let r = &fake.requests()[0];
    assert_eq!(r.path, "/chat/completions");
    assert_eq!(r.header("authorization"), None);
    assert!(r.body.get("tools").is_none());
    assert_eq!(r.body["messages"][0]["role"], "user");
}

#[tokio::test]
async fn reasoning_replay_hook() {
    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("openai_stream_text_usage.sse"),
        64,
    ));
    let p = provider(&fake).with_reasoning_replay("reasoning_content");
    let mut req = request();
    let mut a = Message::assistant("Hi");
    a.thinking = vec![agentq_agent::schema::ThinkingBlock {
        text: "think".into(),
        ..Default::default()
    }];
    req.messages.push(ViewMessage::from(a));
    req.messages.push(ViewMessage::from(Message::user("again")));
    collect(&p, &req).await;
    let body = &fake.requests()[0].body;
    assert_eq!(body["messages"][2]["reasoning_content"], "think");
}

/// The temperature goes out as the decimal the session asked for (an `f32` widened to f64
/// would read `0.10000000149011612`), in the bytes POSTed and as the server parses them.
#[tokio::test]
async fn temperature_is_sent_as_the_decimal_asked_for() {
    for (asked, sent) in [
        (0.1f32, r#""temperature":0.1,"#),
        (0.7, r#""temperature":0.7,"#),
        (0.3, r#""temperature":0.3,"#),
        (1.5, r#""temperature":1.5,"#),
    ] {
        let p = OpenAiProvider::new(OpenAiConfig {
            base_url: "http://127.0.0.1:9/v1".into(),
            api_key: None,
            timeouts: HttpTimeouts::default(),
            transport: Default::default(),
            extra_headers: Vec::new(),
        })
        .unwrap();
        let mut req = request();
        req.temperature = asked;
        let bytes = String::from_utf8(p.request_bytes(&req).unwrap()).unwrap();
        assert!(bytes.contains(sent), "{asked}: {bytes}");
        let body = serde_json::to_string(&p.request_body(&req)).unwrap();
        assert!(body.contains(sent), "{asked}: {body}");
    }

    let fake = FakeLlm::start().await.unwrap();
    fake.push(FakeResponse::sse(
        fixture("openai_stream_text_usage.sse"),
        CHUNK,
    ));
    let c = collect(&provider(&fake), &request()).await;
    assert_clean(&c);
    let received = serde_json::to_string(&fake.requests()[0].body).unwrap();
    assert!(received.contains(r#""temperature":0.1,"#), "{received}");
}

/// An error answer's body is read only up to a bound: a huge one (a broken or hostile
/// endpoint) becomes a short message, not a session error of its size in memory and in
/// the store.
#[tokio::test]
async fn a_huge_error_body_is_read_within_a_bound() {
    let body = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(40 << 20));
    let e = http_error(FakeResponse::json(500, body)).await;
    match e {
        Error::Http {
            status, message, ..
        } => {
            assert_eq!(status, 500);
            assert!(message.len() <= 64 * 1024, "{} bytes", message.len());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn rate_limit_headers_lead_a_2xx_stream() {
    let fake = FakeLlm::start().await.unwrap();
    let mut r = FakeResponse::sse(fixture("openai_stream_text_usage.sse"), CHUNK);
    for (k, v) in [
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-limit-tokens", "150000"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ] {
        r = r.with_header(k, v);
    }
    fake.push(r);
    let c = collect(&provider(&fake), &request()).await;
    assert!(c.error.is_none(), "{:?}", c.error);
    assert_eq!(c.events_before_limits, 0, "the limits come first");
    assert_eq!(
        c.limits,
        Some(RateLimitInfo {
            limit_requests: Some(60),
            remaining_requests: Some(59),
            reset_requests: Some(Duration::from_secs(1)),
            limit_tokens: Some(150_000),
            remaining_tokens: Some(149_984),
            reset_tokens: Some(Duration::from_secs(360)),
        })
    );
    assert_eq!(c.dones, 1);
}

#[tokio::test]
async fn a_429_carries_its_rate_limits_and_a_quota_error_is_no_rate_limit() {
    let body = String::from_utf8(fixture("openai_error_429_rate_limit.body.json")).unwrap();
    let e = http_error(
        FakeResponse::json(429, body)
            .with_header("x-ratelimit-limit-tokens", "30000")
            .with_header("x-ratelimit-remaining-tokens", "0")
            .with_header("x-ratelimit-reset-tokens", "59.89s"),
    )
    .await;
    assert_eq!(e.rate_limited(), Some(None));
    let l = e.rate_limits().expect("limits on the error");
    assert_eq!(l.remaining_tokens, Some(0));
    assert_eq!(l.exhausted_for(), Some(Duration::from_millis(59_890)));
    // The recorded 429 without any of these headers: a rate limit with nothing known.
    let e = http_error(FakeResponse::json(429, r#"{"error":{"message":"slow"}}"#)).await;
    assert_eq!(e.rate_limited(), Some(None));
    assert!(e.rate_limits().is_none());
    let e = http_error(FakeResponse::json(
        429,
        r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
    ))
    .await;
    assert_eq!(e.rate_limited(), None, "waiting does not fix a quota");
}

#[test]
fn limit_keys_share_an_endpoint_and_key_and_never_hold_the_key() {
    let key = |url: &str, k: Option<&str>| {
        OpenAiProvider::new(OpenAiConfig {
            base_url: url.into(),
            api_key: k.map(str::to_string),
            timeouts: HttpTimeouts::default(),
            transport: Default::default(),
            extra_headers: Vec::new(),
        })
        .unwrap()
        .limit_key()
    };
    let a = key("https://api.openai.com/v1", Some("sk-secret-1"));
    assert_eq!(a, key("HTTPS://API.OPENAI.COM/v1/", Some("sk-secret-1")));
    assert_ne!(a, key("https://api.openai.com/v1", Some("sk-secret-2")));
    assert_ne!(a, key("http://localhost:8000/v1", Some("sk-secret-1")));
    assert!(!a.contains("secret"), "{a}");
    assert!(a.starts_with("openai|https://api.openai.com/v1|"), "{a}");
}
