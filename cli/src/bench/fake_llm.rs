//! A local OpenAI-compatible endpoint for the capacity part: `POST /v1/chat/completions`
//! waits a fixed latency, then streams (SSE) either a call to `list_dir` or, once the
//! history holds `iterations - 1` assistant turns, a final answer. Stateless: the turn is
//! read from the request, like the scripted provider, so any worker can continue a
//! session.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::Response;
use tokio_util::sync::CancellationToken;

/// What a turn says (a realistic, constant size).
pub const TURN_TEXT: &str = "I will look at the workspace to see which files are there before answering; \
     listing the directory is cheap and tells me where the relevant code lives.";
pub const FINAL_TEXT: &str = "The workspace is empty: there are no files to summarise, so there is nothing \
     further to do. Done.";

struct Fake {
    latency: Duration,
    iterations: u32,
    requests: AtomicU64,
}

pub struct FakeLlm {
    pub base_url: String,
    state: Arc<Fake>,
    stop: CancellationToken,
}

impl FakeLlm {
    pub async fn start(latency: Duration, iterations: u32) -> anyhow::Result<FakeLlm> {
        let state = Arc::new(Fake {
            latency,
            iterations,
            requests: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", axum::routing::post(complete))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { s.cancelled().await })
                .await;
        });
        Ok(FakeLlm {
            base_url: format!("http://{addr}/v1"),
            state,
            stop,
        })
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Assistant turns in a request body, counted on the raw bytes: parsing a long history
/// as JSON thousands of times a second would make the fake, not the worker, the limit.
fn assistant_turns(body: &[u8]) -> usize {
    let needle = b"\"role\":\"assistant\"";
    body.windows(needle.len()).filter(|w| *w == needle).count()
}

async fn complete(State(fake): State<Arc<Fake>>, body: Bytes) -> Response {
    fake.requests.fetch_add(1, Ordering::Relaxed);
    let turn = assistant_turns(&body);
    tokio::time::sleep(fake.latency).await;
    let last = turn + 1 >= fake.iterations as usize;
    let mut out = String::with_capacity(1024);
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        let v = serde_json::json!({
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {v}\n\n")
    };
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
        out.push_str(&chunk(
            serde_json::json!({"tool_calls": [{
                "index": 0,
                "id": format!("call_{turn}"),
                "type": "function",
                "function": {"name": "list_dir", "arguments": "{\"path\":\".\"}"},
            }]}),
            None,
        ));
        out.push_str(&chunk(serde_json::json!({}), Some("tool_calls")));
    }
    out.push_str(
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":200,\"completion_tokens\":40,\"total_tokens\":240}}\n\n",
    );
    out.push_str("data: [DONE]\n\n");
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(out))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
