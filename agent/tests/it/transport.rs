//! How the providers' calls travel, against the fake LLM server: the HTTP version each
//! setting speaks, and calls in flight past one HTTP/2 connection's stream limit carried
//! on another connection instead of waiting.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use agentq_agent::provider::anthropic::{AnthropicConfig, AnthropicProvider};
use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::provider::transport::{HttpVersion, Transport};
use agentq_agent::provider::{HttpTimeouts, LlmEvent, LlmProvider, LlmStream};
use agentq_testkit::{FakeLlm, FakeResponse, fixture};
use futures::StreamExt;

use crate::support::hello_request;

const ANSWER: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\
                      \"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

const IDLE: Duration = Duration::from_secs(30);

fn timeouts(idle: Duration) -> HttpTimeouts {
    HttpTimeouts {
        connect: Duration::from_secs(5),
        idle,
    }
}

fn openai(fake: &FakeLlm, http: HttpVersion, streams: u32) -> OpenAiProvider {
    openai_at(&fake.url, http, streams, IDLE)
}

fn openai_at(url: &str, http: HttpVersion, streams: u32, idle: Duration) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: url.to_string(),
        api_key: Some("sk-test".into()),
        timeouts: timeouts(idle),
        transport: Transport {
            http,
            streams_per_connection: streams,
        },
        extra_headers: Vec::new(),
    })
    .unwrap()
}

async fn answering(body: &'static str) -> FakeLlm {
    let fake = FakeLlm::start().await.unwrap();
    fake.set_handler(move |_| Some(FakeResponse::sse(body, 64)));
    fake
}

/// `n` calls all in flight at once (each holds its place until its answer is read, and
/// every answer's head has come before any is read), then each read to its end.
async fn calls_at_once(p: &dyn LlmProvider, n: usize) -> Vec<String> {
    let req = hello_request();
    let streams: Vec<LlmStream> = futures::future::join_all((0..n).map(|_| p.stream(&req)))
        .await
        .into_iter()
        .map(|s| s.expect("call accepted"))
        .collect();
    let mut texts = Vec::new();
    for mut s in streams {
        let mut text = String::new();
        while let Some(ev) = s.next().await {
            match ev.expect("event") {
                LlmEvent::TextDelta(t) => text.push_str(&t),
                LlmEvent::Done(_) => break,
                _ => {}
            }
        }
        texts.push(text);
    }
    texts
}

