//! Where the host's provider keys may go, tried as a caller who names its own `base_url`:
//! for both HTTP providers built by the factory, a listener the session names never sees
//! the configured key, a redirect from the configured endpoint is not followed (the
//! second listener is never contacted), and malformed base URLs are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentq_agent::Error;
use agentq_agent::provider::LlmProvider;
use agentq_agent::provider::factory::{self, ProviderSettings};
use agentq_testkit::{FakeLlm, FakeResponse, RecordedRequest, fixture};
use futures::StreamExt;

use crate::support::hello_request;

const OPENAI_CANARY: &str = "sk-canary-openai-7f3a";
const ANTHROPIC_CANARY: &str = "sk-ant-canary-91bc";

/// The provider's path under a base URL, and a stream that ends the answer cleanly.
fn answer(provider: &str) -> (&'static str, FakeResponse) {
    match provider {
        "anthropic" => (
            "/v1/messages",
            FakeResponse::sse(fixture("anthropic_stream_text_tool_use.sse"), 64),
        ),
        _ => (
            "/chat/completions",
            FakeResponse::sse(fixture("openai_stream_text_usage.sse"), 64),
        ),
    }
}

/// Settings with canary keys for both providers, configured for `endpoint`.
fn settings(endpoint: &str) -> ProviderSettings {
    ProviderSettings {
        openai_base_url: Some(format!("{endpoint}/v1")),
        openai_api_key: Some(OPENAI_CANARY.into()),
        anthropic_base_url: Some(endpoint.to_string()),
        anthropic_api_key: Some(ANTHROPIC_CANARY.into()),
        script: None,
        transport: Default::default(),
    }
}

/// The base URL of `fake` for `provider` (OpenAI's includes the version segment).
fn base(provider: &str, fake: &FakeLlm) -> String {
    match provider {
        "anthropic" => fake.url.clone(),
        _ => format!("{}/v1", fake.url),
    }
}

/// Send one request and read the answer to its end; the first error, if any.
async fn call(p: &dyn LlmProvider) -> Option<Error> {
    match p.stream(&hello_request()).await {
        Err(e) => Some(e),
        Ok(mut s) => {
            while let Some(item) = s.next().await {
                if let Err(e) = item {
                    return Some(e);
                }
            }
            None
        }
    }
}

fn assert_no_key(req: &RecordedRequest) {
    for (name, value) in &req.headers {
        assert!(
            !value.contains(OPENAI_CANARY) && !value.contains(ANTHROPIC_CANARY),
            "header {name} carries a key: {req:?}"
        );
    }
    assert_eq!(req.header("authorization"), None, "{req:?}");
    assert_eq!(req.header("x-api-key"), None, "{req:?}");
}

/// A session naming a listener of its own as `base_url` gets no key sent there: not the
/// configured one, and not one the provider could find anywhere else.
#[tokio::test]
async fn a_session_base_url_never_receives_the_configured_key() {
    for provider in ["openai", "anthropic"] {
        let configured = FakeLlm::start().await.unwrap();
        let attacker = FakeLlm::start().await.unwrap();
        let (path, ok) = answer(provider);
        attacker.push(ok);
        let p = factory::build(
            provider,
            Some(&base(provider, &attacker)),
            &settings(&configured.url),
        )
        .unwrap();
        assert!(call(p.as_ref()).await.is_none(), "{provider}");
        let seen = attacker.requests();
        assert_eq!(seen.len(), 1, "{provider}");
        assert!(
            seen[0].path.ends_with(path),
            "{provider}: {:?}",
            seen[0].path
        );
        assert_no_key(&seen[0]);
        assert_eq!(configured.request_count(), 0, "{provider}");
    }
}

