//! A local HTTP server that speaks like an LLM endpoint: it records every request and
//! answers each with a scripted response — a JSON body, or an SSE stream sent chunk by
//! chunk with delays, optionally cut off mid-way. Providers are tested against it through
//! their real HTTP code.
//!
//! [`FakeLlm::start_stateless`] is the same server for load (`agentq bench`'s capacity
//! part): it answers every request from its raw body with a function, after a fixed
//! latency, and only counts requests, so that it can serve thousands a second.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;

/// One request as the fake server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct FakeResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Body chunks, each sent after its delay.
    pub chunks: Vec<(Duration, Bytes)>,
    /// Abort the connection after the last chunk instead of ending the body cleanly.
    pub cut: bool,
}

impl FakeResponse {
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        FakeResponse {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![(Duration::ZERO, Bytes::from(body.into()))],
            cut: false,
        }
    }

    /// An SSE response whose body is `body` split into the given chunks (no delays).
    pub fn sse_chunks(chunks: Vec<Bytes>) -> Self {
        FakeResponse {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: chunks.into_iter().map(|c| (Duration::ZERO, c)).collect(),
            cut: false,
        }
    }

    /// An SSE response sending `body` in chunks of `size` bytes.
    pub fn sse(body: impl AsRef<[u8]>, size: usize) -> Self {
        let size = size.max(1);
        Self::sse_chunks(
            body.as_ref()
                .chunks(size)
                .map(Bytes::copy_from_slice)
                .collect(),
        )
    }

    /// Frame JSON lines (a `.chunks.jsonl` recording) as OpenAI SSE ending in `[DONE]`.
    pub fn openai_jsonl(lines: &str) -> String {
        let mut out = String::new();
        for l in lines.lines().filter(|l| !l.trim().is_empty()) {
            out.push_str("data: ");
            out.push_str(l);
            out.push_str("\n\n");
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    /// Frame JSON lines as Anthropic SSE (`event: <type>` before each `data:`).
    pub fn anthropic_jsonl(lines: &str) -> String {
        let mut out = String::new();
        for l in lines.lines().filter(|l| !l.trim().is_empty()) {
            let ty = serde_json::from_str::<Value>(l)
                .ok()
                .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_string))
                .unwrap_or_default();
            out.push_str(&format!("event: {ty}\ndata: {l}\n\n"));
        }
        out
    }

    pub fn with_header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }

    pub fn with_delay(mut self, d: Duration) -> Self {
        for c in &mut self.chunks {
            c.0 = d;
        }
        self
    }

    pub fn cut_after(mut self, n_chunks: usize) -> Self {
        self.chunks.truncate(n_chunks);
        self.cut = true;
        self
    }
}

type Handler = dyn Fn(&RecordedRequest) -> Option<FakeResponse> + Send + Sync;
type Answer = dyn Fn(&[u8]) -> FakeResponse + Send + Sync;

struct Inner {
    queue: Mutex<VecDeque<FakeResponse>>,
    requests: Mutex<Vec<RecordedRequest>>,
    handler: Mutex<Option<Arc<Handler>>>,
    /// Requests received, in either mode.
    served: AtomicU64,
}

/// The state of a [`FakeLlm::start_stateless`] server.
struct Stateless {
    inner: Arc<Inner>,
    latency: Duration,
    answer: Box<Answer>,
}

/// The running fake. Dropping it does not stop the server task; it dies with the runtime.
#[derive(Clone)]
pub struct FakeLlm {
    pub url: String,
    inner: Arc<Inner>,
}

impl FakeLlm {
    /// Bind 127.0.0.1 on a free port and serve.
    pub async fn start() -> anyhow::Result<FakeLlm> {
        let inner = new_inner();
        let app = Router::new().fallback(serve).with_state(inner.clone());
        Self::listen(app, inner).await
    }

