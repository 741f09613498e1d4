//! A fake LLM endpoint that enforces rate limits the way real providers do: requests and
//! tokens per API key (and model) over a sliding window, refusing with HTTP 429, a
//! `retry-after` and the provider's JSON error, and announcing the true state of the key on
//! every answer (OpenAI's `x-ratelimit-*`, Anthropic's `anthropic-ratelimit-*`).
//!
//! It speaks OpenAI Chat Completions (`…/chat/completions`) and Anthropic Messages
//! (`…/messages`), streamed or not, and answers from a [`Script`]: the turn is the number
//! of assistant messages in the history sent, so a session resumed anywhere gets the same
//! answer for the same turn. Any other `GET` (a tool endpoint the scripts fetch) is
//! answered `200` with a small JSON body and is not counted against any limit.
//!
//! Every accepted and refused request is recorded with its time, key, model and tokens,
//! so tests assert on counts ("no window held more than its limit", "at most 5% refused")
//! rather than on timings.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

/// The limits of one key and model, per window. `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests: Option<u64>,
    pub tokens: Option<u64>,
}

impl Limits {
    pub fn requests(n: u64) -> Limits {
        Limits {
            requests: Some(n),
            tokens: None,
        }
    }

    pub fn unlimited() -> Limits {
        Limits::default()
    }

    pub fn with_tokens(mut self, n: u64) -> Limits {
        self.tokens = Some(n);
        self
    }
}

/// Which wire format a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    OpenAi,
    Anthropic,
}

/// What the script sees of one LLM request.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub api: Api,
    pub key: &'a str,
    pub model: &'a str,
    /// Assistant messages in the history sent: 0 for the first call of a session.
    pub turn: usize,
    /// The text of the first user message.
    pub prompt: &'a str,
    pub body: &'a Value,
}

/// One tool call of an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallReply {
    pub name: String,
    pub arguments: Value,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    pub tool_calls: Vec<ToolCallReply>,
    /// Output tokens to report (and count); estimated from the answer when `None`.
    pub output_tokens: Option<u64>,
}

impl Reply {
    pub fn text(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            tool_calls: Vec::new(),
            output_tokens: None,
        }
    }

    pub fn tool(mut self, name: &str, arguments: Value) -> Reply {
        self.tool_calls.push(ToolCallReply {
            name: name.into(),
            arguments,
        });
        self
    }

    fn output_tokens(&self) -> u64 {
        self.output_tokens.unwrap_or_else(|| {
            let args: usize = self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.to_string().len())
                .sum();
            estimate_tokens(self.text.len() + args).max(1)
        })
    }
}

/// Answers a request; `None` answers 400 (the script has nothing for it).
pub type Script = Arc<dyn Fn(&Ask<'_>) -> Option<Reply> + Send + Sync>;

/// A script of `turns` turns for every session: each turn but the last lists the
/// workspace (`list_dir`, a read-only tool every policy allows), the last answers.
pub fn list_dir_turns(turns: usize) -> Script {
    Arc::new(move |ask: &Ask<'_>| {
        if ask.turn + 1 < turns {
            Some(
                Reply::text(format!("Looking around, step {}.", ask.turn + 1))
                    .tool("list_dir", json!({"path": "."})),
            )
        } else if ask.turn + 1 == turns {
            Some(Reply::text("Done: the workspace is as expected."))
        } else {
            None
        }
    })
}

/// How the fake behaves.
#[derive(Clone)]
pub struct RateLimitedConfig {
    /// The sliding window both limits count over (a real provider's is a minute; tests
    /// use a few seconds).
    pub window: Duration,
    /// Limits of every model without its own entry in `models`.
    pub limits: Limits,
    /// Limits per model name, overriding `limits`.
    pub models: HashMap<String, Limits>,
    /// Time before the first byte of each accepted answer.
    pub latency: Duration,
    /// Delay before each SSE chunk after the first.
    pub chunk_delay: Duration,
    pub script: Script,
}

impl RateLimitedConfig {
    pub fn new(window: Duration, limits: Limits, script: Script) -> RateLimitedConfig {
        RateLimitedConfig {
            window,
            limits,
            models: HashMap::new(),
            latency: Duration::ZERO,
            chunk_delay: Duration::ZERO,
            script,
        }
    }

