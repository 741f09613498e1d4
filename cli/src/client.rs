//! The client commands — `agentq submit`, `status`, `cancel`, `sessions`, `approve`,
//! `deny`, `send` — over the HTTP API at `AGENTQ_API_URL` (or `api_url` of `agentq.toml`;
//! default `http://127.0.0.1:7700`). Answers are read as the `agentq-api` types the
//! scheduler sends. Session requests are sent as the user wrote them (flags and JSON
//! Lines alike), so that the server, not the client, judges them and names a bad field.
//!
//! `submit --wait` must not miss a completion that happens between the submit and the
//! subscribe, and the session id is only known after the submit: so it subscribes to
//! `agentq:done` (all completions) first and filters by id. Without a Redis URL
//! (`AGENTQ_REDIS_URL`) it polls `GET /v1/sessions/{id}` instead; with one it still polls
//! now and then, because pub/sub drops messages while a connection is down.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use agentq_api::{
    ApprovalRequest, ApprovalResponse, BatchResponse, CancelResponse, ErrorBody, ListResponse,
    PostMessage, PostMessageResponse, SessionDetail, SessionRef, SessionView,
};
use agentq_core::config::Settings;
use agentq_core::protocol::Strategy;
use agentq_core::queue::DONE_CHANNEL;
use agentq_core::{Completion, CompletionUsage, SessionStatus};

/// Items per `POST /v1/sessions/batch` (the server's default limit).
const BATCH_CHUNK: usize = 10_000;
const POLL_EVERY: Duration = Duration::from_millis(500);
/// With pub/sub: how often to check by polling too (missed messages).
const SAFETY_POLL_EVERY: Duration = Duration::from_secs(10);
/// Above this many pending sessions the safety poll is skipped (it would be a GET each).
const SAFETY_POLL_MAX: usize = 200;

