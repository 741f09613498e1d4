//! The rate-limited fake LLM: it enforces its limits per key and model over a sliding
//! window, tells the truth in its headers, and is understood by the real providers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentq_agent::Error;
use agentq_agent::provider::anthropic::{AnthropicConfig, AnthropicProvider};
use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::provider::{HttpTimeouts, LlmEvent, LlmProvider, LlmRequest};
use agentq_agent::schema::Message;
use agentq_testkit::rate_limited::list_dir_turns;
use agentq_testkit::{Limits, RateLimitedConfig, RateLimitedLlm};
use futures::StreamExt;
use serde_json::{Value, json};

/// A window no test outlives: nothing leaves it while a test runs.
const LONG: Duration = Duration::from_secs(600);

async fn post(llm: &RateLimitedLlm, key: &str, model: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", llm.url))
        .bearer_auth(key)
        .json(&json!({"model": model, "stream": true,
            "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn enforces_requests_per_key_and_tells_the_truth() {
    let llm = RateLimitedLlm::start(
        RateLimitedConfig::new(LONG, Limits::requests(3), list_dir_turns(2))
            .model("free", Limits::unlimited()),
    )
    .await
    .unwrap();
    for left in [2, 1, 0] {
        let r = post(&llm, "sk-a", "gpt").await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-ratelimit-limit-requests"), "3");
        assert_eq!(
            header(&r, "x-ratelimit-remaining-requests"),
            left.to_string()
        );
        assert!(header(&r, "x-ratelimit-reset-requests").ends_with('s'));
        r.bytes().await.unwrap();
    }
    let refused = post(&llm, "sk-a", "gpt").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "x-ratelimit-remaining-requests"), "0");
    let secs: u64 = header(&refused, "retry-after").parse().unwrap();
    assert!((590..=600).contains(&secs), "retry-after {secs}");
    let ms: u64 = header(&refused, "retry-after-ms").parse().unwrap();
    assert!(ms <= 600_000 && ms > 590_000, "retry-after-ms {ms}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");

    // Another key, and an unlimited model of the same key, have their own windows.
    assert_eq!(post(&llm, "sk-b", "gpt").await.status(), 200);
    for _ in 0..10 {
        let r = post(&llm, "sk-a", "free").await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-ratelimit-limit-requests").is_none());
    }

    let stats = llm.model_stats("gpt");
    assert_eq!((stats.accepted, stats.refused), (4, 1));
    assert_eq!(stats.max_requests_in_window, 3, "per key: a and b apart");
    assert!((llm.stats().refused_share() - 1.0 / 15.0).abs() < 1e-9);
    assert_eq!(llm.per_window(), vec![(14, 1)]);
}

#[tokio::test]
async fn enforces_tokens_and_a_window_slides() {
    let window = Duration::from_millis(300);
    let llm = RateLimitedLlm::start(RateLimitedConfig::new(
        window,
        Limits::requests(100).with_tokens(40),
        list_dir_turns(2),
    ))
    .await
    .unwrap();
    // Each request costs its body's estimate plus the answer's tokens: about 30.
    let first = post(&llm, "sk", "gpt").await;
    assert_eq!(first.status(), 200);
    let left: u64 = header(&first, "x-ratelimit-remaining-tokens")
        .parse()
        .unwrap();
    assert!(left < 40);
    let second = post(&llm, "sk", "gpt").await;
    assert_eq!(second.status(), 429);
    let body: Value = second.json().await.unwrap();
    assert_eq!(body["error"]["type"], "tokens");
    // Once the first request has left the window, there is room again.
    tokio::time::sleep(window).await;
    assert_eq!(post(&llm, "sk", "gpt").await.status(), 200);
    let stats = llm.stats();
    assert_eq!((stats.accepted, stats.refused), (2, 1));
    assert_eq!(stats.max_requests_in_window, 1);
    assert!(stats.max_tokens_in_window <= 40);
}

#[tokio::test]
async fn a_huge_request_is_told_to_wait_a_window_not_zero() {
    let llm = RateLimitedLlm::start(RateLimitedConfig::new(
        LONG,
        Limits::requests(100).with_tokens(5),
        list_dir_turns(2),
    ))
    .await
    .unwrap();
    let r = post(&llm, "sk", "gpt").await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), "600");
}

#[tokio::test]
async fn garbage_and_unknown_routes_are_refused_without_counting() {
    let llm = RateLimitedLlm::start(RateLimitedConfig::new(
        LONG,
        Limits::requests(1),
        list_dir_turns(2),
    ))
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{}/v1/chat/completions", llm.url))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .post(format!("{}/v1/other", llm.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // A turn the script has no answer for: 400, not counted against the limit.
    let r = c
        .post(format!("{}/v1/chat/completions", llm.url))
        .json(
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(llm.stats().accepted, 0);
    assert_eq!(post(&llm, "k", "m").await.status(), 200);
}

fn request(model: &str) -> LlmRequest<'static> {
    LlmRequest {
        model: model.into(),
        system: None,
        messages: vec![Message::user("go").into()],
        tools: Vec::new().into(),
        temperature: 0.0,
        max_tokens: 100,
        session_id: "s".into(),
        web_search: None,
    }
}

fn timeouts() -> HttpTimeouts {
    HttpTimeouts {
        connect: Duration::from_secs(2),
        idle: Duration::from_secs(5),
    }
}

/// (text, tool names, usage seen) of one streamed answer, or the provider's error.
async fn drain(provider: &dyn LlmProvider, model: &str) -> Result<(String, Vec<String>), Error> {
    let mut stream = provider.stream(&request(model)).await?;
    let (mut text, mut tools, mut usage) = (String::new(), Vec::new(), false);
    while let Some(ev) = stream.next().await {
        match ev? {
            LlmEvent::TextDelta(t) => text.push_str(&t),
            LlmEvent::ToolCallDelta { name: Some(n), .. } => tools.push(n),
            LlmEvent::Usage(u) => usage = u.output_tokens > 0,
            _ => {}
        }
    }
    assert!(usage, "the answer reports its usage");
    Ok((text, tools))
}

#[tokio::test]
async fn the_real_providers_read_answers_and_refusals() {
    let llm = RateLimitedLlm::start(RateLimitedConfig::new(
        LONG,
        Limits::requests(1),
        list_dir_turns(2),
    ))
    .await
    .unwrap();
    let openai = OpenAiProvider::new(OpenAiConfig {
        base_url: format!("{}/v1", llm.url),
        api_key: Some("sk-o".into()),
        timeouts: timeouts(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .unwrap();
    let anthropic = AnthropicProvider::new(AnthropicConfig {
        base_url: llm.url.clone(),
        api_key: Some("sk-ant".into()),
        timeouts: timeouts(),
        ..AnthropicConfig::default()
    })
    .unwrap();
    for p in [&openai as &dyn LlmProvider, &anthropic] {
        let (text, tools) = drain(p, "m").await.unwrap();
        assert!(text.contains("step 1"), "{text}");
        assert_eq!(tools, vec!["list_dir".to_string()]);
        match drain(p, "m").await {
            Err(Error::Http {
                status: 429,
                retry_after,
                ..
            }) => {
                assert!(retry_after.is_some_and(|d| d > Duration::from_secs(500)));
            }
            other => panic!("expected a 429, got {other:?}"),
        }
    }
    llm.overload_next(1);
    match drain(&anthropic, "other").await {
        Err(Error::Http { status: 529, .. }) => {}
        other => panic!("expected a 529, got {other:?}"),
    }
    let stats = llm.stats();
    assert_eq!((stats.accepted, stats.refused, stats.overloaded), (2, 2, 1));
}