    pub fn model(mut self, model: &str, limits: Limits) -> RateLimitedConfig {
        self.models.insert(model.into(), limits);
        self
    }

    pub fn latency(mut self, latency: Duration) -> RateLimitedConfig {
        self.latency = latency;
        self
    }
}

/// What happened to one LLM request.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// Since the server started.
    pub at: Duration,
    pub api: Api,
    pub key: String,
    pub model: String,
    pub accepted: bool,
    /// Input plus output tokens counted (0 when refused).
    pub tokens: u64,
    /// 529 (overloaded), not a rate-limit refusal.
    pub overloaded: bool,
}

/// Counts over a run, for assertions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateStats {
    pub accepted: u64,
    pub refused: u64,
    pub overloaded: u64,
    pub tokens: u64,
    /// The most requests accepted for one key and model within any one window.
    pub max_requests_in_window: u64,
    /// The most tokens accepted for one key and model within any one window.
    pub max_tokens_in_window: u64,
}

impl RateStats {
    /// Refused requests (429 and 529) among all LLM requests.
    pub fn refused_share(&self) -> f64 {
        let all = self.accepted + self.refused + self.overloaded;
        if all == 0 {
            0.0
        } else {
            (self.refused + self.overloaded) as f64 / all as f64
        }
    }
}

/// The window of one key and model: accepted requests still in it, oldest first.
#[derive(Default)]
struct Window {
    log: VecDeque<(Instant, u64)>,
}

impl Window {
    fn prune(&mut self, now: Instant, window: Duration) {
        while let Some(&(t, _)) = self.log.front() {
            if now.saturating_duration_since(t) >= window {
                self.log.pop_front();
            } else {
                break;
            }
        }
    }

    fn tokens(&self) -> u64 {
        self.log.iter().map(|(_, n)| *n).sum()
    }

    /// Until the oldest entry leaves the window (when `remaining` next grows).
    fn next_free(&self, now: Instant, window: Duration) -> Duration {
        self.log.front().map_or(Duration::ZERO, |&(t, _)| {
            window.saturating_sub(now.saturating_duration_since(t))
        })
    }

    /// Until enough tokens have left the window for `need` more to fit under `limit`.
    fn tokens_free_in(&self, now: Instant, window: Duration, limit: u64, need: u64) -> Duration {
        let mut used = self.tokens();
        for &(t, n) in &self.log {
            if used.saturating_add(need) <= limit {
                break;
            }
            used = used.saturating_sub(n);
            if used.saturating_add(need) <= limit {
                return window.saturating_sub(now.saturating_duration_since(t));
            }
        }
        Duration::ZERO
    }
}

struct Shared {
    config: RateLimitedConfig,
    started: Instant,
    windows: Mutex<HashMap<(String, String), Window>>,
    served: Mutex<Vec<Served>>,
    /// The next this many LLM requests answer 529 (Anthropic) or 503 (OpenAI).
    overload: Mutex<u64>,
}

/// The running server. Dropping it does not stop it; it dies with the runtime.
#[derive(Clone)]
pub struct RateLimitedLlm {
    /// `http://127.0.0.1:<port>`; OpenAI clients use `{url}/v1`.
    pub url: String,
    shared: Arc<Shared>,
}

impl RateLimitedLlm {
    pub async fn start(config: RateLimitedConfig) -> anyhow::Result<RateLimitedLlm> {
        let shared = Arc::new(Shared {
            config,
            started: Instant::now(),
            windows: Mutex::new(HashMap::new()),
            served: Mutex::new(Vec::new()),
            overload: Mutex::new(0),
        });
        let app = Router::new().fallback(serve).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(RateLimitedLlm {
            url: format!("http://{addr}"),
            shared,
        })
    }

    /// The window the limits count over.
    pub fn window(&self) -> Duration {
        self.shared.config.window
    }

    /// Answer the next `n` LLM requests as overloaded (Anthropic's 529, OpenAI's 503).
    pub fn overload_next(&self, n: u64) {
        *lock(&self.shared.overload) = n;
    }

    /// Every LLM request so far, in arrival order.
    pub fn served(&self) -> Vec<Served> {
        lock(&self.shared.served).clone()
    }

    /// Totals over every key and model.
    pub fn stats(&self) -> RateStats {
        self.stats_where(|_| true)
    }

