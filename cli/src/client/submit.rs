//! `agentq submit`: one prompt, a JSON Lines file of sessions, or one session per file a
//! glob matches (`--each`); the flags fill the fields a request leaves out, `--input`
//! files are added, a batch is sent under one batch id (`batch`), and with `--wait` the
//! outcome of each session.

use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Map, Value, json};

use agentq_api::SessionRef;
use agentq_core::{Completion, SessionStatus};

use super::api::{Api, ApiArgs};
use super::batch::{self, Item};
use super::each;
use super::show::truncate;
use super::wait::{subscribe_done, wait_for};
use crate::inputs::collect_inputs;

const EXAMPLES: &str = "Examples:
  agentq submit \"Summarise README.md\" --input README.md --wait
  agentq submit --each 'tickets/*.txt' \"Summarise the ticket in {file}\" \\
      --queue bulk --max-running 20 --metadata team=support --token-budget 50000 --wait
  agentq submit --file tasks.jsonl --priority 7 --timeout-secs 600
  agentq submit \"Clean up the repo\" --tools read_file,write_file --sensitive-tools write_file";

#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct SubmitArgs {
    /// The task for the agent (`-` reads it from stdin). With --each, `{file}` in it
    /// stands for the input file's path in the workspace (else a line naming it is added).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Wait for the session(s) to finish and print the result; for a batch, a live
    /// progress line on stderr (done, failed, running, tokens, cost).
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this many seconds (exit 1).
    #[arg(long, requires = "wait")]
    pub wait_timeout: Option<u64>,
    /// A JSON Lines file of sessions (one request object a line; `-` for stdin), submitted
    /// as one batch. The flags below fill fields a line leaves out.
    #[arg(long, conflicts_with = "each")]
    pub file: Option<PathBuf>,
    /// One session per file this glob matches (quote it: `'tickets/*.txt'`; `**` crosses
    /// directories), that file as its input and in `metadata.file`; one batch. Prints
    /// each session's id and file.
    #[arg(long, value_name = "GLOB")]
    pub each: Option<String>,
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
    /// Comma-separated tool names whose calls wait for `agentq approve`.
    #[arg(long, value_delimiter = ',', value_name = "TOOLS")]
    pub sensitive_tools: Option<Vec<String>>,
    /// A metadata entry, `KEY=VALUE` (repeatable); kept with the session and shown with it.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_metadata)]
    pub metadata: Vec<(String, String)>,
    /// Tokens (input + output) the session may spend, its sub-agents included.
    #[arg(long, value_name = "TOKENS")]
    pub token_budget: Option<u64>,
    /// Wall-clock limit of each session, from its first start.
    #[arg(long, value_name = "SECS")]
    pub timeout_secs: Option<u64>,
    /// A batch (--file, --each): at most this many of its sessions run at once.
    #[arg(long, value_name = "N")]
    pub max_running: Option<u32>,
    #[arg(long)]
    pub queue: Option<String>,
    /// 0 (lowest) to 9 (default 5): among waiting sessions, higher ones run first.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: Option<u8>,
    #[arg(long)]
    pub system: Option<String>,
    /// Submitting again with the same key returns the existing session.
    #[arg(long, conflicts_with_all = ["file", "each"])]
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

/// `--metadata KEY=VALUE`
pub(super) fn parse_metadata(v: &str) -> Result<(String, String), String> {
    match v.split_once('=') {
        Some((k, val)) if !k.trim().is_empty() => Ok((k.trim().to_string(), val.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {v:?}")),
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
        put(
            "sensitive_tools",
            self.sensitive_tools.clone().map(|t| json!(t)),
        );
        put("token_budget", self.token_budget.map(Value::from));
        put("timeout_secs", self.timeout_secs.map(Value::from));
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
        if !self.metadata.is_empty() {
            let entries: Map<String, Value> = self
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            m.insert("metadata".into(), Value::Object(entries));
        }
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
/// Each item is named by its line, from 1 (`tasks.jsonl:5`).
pub(super) fn parse_jsonl(
    text: &str,
    name: &str,
    defaults: &Map<String, Value>,
) -> anyhow::Result<Vec<Item>> {
    let mut items = Vec::new();
    for (n, line) in text.as_bytes().lines().enumerate() {
        let at = format!("{name}:{}", n.saturating_add(1));
        let line = line.with_context(|| format!("{at}: cannot read the line"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(&line).with_context(|| format!("{at}: not valid JSON"))?;
        let Value::Object(mut obj) = v else {
            bail!("{at}: expected a JSON object");
        };
        for (k, v) in defaults {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
        items.push(Item {
            origin: at,
            body: Value::Object(obj),
        });
    }
    if items.is_empty() {
        bail!("{name}: no sessions in the file");
    }
    Ok(items)
}

/// The prompt argument (`-` reads stdin).
fn prompt_text(args: &SubmitArgs) -> anyhow::Result<String> {
    match args.prompt.as_deref() {
        Some("-") => read_source(std::path::Path::new("-")),
        Some(p) => Ok(p.to_string()),
        None => bail!("a prompt or --file is required"),
    }
}

/// `agentq submit`
pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    if args.max_running.is_some() && args.file.is_none() && args.each.is_none() {
        bail!("--max-running: applies to a batch (--file or --each)");
    }
    if args.max_running == Some(0) {
        bail!("--max-running: must be at least 1");
    }
    let api = Api::new(&args.api)?;
    let mut defaults = args.defaults();
    let shared = if !args.input.is_empty() || !args.input_dir.is_empty() {
        collect_inputs(&args.input, &args.input_dir)?
    } else {
        Map::new()
    };
    let items = if let Some(pattern) = &args.each {
        let files = each::expand(pattern)?;
        each::requests(&files, &prompt_text(&args)?, &defaults, &shared)?
            .into_iter()
            .map(|(origin, body)| Item { origin, body })
            .collect()
    } else {
        if !shared.is_empty() {
            defaults.insert("files".into(), Value::Object(shared));
        }
        match &args.file {
            Some(file) => parse_jsonl(&read_source(file)?, &file.display().to_string(), &defaults)?,
            None => return submit_one(&api, &args, defaults).await,
        }
    };
    let sent = batch::send(&api, &items, args.max_running, args.each.is_some()).await?;
    if let Some(b) = &sent.batch_id {
        eprintln!(
            "batch {b}: {} sessions (agentq sessions --batch {b})",
            sent.ids.len()
        );
    }
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let timeout = args.wait_timeout.map(Duration::from_secs);
    let results = match &sent.batch_id {
        Some(b) => batch::wait(&api, b, &sent.ids, timeout).await?,
        // A server that predates batch ids: each session by itself.
        None => wait_for(&api, &sent.ids, None, timeout).await?,
    };
    Ok(report(&sent.ids, &results))
}

/// One prompt: one session.
async fn submit_one(
    api: &Api,
    args: &SubmitArgs,
    mut body: Map<String, Value>,
) -> anyhow::Result<ExitCode> {
    // Subscribe before submitting, so a session that finishes at once is not missed.
    let mut done = if args.wait {
        subscribe_done().await
    } else {
        None
    };
    body.insert("prompt".into(), Value::String(prompt_text(args)?));
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
        return Ok(ExitCode::SUCCESS);
    }
    let ids = vec![id];
    let timeout = args.wait_timeout.map(Duration::from_secs);
    let results = wait_for(api, &ids, done.as_mut(), timeout).await?;
    Ok(report(&ids, &results))
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
