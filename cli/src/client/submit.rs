//! `agentq submit`: one prompt or a JSON Lines file of sessions (sent in batches the
//! server takes), the flags filling the fields a line leaves out, `--input` files added,
//! and with `--wait` the outcome of each session.

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use serde_json::{Map, Value, json};

use agentq_api::{BatchResponse, SessionRef};
use agentq_core::{Completion, SessionStatus};

use super::api::{Api, ApiArgs, ApiFailure};
use super::show::truncate;
use super::wait::{subscribe_done, wait_for};
use crate::inputs::collect_inputs;

/// Items per `POST /v1/sessions/batch` (the server's default limit).
const BATCH_CHUNK: usize = 10_000;

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
pub(super) fn parse_jsonl(
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
        let files = collect_inputs(&args.input, &args.input_dir)?;
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

/// Bytes of one batch the client sends at most: the server's body limit, less room for
/// the array's commas and brackets.
const BATCH_BYTES: usize = agentq_scheduler::BATCH_BODY_LIMIT - 1024 * 1024;

/// `items` in consecutive batches of at most [`BATCH_CHUNK`] items and [`BATCH_BYTES`]
/// bytes, each with the offset of its first item.
pub(super) fn batch_chunks<T: Serialize>(items: &[T]) -> anyhow::Result<Vec<(usize, &[T])>> {
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

/// Which items of a failed batch were already submitted, so the user can resume.
pub(super) fn batch_error(e: anyhow::Error, offset: usize, submitted: usize) -> anyhow::Error {
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