    /// Totals over the requests for `model` (any key).
    pub fn model_stats(&self, model: &str) -> RateStats {
        self.stats_where(|s| s.model == model)
    }

    fn stats_where(&self, keep: impl Fn(&Served) -> bool) -> RateStats {
        let served = self.served();
        let mut stats = RateStats::default();
        let mut accepted: HashMap<(&str, &str), Vec<(Duration, u64)>> = HashMap::new();
        for s in served.iter().filter(|s| keep(s)) {
            if s.overloaded {
                stats.overloaded += 1;
            } else if s.accepted {
                stats.accepted += 1;
                stats.tokens = stats.tokens.saturating_add(s.tokens);
                accepted
                    .entry((s.key.as_str(), s.model.as_str()))
                    .or_default()
                    .push((s.at, s.tokens));
            } else {
                stats.refused += 1;
            }
        }
        // Every window that starts at an accepted request: the fullest window of a
        // sliding log starts at one of its entries.
        let window = self.shared.config.window;
        for log in accepted.values() {
            let mut end = 0;
            let mut tokens = 0u64;
            for (start, &(t0, _)) in log.iter().enumerate() {
                while end < log.len() && log[end].0.saturating_sub(t0) < window {
                    tokens = tokens.saturating_add(log[end].1);
                    end += 1;
                }
                let n = u64::try_from(end - start).unwrap_or(u64::MAX);
                stats.max_requests_in_window = stats.max_requests_in_window.max(n);
                stats.max_tokens_in_window = stats.max_tokens_in_window.max(tokens);
                tokens = tokens.saturating_sub(log[start].1);
            }
        }
        stats
    }

    /// Accepted and refused requests per consecutive window since the start (window k
    /// covers `[k·window, (k+1)·window)`), over every key and model.
    pub fn per_window(&self) -> Vec<(u64, u64)> {
        let window = self.shared.config.window.as_micros().max(1);
        let mut out: Vec<(u64, u64)> = Vec::new();
        for s in self.served().iter().filter(|s| !s.overloaded) {
            let k = usize::try_from(s.at.as_micros() / window).unwrap_or(usize::MAX);
            if out.len() <= k {
                out.resize(k.saturating_add(1), (0, 0));
            }
            if s.accepted {
                out[k].0 += 1;
            } else {
                out[k].1 += 1;
            }
        }
        out
    }

