//! The client commands — `agentq submit`, `status`, `cancel`, `sessions` — over the HTTP API
//! at `AGENTQ_API_URL` (or `api_url` of `agentq.toml`; default `http://127.0.0.1:7700`).
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
use serde_json::{Map, Value, json};

use agentq_core::config::Config;
use agentq_core::queue::DONE_CHANNEL;
use agentq_core::{Completion, SessionStatus};

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
    #[arg(long)]
    pub system: Option<String>,
    /// Submitting again with the same key returns the existing session.
    #[arg(long, conflicts_with = "file")]
    pub idempotency_key: Option<String>,
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
struct Api {
    base: String,
    http: reqwest::Client,
}

/// A 4xx/5xx answer, with the server's error body.
#[derive(Debug)]
struct ApiFailure {
    status: u16,
    code: String,
    message: String,
    field: Option<String>,
}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field `{field}`)")?;
        }
        write!(f, " [HTTP {} {}]", self.status, self.code)
    }
}

impl std::error::Error for ApiFailure {}

impl Api {
    fn new(args: &ApiArgs) -> anyhow::Result<Api> {
        let base = match &args.api_url {
            Some(u) if !u.trim().is_empty() => u.clone(),
            _ => Config::load(None)?.api_url,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
        let resp = req.send().await.map_err(|e| self.transport_error(e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.transport_error(e))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status >= 400 {
            let err = &body["error"];
            let message = err["message"]
                .as_str()
                .map(str::to_string)
                .or_else(|| body.as_str().map(|s| s.trim().to_string()))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "no details".to_string());
            return Err(ApiFailure {
                status,
                code: err["code"].as_str().unwrap_or("error").to_string(),
                message,
                field: err["field"].as_str().map(str::to_string),
            }
            .into());
        }
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

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        Ok(self
            .send(self.http.get(format!("{}{path}", self.base)))
            .await?
            .1)
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(u16, Value)> {
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
        put("system", self.system.clone().map(Value::from));
        put(
            "idempotency_key",
            self.idempotency_key.clone().map(Value::from),
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

    let ids: Vec<String> = if let Some(file) = &args.file {
        let name = file.display().to_string();
        let items = parse_jsonl(&read_source(file)?, &name, &args.defaults())?;
        let mut ids = Vec::with_capacity(items.len());
        for (i, chunk) in items.chunks(BATCH_CHUNK).enumerate() {
            let (_, body) = api
                .post("/v1/sessions/batch", &Value::Array(chunk.to_vec()))
                .await
                .map_err(|e| batch_error(e, i * BATCH_CHUNK, ids.len()))?;
            let sessions = body["sessions"]
                .as_array()
                .ok_or_else(|| anyhow!("unexpected answer from the API: {body}"))?;
            for s in sessions {
                let id = s["id"]
                    .as_str()
                    .ok_or_else(|| anyhow!("unexpected answer from the API: {s}"))?;
                println!("{id}");
                ids.push(id.to_string());
            }
        }
        ids
    } else {
        let prompt = match args.prompt.as_deref() {
            Some("-") => read_source(std::path::Path::new("-"))?,
            Some(p) => p.to_string(),
            None => bail!("a prompt or --file is required"),
        };
        let mut body = args.defaults();
        body.insert("prompt".into(), Value::String(prompt));
        let (status, resp) = api.post("/v1/sessions", &Value::Object(body)).await?;
        let id = resp["id"]
            .as_str()
            .ok_or_else(|| anyhow!("unexpected answer from the API: {resp}"))?
            .to_string();
        if args.wait {
            // The result goes to stdout; keep the id off it.
            eprintln!("submitted {id}");
        } else {
            println!("{id}");
            if status == 200 {
                eprintln!(
                    "(existing session for this idempotency key: {})",
                    resp["status"].as_str().unwrap_or("?")
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
    let url = match Config::load(None) {
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
            let view = api.get(&format!("/v1/sessions/{id}")).await?;
            if let Some(c) = completion_from_view(&view) {
                pending.remove(&id);
                results.insert(id, c);
            }
        }
    }
    Ok(results)
}

/// A `Completion` from `GET /v1/sessions/{id}` once the session is terminal.
fn completion_from_view(v: &Value) -> Option<Completion> {
    let status = SessionStatus::parse(v["status"].as_str()?)?;
    if !status.is_terminal() {
        return None;
    }
    let mut c = json!({
        "session_id": v["id"],
        "status": v["status"],
        "finish_reason": v["finish_reason"],
        "result": v["result"],
        "error": v["error"],
        "iterations": v["iterations"],
        "usage": {
            "input_tokens": v["usage"]["input_tokens"].as_u64().unwrap_or(0),
            "output_tokens": v["usage"]["output_tokens"].as_u64().unwrap_or(0),
        },
        "parent_id": v["parent_id"],
    });
    if c["iterations"].is_null() {
        c["iterations"] = json!(0);
    }
    serde_json::from_value(c).ok()
}

/// `agentq status ID`
pub async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let view = api.get(&format!("/v1/sessions/{}", args.id)).await?;
    println!("{}", serde_json::to_string_pretty(&view)?);
    Ok(ExitCode::SUCCESS)
}

/// `agentq cancel ID`
pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    match api
        .post(&format!("/v1/sessions/{}/cancel", args.id), &json!({}))
        .await
    {
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
    let body = api.get(&format!("/v1/sessions?{}", q.join("&"))).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    let empty = Vec::new();
    let rows: Vec<[String; 6]> = body["sessions"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|s| {
            let tokens = s["usage"]["input_tokens"].as_u64().unwrap_or(0)
                + s["usage"]["output_tokens"].as_u64().unwrap_or(0);
            let created = s["created_at"].as_str().unwrap_or("");
            [
                s["id"].as_str().unwrap_or("").to_string(),
                s["status"].as_str().unwrap_or("").to_string(),
                s["iterations"].as_u64().unwrap_or(0).to_string(),
                tokens.to_string(),
                created.get(..19).unwrap_or(created).replace('T', " "),
                truncate(&s["prompt"].as_str().unwrap_or("").replace('\n', " "), 50),
            ]
        })
        .collect();
    print_table(
        &["ID", "STATUS", "ITER", "TOKENS", "CREATED (UTC)", "PROMPT"],
        &rows,
    );
    if let Some(next) = body["next_cursor"].as_str() {
        eprintln!("more: agentq sessions --cursor {next}");
    }
    Ok(ExitCode::SUCCESS)
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
fn encode(s: &str) -> String {
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

    #[test]
    fn completion_from_a_terminal_view() {
        let v = json!({"id": "s1", "status": "completed", "finish_reason": "stop",
                       "result": "42", "error": null, "iterations": 2,
                       "usage": {"input_tokens": 5, "output_tokens": 7}, "parent_id": null});
        let c = completion_from_view(&v).unwrap();
        assert_eq!(c.session_id, "s1");
        assert_eq!(c.result.as_deref(), Some("42"));
        assert_eq!(c.usage.output_tokens, 7);
        assert!(completion_from_view(&json!({"id": "s1", "status": "running"})).is_none());
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
    }
}

#[derive(Args, Debug)]
pub struct DecideArgs {
    /// The session holding the call.
    pub id: String,
    /// The held tool call's id (see `agentq status ID` / the session's messages).
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
    let mut body = json!({"tool_call_id": args.tool_call_id, "approve": approve});
    if let Some(r) = &args.reason {
        body["reason"] = Value::from(r.clone());
    }
    let (_, resp) = api
        .post(&format!("/v1/sessions/{}/approvals", args.id), &body)
        .await?;
    let verb = if approve { "approved" } else { "denied" };
    let resumed = resp["resumed"].as_bool().unwrap_or(false);
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
    let (_, resp) = api
        .post(
            &format!("/v1/sessions/{}/messages", args.id),
            &json!({"content": args.content, "strategy": args.strategy}),
        )
        .await?;
    println!(
        "{}: delivered as {}",
        args.id,
        resp["delivery"].as_str().unwrap_or(&args.strategy)
    );
    Ok(ExitCode::SUCCESS)
}