/// How many requests came on each connection the fake saw, largest first, and the HTTP
/// versions they came in.
fn connections(fake: &FakeLlm) -> (Vec<usize>, Vec<String>) {
    let mut per_peer: BTreeMap<_, usize> = BTreeMap::new();
    let mut versions: Vec<String> = Vec::new();
    for r in fake.requests() {
        *per_peer.entry(r.peer).or_default() += 1;
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    let mut counts: Vec<usize> = per_peer.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    (counts, versions)
}

#[tokio::test]
async fn calls_past_a_connections_stream_limit_go_on_another_http2_connection() {
    let fake = answering(ANSWER).await;
    let p = openai(&fake, HttpVersion::Http2, 2);
    let texts = calls_at_once(&p, 5).await;
    assert_eq!(texts, vec!["hi"; 5]);
    let (counts, versions) = connections(&fake);
    assert_eq!(versions, ["HTTP/2.0"]);
    // Two streams on each of two connections, the fifth call on a third: none waited for
    // another's stream to end.
    assert_eq!(counts, [2, 2, 1]);

    // Calls that come after those ended take the first connection again.
    let texts = calls_at_once(&p, 2).await;
    assert_eq!(texts, vec!["hi"; 2]);
    let (counts, _) = connections(&fake);
    assert_eq!(counts, [4, 2, 1]);
}

#[tokio::test]
async fn every_call_shares_one_http2_connection_within_the_limit() {
    let fake = answering(ANSWER).await;
    let p = openai(&fake, HttpVersion::Http2, 100);
    calls_at_once(&p, 20).await;
    assert_eq!(connections(&fake), (vec![20], vec!["HTTP/2.0".to_string()]));
}

#[tokio::test]
async fn a_plain_http_endpoint_gets_http1_unless_told_otherwise() {
    for http in [HttpVersion::Auto, HttpVersion::Http1] {
        let fake = answering(ANSWER).await;
        let p = openai(&fake, http, 2);
        assert_eq!(calls_at_once(&p, 3).await, vec!["hi"; 3]);
        let (counts, versions) = connections(&fake);
        assert_eq!(versions, ["HTTP/1.1"], "{http:?}");
        // HTTP/1.1 carries one call at a time per connection.
        assert_eq!(counts, [1, 1, 1], "{http:?}");
    }
}

#[tokio::test]
async fn the_anthropic_provider_travels_the_same_way() {
    let body = String::from_utf8(fixture("anthropic_stream_text_tool_use.sse")).unwrap();
    let body: &'static str = Box::leak(body.into_boxed_str());
    let fake = answering(body).await;
    let p = AnthropicProvider::new(AnthropicConfig {
        base_url: fake.url.clone(),
        api_key: Some("sk-ant-test".into()),
        timeouts: timeouts(IDLE),
        transport: Transport {
            http: HttpVersion::Http2,
            streams_per_connection: 2,
        },
        ..AnthropicConfig::default()
    })
    .unwrap();
    calls_at_once(&p, 3).await;
    assert_eq!(
        connections(&fake),
        (vec![2, 1], vec!["HTTP/2.0".to_string()])
    );
}

#[tokio::test]
async fn an_endpoint_that_does_not_speak_http2_fails_the_call_clearly() {
    // An HTTP/1.1-only server: it answers the HTTP/2 preface with an HTTP/1.1 error.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let p = openai_at(&url, HttpVersion::Http2, 100, IDLE);
    let err = match p.stream(&hello_request()).await {
        Ok(_) => panic!("an HTTP/1.1 answer to HTTP/2 is no stream"),
        Err(e) => e,
    };
    assert!(matches!(err, agentq_agent::Error::Transport(_)), "{err:?}");
    assert!(err.to_string().contains("POST"), "{err}");
}

#[tokio::test]
async fn an_endpoint_that_never_answers_fails_the_call_after_the_idle_timeout() {
    // It takes the request and says nothing: the wait for the answer's head is silence
    // before the first chunk, bounded as every later silence is.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    for http in [HttpVersion::Http1, HttpVersion::Http2] {
        let p = openai_at(&url, http, 100, Duration::from_millis(200));
        let err = match p.stream(&hello_request()).await {
            Ok(_) => panic!("no answer is no stream"),
            Err(e) => e,
        };
        assert!(
            matches!(err, agentq_agent::Error::Transport(ref m) if m.contains("no response within")),
            "{http:?}: {err:?}"
        );
        assert!(err.is_retryable(), "{err:?}");
    }
}

#[tokio::test]
async fn a_hostile_endpoints_huge_head_fails_the_call_on_either_version() {
    // A megabyte of header: neither version's client reads a head that large into memory
    // and hands it on; the call fails as a transport error.
    let fake = FakeLlm::start().await.unwrap();
    let huge = "x".repeat(1 << 20);
    fake.set_handler(move |_| Some(FakeResponse::sse(ANSWER, 64).with_header("x-junk", &huge)));
    for http in [HttpVersion::Http1, HttpVersion::Http2] {
        let p = openai(&fake, http, 100);
        let err = match p.stream(&hello_request()).await {
            Ok(_) => panic!("{http:?}: a megabyte of header was taken"),
            Err(e) => e,
        };
        assert!(
            matches!(err, agentq_agent::Error::Transport(_)),
            "{http:?}: {err:?}"
        );
    }
}