    /// A fake for load: every request, on any path, is answered with `answer(body)` after
    /// `latency`. Requests are neither recorded nor parsed, only counted
    /// ([`request_count`](Self::request_count)); [`push`](Self::push) and
    /// [`set_handler`](Self::set_handler) have no effect. A response of one chunk without
    /// a delay is sent as a plain body (with its length), like a real endpoint's.
    pub async fn start_stateless(
        latency: Duration,
        answer: impl Fn(&[u8]) -> FakeResponse + Send + Sync + 'static,
    ) -> anyhow::Result<FakeLlm> {
        let inner = new_inner();
        let state = Arc::new(Stateless {
            inner: inner.clone(),
            latency,
            answer: Box::new(answer),
        });
        let app = Router::new().fallback(serve_stateless).with_state(state);
        Self::listen(app, inner).await
    }

    async fn listen(app: Router, inner: Arc<Inner>) -> anyhow::Result<FakeLlm> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeLlm {
            url: format!("http://{addr}"),
            inner,
        })
    }

    /// Queue a response; queued responses are used in order, before the handler.
    pub fn push(&self, r: FakeResponse) {
        lock(&self.inner.queue).push_back(r);
    }

    /// Answer requests the queue does not cover by calling `f`.
    pub fn set_handler(
        &self,
        f: impl Fn(&RecordedRequest) -> Option<FakeResponse> + Send + Sync + 'static,
    ) {
        *lock(&self.inner.handler) = Some(Arc::new(f));
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.requests).clone()
    }

    pub fn request_count(&self) -> usize {
        usize::try_from(self.inner.served.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }
}

fn new_inner() -> Arc<Inner> {
    Arc::new(Inner {
        queue: Mutex::new(VecDeque::new()),
        requests: Mutex::new(Vec::new()),
        handler: Mutex::new(None),
        served: AtomicU64::new(0),
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn serve(
    State(inner): State<Arc<Inner>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let rec = RecordedRequest {
        path: uri.path().to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    lock(&inner.requests).push(rec.clone());
    inner.served.fetch_add(1, Ordering::Relaxed);
    let queued = lock(&inner.queue).pop_front();
    let handler = lock(&inner.handler).clone();
    let resp = queued.or_else(|| handler.and_then(|h| h(&rec))).unwrap_or_else(|| {
        FakeResponse::json(
            500,
            r#"{"error":{"message":"fake LLM: no scripted response left","type":"server_error"}}"#,
        )
    });
    render(resp)
}

async fn serve_stateless(State(fake): State<Arc<Stateless>>, body: Bytes) -> Response {
    fake.inner.served.fetch_add(1, Ordering::Relaxed);
    let resp = (fake.answer)(&body);
    // Awaited even when zero: the yield lets a busy server write its answers in batches,
    // which measured about 2 µs of CPU less per request than answering each at once.
    tokio::time::sleep(fake.latency).await;
    match resp.chunks.as_slice() {
        [(delay, _)] if delay.is_zero() && !resp.cut => render_whole(resp),
        _ => render(resp),
    }
}

/// A response sent as one body: no stream to poll, a `content-length`.
fn render_whole(r: FakeResponse) -> Response {
    let body: Bytes = r
        .chunks
        .into_iter()
        .map(|(_, b)| b)
        .next()
        .unwrap_or_default();
    let mut resp = Response::new(Body::from(body));
    set_head(&mut resp, r.status, r.headers);
    resp
}

fn set_head(resp: &mut Response, status: u16, headers: Vec<(String, String)>) {
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            resp.headers_mut().append(k, v);
        }
    }
}

fn render(r: FakeResponse) -> Response {
    let cut = r.cut;
    let stream = futures::stream::unfold((r.chunks.into_iter(), cut), |(mut it, cut)| async move {
        match it.next() {
            Some((delay, bytes)) => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Some((Ok::<Bytes, std::io::Error>(bytes), (it, cut)))
            }
            None if cut => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "fake LLM: stream cut",
                )),
                (it, false),
            )),
            None => None,
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
    set_head(&mut resp, r.status, r.headers);
    resp
}