#[derive(Args, Debug, Clone)]
pub struct ApiArgs {
    /// Base URL of the HTTP API (default: `api_url` of agentq.toml, else http://127.0.0.1:7700).
    #[arg(long, env = "AGENTQ_API_URL")]
    pub api_url: Option<String>,
    /// API key, sent as `Authorization: Bearer <key>` (from `agentq keys create`).
    #[arg(long, env = "AGENTQ_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// What a refused request must tell the user: where the key comes from.
pub const KEY_HINT: &str =
    "pass an API key with --api-key or AGENTQ_API_KEY (create one with `agentq keys create`)";

impl ApiArgs {
    /// The default headers of a client of the API: the key, if one is given.
    pub fn headers(&self) -> anyhow::Result<reqwest::header::HeaderMap> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(key) = self
            .api_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
        {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| anyhow!("--api-key (AGENTQ_API_KEY) is not a valid header value"))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(headers)
    }
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// The task for the agent (`-` reads it from stdin).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Wait for the session(s) to finish and print the result.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this many seconds (exit 1).
    #[arg(long, requires = "wait")]
    pub wait_timeout: Option<u64>,
    /// A JSON Lines file of sessions (one request object a line; `-` for stdin), submitted
    /// with `POST /v1/sessions/batch`. The flags below fill fields a line leaves out.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// openai, anthropic or scripted (default: the workers' default).
    #[arg(long)]
    pub provider: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    /// act, think, plan or plan-act.
    #[arg(long)]
    pub mode: Option<String>,
    #[arg(long)]
    pub max_iterations: Option<u32>,
    /// Comma-separated tool names.
    #[arg(long, value_delimiter = ',')]
    pub tools: Option<Vec<String>>,
    #[arg(long)]
    pub queue: Option<String>,
    /// 0 (lowest) to 9 (default 5): among waiting sessions, higher ones run first.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: Option<u8>,
    #[arg(long)]
    pub system: Option<String>,
    /// Submitting again with the same key returns the existing session.
    #[arg(long, conflicts_with = "file")]
    pub idempotency_key: Option<String>,
    /// A file for the session's workspace (repeatable). A relative path without `..`
    /// keeps its place (`--input src/main.rs` is `src/main.rs`); any other lands at its
    /// file name.
    #[arg(long, value_name = "PATH")]
    pub input: Vec<PathBuf>,
    /// A directory whose files (recursively, paths relative to it, symbolic links
    /// skipped) go into the session's workspace (repeatable).
    #[arg(long, value_name = "DIR")]
    pub input_dir: Vec<PathBuf>,
    /// Start from the files of this session (of your tenant).
    #[arg(long, value_name = "ID")]
    pub workspace_from: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    pub id: String,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct CancelArgs {
    pub id: String,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct SessionsArgs {
    /// queued, running, waiting, awaiting_approval, completed, failed or cancelled.
    #[arg(long)]
    pub status: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Continue after this session id (the `next` cursor printed by the previous page).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// A thin client of the HTTP API with one-line errors.
pub(crate) struct Api {
    base: String,
    http: reqwest::Client,
}

/// A 4xx/5xx answer, with the server's error body.
#[derive(Debug)]
pub(crate) struct ApiFailure {
    status: u16,
    pub(crate) code: String,
    pub(crate) message: String,
    field: Option<String>,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        write!(f, " [HTTP {} {}]", self.status, self.code)?;
        if matches!(self.status, 401 | 403) && self.field.is_none() {
            write!(f, "; {KEY_HINT}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiFailure {}

impl ApiFailure {
    /// The failure an error answer describes: the API's error body, or (from something
    /// in front of the API) the text of a body that is not JSON.
    fn of(status: u16, text: &str) -> ApiFailure {
        let (code, message, field) = match serde_json::from_str::<ErrorBody>(text) {
            Ok(ErrorBody { error }) => (error.code, error.message, error.field),
            Err(_) if serde_json::from_str::<Value>(text).is_ok() => {
                ("error".to_string(), String::new(), None)
            }
            Err(_) => ("error".to_string(), text.trim().to_string(), None),
        };
        ApiFailure {
            status,
            code,
            message: if message.is_empty() {
                "no details".to_string()
            } else {
                message
            },
            field,
        }
    }
}

impl Api {
    pub(crate) fn new(args: &ApiArgs) -> anyhow::Result<Api> {
        let base = match &args.api_url {
            Some(u) if !u.trim().is_empty() => u.clone(),
            _ => Settings::load_only(None, |k| std::env::var(k).ok(), &["api_url"])?.api_url,
        };
        let http = reqwest::Client::builder()
            .default_headers(args.headers()?)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// Send `req`; a 2xx answer is read as `T`, any other as an [`ApiFailure`].
    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> anyhow::Result<(u16, T)> {
        let resp = req.send().await.map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.transport_error(e))?;
        if status >= 400 {
            return Err(ApiFailure::of(status, &text).into());
        }
        let body = serde_json::from_str(&text)
            .map_err(|_| anyhow!("unexpected answer from the API: {}", text.trim()))?;
        Ok((status, body))
    }

    fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        let cause = root_cause(&e);
        if e.is_connect() {
            anyhow!(
                "cannot reach the API at {}: {cause} (is `agentq scheduler` running?)",
                self.base
            )
        } else if e.is_timeout() {
            anyhow!("the API at {} did not answer in time", self.base)
        } else {
            anyhow!("request to the API at {} failed: {cause}", self.base)
        }
    }

    /// The bytes of a 2xx answer to a GET of `path`, any other as an [`ApiFailure`].
    pub(crate) async fn get_bytes(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let text = resp.text().await.map_err(|e| self.transport_error(e))?;
            return Err(ApiFailure::of(status, &text).into());
        }
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| self.transport_error(e))
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        Ok(self
            .send(self.http.get(format!("{}{path}", self.base)))
            .await?
            .1)
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<(u16, T)> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }
}

/// The innermost error's text, lower-cased the way a sentence continues
/// ("connection refused", not "Connection refused (os error 111)").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    if let Some(io) = cur.downcast_ref::<std::io::Error>()
        && io.kind() == std::io::ErrorKind::ConnectionRefused
    {
        return "connection refused".to_string();
    }
    let s = cur.to_string();
    let s = s.split(" (os error").next().unwrap_or(&s).to_string();
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => s,
    }
}

impl SubmitArgs {
    /// The flags as request fields (each only when given).
    fn defaults(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("provider", self.provider.clone().map(Value::from));
        put("model", self.model.clone().map(Value::from));
        put("mode", self.mode.clone().map(Value::from));
        put("max_iterations", self.max_iterations.map(Value::from));
        put("tools", self.tools.clone().map(|t| json!(t)));
        put("queue", self.queue.clone().map(Value::from));
        put("priority", self.priority.map(Value::from));
        put("system", self.system.clone().map(Value::from));
        put(
            "idempotency_key",
            self.idempotency_key.clone().map(Value::from),
        );
        put(
            "workspace_from",
            self.workspace_from.clone().map(Value::from),
        );
        m
    }
}

fn read_source(path: &std::path::Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read stdin")?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    }
}

/// Parse a JSON Lines batch; every line must be an object. Blank lines are skipped.
fn parse_jsonl(
    text: &str,
    name: &str,
    defaults: &Map<String, Value>,
) -> anyhow::Result<Vec<Value>> {
    let mut items = Vec::new();
    for (n, line) in text.as_bytes().lines().enumerate() {
        let line = line.with_context(|| format!("{name}: cannot read line {}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("{name}:{}: not valid JSON", n + 1))?;
        let Value::Object(mut obj) = v else {
            bail!("{name}:{}: expected a JSON object", n + 1);
        };
        for (k, v) in defaults {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
        items.push(Value::Object(obj));
    }
    if items.is_empty() {
        bail!("{name}: no sessions in the file");
    }
    Ok(items)
}

/// `agentq submit`
pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    // Subscribe before submitting, so a session that finishes at once is not missed.
    let mut done = if args.wait {
        subscribe_done().await
    } else {
        None
    };

    let mut defaults = args.defaults();
    if !args.input.is_empty() || !args.input_dir.is_empty() {
        let files = crate::files::collect_inputs(&args.input, &args.input_dir)?;
        defaults.insert("files".into(), Value::Object(files));
    }
    let ids: Vec<String> = if let Some(file) = &args.file {
        let name = file.display().to_string();
        let items = parse_jsonl(&read_source(file)?, &name, &defaults)?;
        let mut ids = Vec::with_capacity(items.len());
        for (offset, chunk) in batch_chunks(&items)? {
            let (_, body): (u16, BatchResponse) = api
                .post("/v1/sessions/batch", &chunk)
                .await
                .map_err(|e| batch_error(e, offset, ids.len()))?;
            for s in body.sessions {
                println!("{}", s.id);
                ids.push(s.id);
            }
        }
        ids
    } else {
        let prompt = match args.prompt.as_deref() {
            Some("-") => read_source(std::path::Path::new("-"))?,
            Some(p) => p.to_string(),
            None => bail!("a prompt or --file is required"),
        };
        let mut body = defaults;
        body.insert("prompt".into(), Value::String(prompt));
        let (status, resp): (u16, SessionRef) = api.post("/v1/sessions", &body).await?;
        let id = resp.id;
        if args.wait {
            // The result goes to stdout; keep the id off it.
            eprintln!("submitted {id}");
        } else {
            println!("{id}");
            if status == 200 {
                eprintln!(
                    "(existing session for this idempotency key: {})",
                    resp.status
                );
            }
        }
        vec![id]
    };

    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let timeout = args.wait_timeout.map(Duration::from_secs);
    let results = wait_for(&api, &ids, done.as_mut(), timeout).await?;
    Ok(report(&ids, &results))
}

/// Which items of a failed batch were already submitted, so the user can resume.
/// Bytes of one batch the client sends at most: the server's body limit, less room for
/// the array's commas and brackets.
const BATCH_BYTES: usize = agentq_scheduler::BATCH_BODY_LIMIT - 1024 * 1024;

/// `items` in consecutive batches of at most [`BATCH_CHUNK`] items and [`BATCH_BYTES`]
/// bytes, each with the offset of its first item.
fn batch_chunks<T: Serialize>(items: &[T]) -> anyhow::Result<Vec<(usize, &[T])>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0usize);
    for (i, item) in items.iter().enumerate() {
        let len = serde_json::to_vec(item)?.len().saturating_add(1);
        if i > start && (i - start >= BATCH_CHUNK || bytes.saturating_add(len) > BATCH_BYTES) {
            out.push((start, &items[start..i]));
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(len);
    }
    if start < items.len() {
        out.push((start, &items[start..]));
    }
    Ok(out)
}

fn batch_error(e: anyhow::Error, offset: usize, submitted: usize) -> anyhow::Error {
    let e = match e.downcast::<ApiFailure>() {
        Ok(mut f) => {
            // The server numbers items within the chunk; number them within the file.
            if let Some(field) = &f.field
                && offset > 0
                && let Some(rest) = field.strip_prefix('[')
                && let Some((n, tail)) = rest.split_once(']')
                && let Ok(n) = n.parse::<usize>()
            {
                f.field = Some(format!("[{}]{tail}", n + offset));
            }
            anyhow::Error::new(f)
        }
        Err(e) => e,
    };
    if submitted > 0 {
        e.context(format!(
            "{submitted} sessions (the ids printed above) were submitted before this error"
        ))
    } else {
        e
    }
}

/// Print each outcome; success when every session completed.
fn report(ids: &[String], results: &HashMap<String, Completion>) -> ExitCode {
    let mut all_ok = true;
    let single = ids.len() == 1;
    for id in ids {
        let Some(c) = results.get(id) else {
            all_ok = false;
            eprintln!("{id}: still running (gave up waiting)");
            continue;
        };
        let ok = c.status == SessionStatus::Completed;
        all_ok &= ok;
        let reason = c.finish_reason.map(|r| r.to_string()).unwrap_or_default();
        if single {
            if ok {
                println!("{}", c.result.as_deref().unwrap_or(""));
            } else {
                eprintln!(
                    "session {id} {} ({reason}){}",
                    c.status,
                    c.error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                if let Some(r) = c.result.as_deref().filter(|r| !r.is_empty()) {
                    println!("{r}");
                }
            }
        } else {
            let detail = if ok {
                c.result.as_deref().unwrap_or("").replace('\n', " ")
            } else {
                c.error.as_deref().unwrap_or("").replace('\n', " ")
            };
            println!("{id}\t{}\t{reason}\t{}", c.status, truncate(&detail, 100));
        }
    }
    if !single {
        let done = ids
            .iter()
            .filter(|id| {
                results
                    .get(*id)
                    .is_some_and(|c| c.status == SessionStatus::Completed)
            })
            .count();
        eprintln!("{done}/{} completed", ids.len());
    }
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

type DoneStream = futures::stream::BoxStream<'static, Completion>;

/// All completions (`agentq:done`), when a Redis URL is configured and reachable.
async fn subscribe_done() -> Option<DoneStream> {
    let url = match Settings::load_only(None, |k| std::env::var(k).ok(), &["redis_url"]) {
        Ok(c) => c.redis_url?,
        Err(e) => {
            tracing::warn!(error = %e, "cannot load the configuration; polling the API");
            return None;
        }
    };
    let sub = async {
        let client = redis::Client::open(url.as_str())?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(DONE_CHANNEL).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(Duration::from_secs(5), sub).await {
        Ok(Ok(pubsub)) => Some(
            pubsub
                .into_on_message()
                .filter_map(|msg| async move {
                    let payload: String = msg.get_payload().ok()?;
                    serde_json::from_str::<Completion>(&payload).ok()
                })
                .boxed(),
        ),
        Ok(Err(e)) => {
            eprintln!("agentq: cannot subscribe to completions ({e}); polling the API instead");
            None
        }
        Err(_) => {
            eprintln!("agentq: subscribing to completions timed out; polling the API instead");
            None
        }
    }
}

/// Wait until every id has finished (or `timeout`): from pub/sub when subscribed, by
/// polling otherwise (and, with few sessions, now and then as well).
async fn wait_for(
    api: &Api,
    ids: &[String],
    mut done: Option<&mut DoneStream>,
    timeout: Option<Duration>,
) -> anyhow::Result<HashMap<String, Completion>> {
    let mut pending: HashSet<String> = ids.iter().cloned().collect();
    let mut results = HashMap::new();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let poll_every = if done.is_some() {
        SAFETY_POLL_EVERY
    } else {
        POLL_EVERY
    };
    // The first poll right away: a session may have finished before we subscribed (an
    // idempotent repeat of an old one).
    let mut next_poll = tokio::time::Instant::now();
    while !pending.is_empty() {
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            break;
        }
        let wake = deadline.map_or(next_poll, |d| d.min(next_poll));
        let msg = match done.as_deref_mut() {
            Some(stream) => tokio::select! {
                m = stream.next() => m,
                () = tokio::time::sleep_until(wake) => None,
            },
            None => {
                tokio::time::sleep_until(wake).await;
                None
            }
        };
        if let Some(c) = msg {
            if pending.remove(&c.session_id) {
                results.insert(c.session_id.clone(), c);
            }
            continue;
        }
        if tokio::time::Instant::now() < next_poll {
            continue;
        }
        next_poll = tokio::time::Instant::now() + poll_every;
        if done.is_some() && pending.len() > SAFETY_POLL_MAX {
            continue;
        }
        let batch: Vec<String> = pending.iter().cloned().collect();
        for id in batch {
            let view: SessionDetail = api.get(&format!("/v1/sessions/{id}")).await?;
            if let Some(c) = completion_from_view(&view.session) {
                pending.remove(&id);
                results.insert(id, c);
            }
        }
    }
    Ok(results)
}

/// A `Completion` from `GET /v1/sessions/{id}` once the session is terminal.
fn completion_from_view(v: &SessionView) -> Option<Completion> {
    if !v.status.is_terminal() {
        return None;
    }
    Some(Completion {
        session_id: v.id.clone(),
        status: v.status,
        finish_reason: v.finish_reason,
        result: v.result.clone(),
        error: v.error.clone(),
        iterations: v.iterations,
        usage: CompletionUsage {
            input_tokens: v.usage.input_tokens,
            output_tokens: v.usage.output_tokens,
        },
        parent_id: v.parent_id.clone(),
    })
}

/// Pretty JSON of an answer, keys sorted as the server sends them.
fn pretty(body: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&serde_json::to_value(body)?)?)
}

/// `agentq status ID`: the session as JSON on stdout; the calls it holds for a decision,
/// with the commands that decide them, on stderr (so the JSON stays pipeable).
pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let view: SessionDetail = api.get(&format!("/v1/sessions/{}", args.id)).await?;
    println!("{}", pretty(&view)?);
    for line in pending_lines(&view.session.id, &view.pending_approvals) {
        eprintln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Tool arguments are shown up to this many characters where a held call is listed.
const ARGS_CHARS: usize = 120;

/// `s` on one line, cut to `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// `s` as one shell word. Call ids come from the model's provider, so anything but a
/// plain word is quoted, control characters escaped: the printed command is safe to paste.
pub fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.:+=@%/,".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    if !s.chars().any(char::is_control) {
        return format!("'{}'", s.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The commands that approve or deny a held call.
pub fn decide_commands(session_id: &str, call_id: &str) -> String {
    let (s, c) = (shell_word(session_id), shell_word(call_id));
    format!("agentq approve {s} {c}  |  agentq deny {s} {c} --reason '...'")
}

/// What `status` prints about the calls a session holds: none, or a header and two lines
/// per call (the call, then how to decide it).
pub fn pending_lines(session_id: &str, pending: &[agentq_api::PendingApproval]) -> Vec<String> {
    if pending.is_empty() {
        return Vec::new();
    }
    let deadline = pending
        .iter()
        .find_map(|p| p.deadline)
        .map(|d| format!(" (denied as `timeout` after {})", d.to_rfc3339()))
        .unwrap_or_default();
    let mut out = vec![format!(
        "{} tool call(s) await approval{deadline}:",
        pending.len()
    )];
    for p in pending {
        out.push(format!(
            "  {} {}({})",
            shell_word(&p.tool_call_id),
            p.tool,
            one_line(&p.arguments.to_string(), ARGS_CHARS)
        ));
        out.push(format!(
            "      {}",
            decide_commands(session_id, &p.tool_call_id)
        ));
    }
    out
}

/// `agentq cancel ID`
pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let answer: anyhow::Result<(u16, CancelResponse)> = api
        .post(&format!("/v1/sessions/{}/cancel", args.id), &json!({}))
        .await;
    match answer {
        Ok((202, _)) => {
            println!(
                "cancel requested for {} (running; its worker stops it at the next step)",
                args.id
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(_) => {
            println!("cancelled {}", args.id);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => match e.downcast_ref::<ApiFailure>() {
            Some(f) if f.code == "already_finished" => {
                eprintln!("agentq: {}", f.message);
                Ok(ExitCode::from(1))
            }
            _ => Err(e),
        },
    }
}

/// `agentq sessions`
pub async fn sessions(args: SessionsArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let mut q = vec![format!("limit={}", args.limit)];
    if let Some(s) = &args.status {
        q.push(format!("status={}", encode(s)));
    }
    if let Some(c) = &args.cursor {
        q.push(format!("cursor={}", encode(c)));
    }
    let body: ListResponse = api.get(&format!("/v1/sessions?{}", q.join("&"))).await?;
    if args.json {
        println!("{}", pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 6]> = body.sessions.iter().map(table_row).collect();
    print_table(
        &["ID", "STATUS", "ITER", "TOKENS", "CREATED (UTC)", "PROMPT"],
        &rows,
    );
    if let Some(next) = &body.next_cursor {
        eprintln!("more: agentq sessions --cursor {next}");
    }
    Ok(ExitCode::SUCCESS)
}

/// ID, STATUS, ITER, TOKENS, CREATED (UTC), PROMPT.
fn table_row(s: &SessionView) -> [String; 6] {
    let tokens = s.usage.input_tokens.saturating_add(s.usage.output_tokens);
    [
        s.id.clone(),
        s.status.to_string(),
        s.iterations.to_string(),
        tokens.to_string(),
        s.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
        truncate(&s.spec.prompt.replace('\n', " "), 50),
    ]
}

fn print_table(header: &[&str; 6], rows: &[[String; 6]]) {
    let mut widths = header.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header);
    for r in rows {
        line(&r.each_ref().map(String::as_str));
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Percent-encode a query value (ids and statuses are plain, but the user typed them).
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_lines_get_flag_defaults() {
        let mut d = Map::new();
        d.insert("queue".into(), json!("bulk"));
        let items = parse_jsonl(
            "{\"prompt\":\"a\"}\n\n{\"prompt\":\"b\",\"queue\":\"q2\"}\n",
            "f",
            &d,
        )
        .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0]["queue"], "bulk");
        assert_eq!(items[1]["queue"], "q2");
        let e = parse_jsonl("{\"prompt\":\"a\"}\n[1]\n", "f.jsonl", &d).unwrap_err();
        assert_eq!(e.to_string(), "f.jsonl:2: expected a JSON object");
        let e = parse_jsonl("{oops\n", "f.jsonl", &d).unwrap_err();
        assert!(
            e.to_string().starts_with("f.jsonl:1: not valid JSON"),
            "{e}"
        );
        assert!(parse_jsonl("\n", "f", &d).is_err());
    }

    /// `GET /v1/sessions/{id}` of a session in `status`, as the scheduler answers.
    fn view(status: &str, extra: Value) -> SessionView {
        let mut v = json!({
            "prompt": "p", "mode": "act", "max_iterations": 50, "temperature": 0.2,
            "max_tokens": 4096, "tool_timeout_secs": 60, "approval_timeout_secs": 3600,
            "history_window": 200, "max_llm_retries": 3, "retry_delay_ms": 1000,
            "max_background_drain_rounds": 20, "tool_output_max_chars": 50000,
            "id": "s1", "status": status, "finish_reason": null, "result": null,
            "error": null, "iterations": 0, "parent_id": null, "root_id": "s1",
            "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                      "cache_write_tokens": 0, "reasoning_tokens": 0},
            "depth": 0, "queue": "default", "cancel_requested": false, "attempts": 0,
            "lease_owner": null, "idempotency_key": null, "children": [],
            "created_at": "2026-12-01T08:36:45.123456Z",
            "updated_at": "2026-12-01T08:36:45.123456Z", "finished_at": null,
        });
        if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
            v.extend(extra);
        }
        serde_json::from_value::<SessionDetail>(v).unwrap().session
    }

    #[test]
    fn completion_from_a_terminal_view() {
        let v = view(
            "completed",
            json!({"finish_reason": "stop", "result": "42", "iterations": 2,
                   "usage": {"input_tokens": 5, "output_tokens": 7}}),
        );
        let c = completion_from_view(&v).unwrap();
        assert_eq!(c.session_id, "s1");
        assert_eq!(c.result.as_deref(), Some("42"));
        assert_eq!(c.iterations, 2);
        assert_eq!(c.usage.output_tokens, 7);
        assert!(completion_from_view(&view("running", json!({}))).is_none());
    }

    #[test]
    fn table_rows_and_error_bodies() {
        let row = table_row(&view(
            "queued",
            json!({"prompt": "hello\nthere", "usage": {"input_tokens": 5, "output_tokens": 7}}),
        ));
        assert_eq!(
            row,
            [
                "s1",
                "queued",
                "0",
                "12",
                "2026-12-01 08:36:45",
                "hello there"
            ]
            .map(String::from)
        );
        let f = ApiFailure::of(
            422,
            r#"{"error":{"code":"invalid_field","message":"bad","field":"mode"}}"#,
        );
        assert_eq!(f.to_string(), "bad (field `mode`) [HTTP 422 invalid_field]");
        assert_eq!(
            ApiFailure::of(502, "Bad Gateway\n").to_string(),
            "Bad Gateway [HTTP 502 error]"
        );
        assert_eq!(
            ApiFailure::of(500, "{}").to_string(),
            "no details [HTTP 500 error]"
        );
    }

    #[test]
    fn batches_are_cut_by_count_and_by_size() {
        let small = vec![0u8; 25_000];
        let chunks = batch_chunks(&small).unwrap();
        let cuts: Vec<(usize, usize)> = chunks.iter().map(|(o, c)| (*o, c.len())).collect();
        assert_eq!(cuts, [(0, 10_000), (10_000, 10_000), (20_000, 5_000)]);
        let big = vec!["x".repeat(1024 * 1024); 70];
        let chunks = batch_chunks(&big).unwrap();
        assert!(chunks.len() >= 3, "{}", chunks.len());
        let mut next = 0;
        for (offset, chunk) in &chunks {
            assert_eq!(*offset, next);
            next += chunk.len();
            assert!(serde_json::to_vec(chunk).unwrap().len() < agentq_scheduler::BATCH_BODY_LIMIT);
        }
        assert_eq!(next, 70);
        assert!(batch_chunks::<u8>(&[]).unwrap().is_empty());
    }

    #[test]
    fn batch_error_fields_are_file_relative() {
        let f = ApiFailure {
            status: 422,
            code: "invalid_field".into(),
            message: "bad".into(),
            field: Some("[3].mode".into()),
        };
        let e = batch_error(f.into(), 20_000, 20_000);
        let inner = e.downcast_ref::<ApiFailure>().unwrap();
        assert_eq!(inner.field.as_deref(), Some("[20003].mode"));
        assert!(format!("{e:#}").contains("20000 sessions"));
    }

    #[test]
    fn helpers() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(one_line("a\n  b", 10), "a b");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }

    #[test]
    fn held_call_ids_are_pasteable() {
        assert_eq!(shell_word("call_AbC-1.2:3"), "call_AbC-1.2:3");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("$(rm -rf ~)"), "'$(rm -rf ~)'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        // No raw control character reaches the terminal.
        assert_eq!(shell_word("a\u{1b}[2J'"), r"$'a\u001b[2J\''");
    }

    #[test]
    fn pending_approvals_say_how_to_decide() {
        assert!(pending_lines("s1", &[]).is_empty());
        let deadline = serde_json::from_value(json!("2026-12-01T09:00:00Z")).unwrap();
        let held = |id: &str, args: Value| agentq_api::PendingApproval {
            tool_call_id: id.into(),
            tool: "write_file".into(),
            arguments: args,
            deadline: Some(deadline),
        };
        let lines = pending_lines(
            "s1",
            &[
                held("c1", json!({"path": "a.txt"})),
                held("c 2", json!({"content": "x".repeat(500)})),
            ],
        );
        assert_eq!(
            lines[0],
            "2 tool call(s) await approval (denied as `timeout` after 2026-12-01T09:00:00+00:00):"
        );
        assert_eq!(lines[1], r#"  c1 write_file({"path":"a.txt"})"#);
        assert_eq!(
            lines[2],
            "      agentq approve s1 c1  |  agentq deny s1 c1 --reason '...'"
        );
        assert!(lines[3].starts_with("  'c 2' write_file({\"content\":\"xxx"));
        assert!(
            lines[3].ends_with("…)") && lines[3].chars().count() < 160,
            "{}",
            lines[3]
        );
        assert!(lines[4].contains("agentq approve s1 'c 2'"), "{}", lines[4]);
    }
}

#[derive(Args, Debug)]
pub struct DecideArgs {
    /// The session holding the call.
    pub id: String,
    /// The held tool call's id (`agentq status ID` lists the calls a session holds).
    pub tool_call_id: String,
    /// Why (shown to the model when denied).
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq approve` / `agentq deny`
pub async fn decide(args: DecideArgs, approve: bool) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let body = ApprovalRequest {
        tool_call_id: args.tool_call_id.clone(),
        approve,
        reason: args.reason.clone(),
    };
    let (_, resp): (u16, ApprovalResponse) = api
        .post(&format!("/v1/sessions/{}/approvals", args.id), &body)
        .await?;
    let verb = if approve { "approved" } else { "denied" };
    let resumed = resp.resumed;
    println!(
        "{verb} {} of {}{}",
        args.tool_call_id,
        args.id,
        if resumed { "; the session resumes" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct SendArgs {
    pub id: String,
    /// The message.
    pub content: String,
    /// inject (next step), enqueue (after it finishes), interrupt (stop the current
    /// turn), reject (refuse while it runs).
    #[arg(long, default_value = "inject", value_parser = ["inject", "enqueue", "interrupt", "reject"])]
    pub strategy: String,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq send ID "message"`: steer a session, or start a follow-up turn.
pub async fn send(args: SendArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let strategy = Strategy::parse(&args.strategy)
        .ok_or_else(|| anyhow!("unknown strategy `{}`", args.strategy))?;
    let (_, resp): (u16, PostMessageResponse) = api
        .post(
            &format!("/v1/sessions/{}/messages", args.id),
            &PostMessage {
                content: args.content.clone(),
                strategy,
            },
        )
        .await?;
    println!("{}: delivered as {}", args.id, resp.delivery);
    Ok(ExitCode::SUCCESS)
}