    fn limits_of(&self, model: &str) -> Limits {
        self.shared
            .config
            .models
            .get(model)
            .copied()
            .unwrap_or(self.shared.config.limits)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// About four bytes per token, as the providers' own rules of thumb say.
pub fn estimate_tokens(bytes: usize) -> u64 {
    u64::try_from(bytes.div_ceil(4)).unwrap_or(u64::MAX)
}

/// A duration as OpenAI writes it in `x-ratelimit-reset-*`: Go's format (`120ms`, `1s`,
/// `59.89s`, `6m0s`, `1h2m3s`), rounded up to the millisecond so a client that waits that
/// long is never early.
pub fn openai_duration(d: Duration) -> String {
    let ms = d.as_micros().div_ceil(1000);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let h = ms / 3_600_000;
    let m = (ms / 60_000) % 60;
    let s_ms = ms % 60_000;
    let secs = if s_ms % 1000 == 0 {
        format!("{}s", s_ms / 1000)
    } else {
        let frac = format!("{:03}", s_ms % 1000);
        format!("{}.{}s", s_ms / 1000, frac.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// What the limits said about one request.
struct Verdict {
    accepted: bool,
    /// Until the request could be accepted (refused) or until capacity next returns.
    retry_after: Duration,
    which: &'static str,
    limits: Limits,
    remaining_requests: u64,
    remaining_tokens: u64,
    reset_requests: Duration,
    reset_tokens: Duration,
    used_requests: u64,
    used_tokens: u64,
}

fn admit(llm: &RateLimitedLlm, key: &str, model: &str, tokens: u64) -> Verdict {
    let limits = llm.limits_of(model);
    let window = llm.shared.config.window;
    let now = Instant::now();
    let mut windows = lock(&llm.shared.windows);
    let w = windows.entry((key.into(), model.into())).or_default();
    w.prune(now, window);
    let count = u64::try_from(w.log.len()).unwrap_or(u64::MAX);
    let used = w.tokens();
    let over_requests = limits.requests.is_some_and(|l| count.saturating_add(1) > l);
    let over_tokens = limits
        .tokens
        .is_some_and(|l| used.saturating_add(tokens) > l);
    let accepted = !over_requests && !over_tokens;
    let mut retry_after = Duration::ZERO;
    if over_requests {
        retry_after = retry_after.max(w.next_free(now, window));
    }
    if let Some(l) = limits.tokens.filter(|_| over_tokens) {
        // A request larger than the whole limit never fits: tell it the window.
        let wait = if tokens > l {
            window
        } else {
            w.tokens_free_in(now, window, l, tokens)
        };
        retry_after = retry_after.max(wait);
    }
    if accepted {
        w.log.push_back((now, tokens));
    }
    let count = u64::try_from(w.log.len()).unwrap_or(u64::MAX);
    let used = w.tokens();
    let reset = w.next_free(now, window);
    Verdict {
        accepted,
        retry_after,
        which: if over_requests { "requests" } else { "tokens" },
        limits,
        remaining_requests: limits.requests.map_or(0, |l| l.saturating_sub(count)),
        remaining_tokens: limits.tokens.map_or(0, |l| l.saturating_sub(used)),
        reset_requests: reset,
        reset_tokens: reset,
        used_requests: count,
        used_tokens: used,
    }
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let llm = RateLimitedLlm {
        url: String::new(),
        shared,
    };
    let path = uri.path();
    let api = if path.ends_with("/chat/completions") {
        Api::OpenAi
    } else if path.ends_with("/messages") {
        Api::Anthropic
    } else if method == Method::GET {
        return plain(200, json!({"ok": true, "path": path}).to_string());
    } else {
        return plain(
            404,
            json!({"error": {"message": "no such route"}}).to_string(),
        );
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let key = match api {
        Api::OpenAi => header("authorization")
            .and_then(|v| v.strip_prefix("Bearer ").map(str::to_string))
            .unwrap_or_default(),
        Api::Anthropic => header("x-api-key").unwrap_or_default(),
    };
    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
        return error(
            api,
            400,
            "invalid_request_error",
            "the body is not JSON",
            None,
        );
    };
    let model = req["model"].as_str().unwrap_or_default().to_string();
    let stream = req["stream"].as_bool().unwrap_or(false);
    let input_tokens = estimate_tokens(body.len());
    let at = llm.shared.started.elapsed();
    let mut record = Served {
        at,
        api,
        key: key.clone(),
        model: model.clone(),
        accepted: false,
        tokens: 0,
        overloaded: false,
    };
    {
        let mut overload = lock(&llm.shared.overload);
        if *overload > 0 {
            *overload -= 1;
            record.overloaded = true;
            lock(&llm.shared.served).push(record);
            return match api {
                Api::Anthropic => error(api, 529, "overloaded_error", "Overloaded", None),
                Api::OpenAi => error(api, 503, "server_error", "overloaded", None),
            };
        }
    }
    let prompt = first_user_text(&req);
    let turn = req["messages"].as_array().map_or(0, |ms| {
        ms.iter().filter(|m| m["role"] == "assistant").count()
    });
    let ask = Ask {
        api,
        key: &key,
        model: &model,
        turn,
        prompt: &prompt,
        body: &req,
    };
    let Some(reply) = (llm.shared.config.script)(&ask) else {
        lock(&llm.shared.served).push(record);
        return error(
            api,
            400,
            "invalid_request_error",
            &format!("the fake's script has no answer for turn {turn}"),
            None,
        );
    };
    let output_tokens = reply.output_tokens();
    let total = input_tokens.saturating_add(output_tokens);
    let v = admit(&llm, &key, &model, total);
    record.accepted = v.accepted;
    record.tokens = if v.accepted { total } else { 0 };
    lock(&llm.shared.served).push(record);
    let head = limit_headers(api, &v);
    if !v.accepted {
        let message = format!(
            "Rate limit reached for {model} on {} per window: Limit {}, Used {}, Requested {}. \
             Please try again in {}.",
            v.which,
            if v.which == "requests" {
                v.limits.requests.unwrap_or(0)
            } else {
                v.limits.tokens.unwrap_or(0)
            },
            if v.which == "requests" {
                v.used_requests
            } else {
                v.used_tokens
            },
            if v.which == "requests" { 1 } else { total },
            openai_duration(v.retry_after),
        );
        let mut resp = error(
            api,
            429,
            match api {
                Api::OpenAi => "rate_limit_exceeded",
                Api::Anthropic => "rate_limit_error",
            },
            &message,
            Some(v.which),
        );
        set_headers(&mut resp, head);
        let secs = v.retry_after.as_millis().div_ceil(1000).max(1);
        set_headers(
            &mut resp,
            vec![
                ("retry-after".into(), secs.to_string()),
                (
                    "retry-after-ms".into(),
                    v.retry_after.as_millis().max(1).to_string(),
                ),
            ],
        );
        return resp;
    }
    if !llm.shared.config.latency.is_zero() {
        tokio::time::sleep(llm.shared.config.latency).await;
    }
    let mut resp = if stream {
        let chunks = match api {
            Api::OpenAi => openai_stream(&model, &reply, input_tokens, output_tokens),
            Api::Anthropic => anthropic_stream(&model, &reply, input_tokens, output_tokens),
        };
        sse(chunks, llm.shared.config.chunk_delay)
    } else {
        let body = match api {
            Api::OpenAi => openai_whole(&model, &reply, input_tokens, output_tokens),
            Api::Anthropic => anthropic_whole(&model, &reply, input_tokens, output_tokens),
        };
        plain(200, body.to_string())
    };
    set_headers(&mut resp, head);
    resp
}

fn first_user_text(req: &Value) -> String {
    let Some(user) = req["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "user"))
    else {
        return String::new();
    };
    match &user["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn limit_headers(api: Api, v: &Verdict) -> Vec<(String, String)> {
    let mut out = Vec::new();
    match api {
        Api::OpenAi => {
            if let Some(l) = v.limits.requests {
                out.push(("x-ratelimit-limit-requests".into(), l.to_string()));
                out.push((
                    "x-ratelimit-remaining-requests".into(),
                    v.remaining_requests.to_string(),
                ));
                out.push((
                    "x-ratelimit-reset-requests".into(),
                    openai_duration(v.reset_requests),
                ));
            }
            if let Some(l) = v.limits.tokens {
                out.push(("x-ratelimit-limit-tokens".into(), l.to_string()));
                out.push((
                    "x-ratelimit-remaining-tokens".into(),
                    v.remaining_tokens.to_string(),
                ));
                out.push((
                    "x-ratelimit-reset-tokens".into(),
                    openai_duration(v.reset_tokens),
                ));
            }
        }
        Api::Anthropic => {
            let now = chrono::Utc::now();
            let at = |d: Duration| {
                let d = chrono::Duration::from_std(d).unwrap_or(chrono::Duration::zero());
                (now + d).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            };
            if let Some(l) = v.limits.requests {
                out.push(("anthropic-ratelimit-requests-limit".into(), l.to_string()));
                out.push((
                    "anthropic-ratelimit-requests-remaining".into(),
                    v.remaining_requests.to_string(),
                ));
                out.push((
                    "anthropic-ratelimit-requests-reset".into(),
                    at(v.reset_requests),
                ));
            }
            if let Some(l) = v.limits.tokens {
                out.push(("anthropic-ratelimit-tokens-limit".into(), l.to_string()));
                out.push((
                    "anthropic-ratelimit-tokens-remaining".into(),
                    v.remaining_tokens.to_string(),
                ));
                out.push((
                    "anthropic-ratelimit-tokens-reset".into(),
                    at(v.reset_tokens),
                ));
            }
        }
    }
    out
}

fn error(api: Api, status: u16, kind: &str, message: &str, param: Option<&str>) -> Response {
    let body = match api {
        Api::OpenAi => json!({"error": {
            "message": message,
            "type": if status == 429 { param.unwrap_or("requests") } else { kind },
            "param": null,
            "code": if status == 429 { Some(kind) } else { None },
        }}),
        Api::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
    };
    plain(status, body.to_string())
}

fn plain(status: u16, body: String) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    set_headers(
        &mut resp,
        vec![("content-type".into(), "application/json".into())],
    );
    resp
}

fn set_headers(resp: &mut Response, headers: Vec<(String, String)>) {
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            resp.headers_mut().insert(k, v);
        }
    }
}

fn sse(chunks: Vec<Bytes>, delay: Duration) -> Response {
    let stream = futures::stream::unfold(
        (chunks.into_iter(), true),
        move |(mut it, first)| async move {
            let next = it.next()?;
            if !first && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Some((Ok::<Bytes, std::io::Error>(next), (it, false)))
        },
    );
    let mut resp = Response::new(Body::from_stream(stream));
    set_headers(
        &mut resp,
        vec![("content-type".into(), "text/event-stream".into())],
    );
    resp
}

fn openai_chunk(model: &str, delta: Value, finish: Option<&str>) -> Bytes {
    let v = json!({
        "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    });
    Bytes::from(format!("data: {v}\n\n"))
}

fn call_id(api: Api, k: usize) -> String {
    match api {
        Api::OpenAi => format!("call_fake_{k}"),
        Api::Anthropic => format!("toolu_fake_{k}"),
    }
}

fn openai_stream(model: &str, r: &Reply, input: u64, output: u64) -> Vec<Bytes> {
    let mut out = vec![openai_chunk(
        model,
        json!({"role": "assistant", "content": ""}),
        None,
    )];
    if !r.text.is_empty() {
        out.push(openai_chunk(model, json!({"content": r.text}), None));
    }
    for (k, c) in r.tool_calls.iter().enumerate() {
        out.push(openai_chunk(
            model,
            json!({"tool_calls": [{"index": k, "id": call_id(Api::OpenAi, k), "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()}}]}),
            None,
        ));
    }
    let finish = if r.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    out.push(openai_chunk(model, json!({}), Some(finish)));
    out.push(Bytes::from(format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model,
            "choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output,
            "total_tokens": input.saturating_add(output)}})
    )));
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

fn openai_whole(model: &str, r: &Reply, input: u64, output: u64) -> Value {
    let calls: Vec<Value> = r
        .tool_calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            json!({"id": call_id(Api::OpenAi, k), "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": r.text});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": message,
            "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
        "usage": {"prompt_tokens": input, "completion_tokens": output,
            "total_tokens": input.saturating_add(output)}
    })
}

fn anthropic_event(v: Value) -> Bytes {
    let ty = v["type"].as_str().unwrap_or_default().to_string();
    Bytes::from(format!("event: {ty}\ndata: {v}\n\n"))
}

fn anthropic_stream(model: &str, r: &Reply, input: u64, output: u64) -> Vec<Bytes> {
    let mut out = vec![anthropic_event(
        json!({"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": 1}}}),
    )];
    let mut index = 0;
    if !r.text.is_empty() {
        out.push(anthropic_event(
            json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "text", "text": ""}}),
        ));
        out.push(anthropic_event(
            json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": r.text}}),
        ));
        out.push(anthropic_event(
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for (k, c) in r.tool_calls.iter().enumerate() {
        out.push(anthropic_event(
            json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": call_id(Api::Anthropic, k),
                "name": c.name, "input": {}}}),
        ));
        out.push(anthropic_event(
            json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": c.arguments.to_string()}}),
        ));
        out.push(anthropic_event(
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    let stop = if r.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    out.push(anthropic_event(json!({"type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": output}})));
    out.push(anthropic_event(json!({"type": "message_stop"})));
    out
}

fn anthropic_whole(model: &str, r: &Reply, input: u64, output: u64) -> Value {
    let mut content = Vec::new();
    if !r.text.is_empty() {
        content.push(json!({"type": "text", "text": r.text}));
    }
    for (k, c) in r.tool_calls.iter().enumerate() {
        content.push(json!({"type": "tool_use", "id": call_id(Api::Anthropic, k),
            "name": c.name, "input": c.arguments}));
    }
    json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
        "content": content,
        "stop_reason": if r.tool_calls.is_empty() { "end_turn" } else { "tool_use" },
        "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai() {
        assert_eq!(openai_duration(Duration::ZERO), "0s");
        assert_eq!(openai_duration(Duration::from_micros(1)), "1ms");
        assert_eq!(openai_duration(Duration::from_millis(120)), "120ms");
        assert_eq!(openai_duration(Duration::from_secs(1)), "1s");
        assert_eq!(openai_duration(Duration::from_millis(59_890)), "59.89s");
        assert_eq!(openai_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(
            openai_duration(Duration::from_millis(3_723_500)),
            "1h2m3.5s"
        );
    }
}