/// With no endpoint configured the key belongs to the provider's public API; a session
/// naming any other URL still gets none.
#[tokio::test]
async fn a_key_for_the_default_endpoint_stays_there() {
    for provider in ["openai", "anthropic"] {
        let attacker = FakeLlm::start().await.unwrap();
        attacker.push(answer(provider).1);
        let s = ProviderSettings {
            openai_base_url: None,
            anthropic_base_url: None,
            ..settings("http://unused.invalid")
        };
        let p = factory::build(provider, Some(&base(provider, &attacker)), &s).unwrap();
        assert!(call(p.as_ref()).await.is_none(), "{provider}");
        assert_no_key(&attacker.requests()[0]);
    }
}

/// The configured endpoint gets its key, also when a session names it in another spelling
/// (a trailing slash, an explicit default port, upper case): the rule compares where the
/// request lands, not the text.
#[tokio::test]
async fn the_configured_endpoint_gets_its_key() {
    for provider in ["openai", "anthropic"] {
        let configured = FakeLlm::start().await.unwrap();
        configured.push(answer(provider).1);
        configured.push(answer(provider).1);
        let s = settings(&configured.url);
        let spelled = format!("{}/", base(provider, &configured)).replace("http://", "HTTP://");
        for session_url in [None, Some(spelled.as_str())] {
            let p = factory::build(provider, session_url, &s).unwrap();
            assert!(call(p.as_ref()).await.is_none(), "{provider}");
        }
        for req in configured.requests() {
            match provider {
                "anthropic" => assert_eq!(req.header("x-api-key"), Some(ANTHROPIC_CANARY)),
                _ => assert_eq!(
                    req.header("authorization"),
                    Some(format!("Bearer {OPENAI_CANARY}").as_str())
                ),
            }
        }
        assert_eq!(configured.requests().len(), 2, "{provider}");
    }
}

/// The configured endpoint (which legitimately gets the key) answers 307 to a second
/// listener: the provider does not follow it, so the second listener is never contacted,
/// and the session learns why with an error that is not retried.
#[tokio::test]
async fn a_redirect_from_the_configured_endpoint_is_not_followed() {
    for provider in ["openai", "anthropic"] {
        let configured = FakeLlm::start().await.unwrap();
        let elsewhere = FakeLlm::start().await.unwrap();
        let (path, ok) = answer(provider);
        elsewhere.set_handler(move |_| Some(ok.clone()));
        let target = format!("{}{}", base(provider, &elsewhere), path);
        configured.push(FakeResponse::json(307, "").with_header("location", &target));
        let p = factory::build(provider, None, &settings(&configured.url)).unwrap();
        let err = call(p.as_ref()).await.expect("a redirect is an error");
        assert!(
            matches!(&err, Error::Http { status: 307, .. }),
            "{provider}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("redirect") && text.contains(&target),
            "{provider}: {text}"
        );
        assert!(!err.is_retryable(), "{provider}");
        assert_eq!(elsewhere.request_count(), 0, "{provider}");
        assert_eq!(configured.request_count(), 1, "{provider}");
    }
}

/// A base URL with userinfo, a query or a fragment, or another scheme, is refused before
/// anything is sent, whether a session names it or the host is configured with it.
#[tokio::test]
async fn malformed_base_urls_are_refused() {
    let fake = FakeLlm::start().await.unwrap();
    let host = fake.url.trim_start_matches("http://").to_string();
    for provider in ["openai", "anthropic"] {
        for bad in [
            format!("http://user:pw@{host}/v1"),
            format!("http://{host}/v1?x="),
            format!("http://{host}/v1#f"),
            format!("ftp://{host}/v1"),
        ] {
            let e = factory::build(provider, Some(&bad), &settings(&fake.url))
                .err()
                .expect("refused");
            assert!(e.to_string().contains("base_url"), "{provider} {bad}: {e}");
            let mut s = settings(&fake.url);
            s.openai_base_url = Some(bad.clone());
            s.anthropic_base_url = Some(bad.clone());
            let e = factory::build(provider, None, &s).err().expect("refused");
            assert!(e.to_string().contains("base URL"), "{provider} {bad}: {e}");
        }
    }
    assert_eq!(fake.request_count(), 0);
}
