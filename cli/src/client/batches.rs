//! `agentq batch`: batches as objects of the API (`/v1/batches`). `submit` streams a JSON
//! Lines file to the server as it reads it (any size: the server reads it as a stream
//! too) and, with `--wait`, follows the batch with a live progress line (done, failed,
//! running, tokens, cost, ETA); `status` shows it, `results` writes its results as JSON
//! Lines following the cursor to the end, `cancel` cancels what has not finished, `list`
//! lists the caller's batches. (`submit --file` is the other way to send many sessions:
//! it sends them through `POST /v1/sessions/batch`, `client::batch`.)

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt;

use agentq_api::{
    BatchList, BatchStatus, BatchView, JSONL_CONTENT_TYPE, NEXT_HEADER, RESULTS_HEADER, ResultsEnd,
};

use super::api::{Api, ApiArgs, ApiFailure, encode};
use super::show::{pretty, print_table, shell_word};
use super::submit::parse_metadata;
use crate::progress::Progress;

/// How often `--wait` reads the batch.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// Without a terminal: a progress line this often.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// Results asked for per page.
const RESULTS_PAGE: u32 = 1_000;
/// Bytes read from the file per piece of the upload.
const PIECE: usize = 256 * 1024;

pub const EXAMPLES: &str = "Examples:
  agentq batch submit tasks.jsonl --max-running 50 --wait   # live progress, then the summary
  agentq batch submit tasks.jsonl --metadata run=nightly    # prints the batch id
  agentq batch status BATCH_ID                              # counts, tokens, cost, ETA (JSON)
  agentq batch results BATCH_ID > out.jsonl                 # custom_id, id, status, result, usage, error
  agentq batch cancel BATCH_ID
  agentq batch list";

#[derive(Args, Debug)]
pub struct BatchArgs {
    #[command(subcommand)]
    pub command: BatchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BatchCommand {
    /// Submit a JSON Lines file of session requests as one batch; prints its id.
    #[command(after_help = SUBMIT_EXAMPLES)]
    Submit(SubmitBatchArgs),
    /// Show a batch: counts by status and finish reason, tokens, cost, times, ETA (JSON).
    #[command(after_help = STATUS_EXAMPLES)]
    Status(BatchIdArgs),
    /// Write the results of a batch's finished sessions as JSON Lines, in order.
    #[command(after_help = RESULTS_EXAMPLES)]
    Results(ResultsArgs),
    /// Cancel every session of a batch that has not finished.
    #[command(after_help = CANCEL_EXAMPLES)]
    Cancel(BatchIdArgs),
    /// List your batches, newest first.
    #[command(after_help = LIST_EXAMPLES)]
    List(ListArgs),
}

const SUBMIT_EXAMPLES: &str = "Examples:
  agentq batch submit tasks.jsonl --max-running 50 --wait
  agentq batch submit tasks.jsonl --metadata team=support --metadata run=7
  generate-tasks | agentq batch submit -
Each line is a session request as `agentq submit --file` takes one (prompt, model, tools,
queue, metadata, …), with an optional \"custom_id\" (unique in the batch) that comes back
with its result:
  {\"custom_id\": \"ticket-17\", \"prompt\": \"Summarise ticket 17\", \"max_iterations\": 5}";

const STATUS_EXAMPLES: &str = "Examples:
  agentq batch status BATCH_ID
  agentq batch status BATCH_ID | jq .counts";

const RESULTS_EXAMPLES: &str = "Examples:
  agentq batch results BATCH_ID > out.jsonl
  agentq batch results BATCH_ID --wait > out.jsonl          # until every session finished
  agentq batch results BATCH_ID --after SESSION_ID >> out.jsonl   # resume where it stopped";

const CANCEL_EXAMPLES: &str = "Examples:
  agentq batch cancel BATCH_ID";

const LIST_EXAMPLES: &str = "Examples:
  agentq batch list
  agentq batch list --limit 100 --json";

#[derive(Args, Debug)]
pub struct SubmitBatchArgs {
    /// The JSON Lines file (`-` for stdin): one session request a line.
    pub file: PathBuf,
    /// At most this many of the batch's sessions run at once (1 to 1000000).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(agentq_api::MAX_BATCH_RUNNING)))]
    pub max_running: Option<u32>,
    /// A metadata entry of the batch, `KEY=VALUE` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_metadata)]
    pub metadata: Vec<(String, String)>,
    /// Follow the batch until every session finished, with a live progress line on
    /// stderr; exit 1 when one failed or was cancelled.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this many seconds (exit 1).
    #[arg(long, requires = "wait")]
    pub wait_timeout: Option<u64>,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct BatchIdArgs {
    /// The batch's id (printed by `agentq batch submit`).
    pub id: String,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct ResultsArgs {
    /// The batch's id.
    pub id: String,
    /// Start after this session (the last id a previous run wrote).
    #[arg(long, value_name = "SESSION_ID")]
    pub after: Option<String>,
    /// When a session has not finished yet, wait for it instead of stopping there.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Continue after this batch id (printed by the previous page).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq batch …`
pub async fn batch(args: BatchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BatchCommand::Submit(a) => submit(a).await,
        BatchCommand::Status(a) => {
            let api = Api::new(&a.api)?;
            let view: BatchView = api.get(&batch_path(&a.id, "")).await?;
            println!("{}", pretty(&view)?);
            Ok(ExitCode::SUCCESS)
        }
        BatchCommand::Results(a) => results(a).await,
        BatchCommand::Cancel(a) => cancel(a).await,
        BatchCommand::List(a) => list(a).await,
    }
}

fn batch_path(id: &str, tail: &str) -> String {
    format!("/v1/batches/{}{tail}", encode(id))
}

/// `agentq batch submit FILE`
async fn submit(args: SubmitBatchArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let shown = args.file.display().to_string();
    let mut q = Vec::new();
    if let Some(n) = args.max_running {
        q.push(format!("max_running={n}"));
    }
    if !args.metadata.is_empty() {
        let meta: Map<String, Value> = args
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        q.push(format!(
            "metadata={}",
            encode(&Value::Object(meta).to_string())
        ));
    }
    let path = if q.is_empty() {
        "/v1/batches".to_string()
    } else {
        format!("/v1/batches?{}", q.join("&"))
    };
    let body = upload_body(&args.file).await?;
    let (_, view): (u16, BatchView) = api
        .post_stream(&path, JSONL_CONTENT_TYPE, body)
        .await
        .map_err(|e| upload_error(e, &shown))?;
    println!("{}", view.id);
    eprintln!(
        "batch {}: {} sessions (agentq batch status {})",
        view.id,
        view.total,
        shell_word(&view.id)
    );
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    follow(&api, view, args.wait_timeout.map(Duration::from_secs)).await
}

/// The file (or stdin) as a body sent as it is read.
async fn upload_body(file: &std::path::Path) -> anyhow::Result<reqwest::Body> {
    let reader: Box<dyn tokio::io::AsyncRead + Send + Unpin> = if file.as_os_str() == "-" {
        Box::new(tokio::io::stdin())
    } else {
        Box::new(
            tokio::fs::File::open(file)
                .await
                .with_context(|| format!("cannot read {}", file.display()))?,
        )
    };
    let pieces = futures::stream::unfold(reader, |mut r| async move {
        let mut buf = vec![0u8; PIECE];
        match r.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(buf), r))
            }
            Err(e) => Some((Err(e), r)),
        }
    });
    Ok(reqwest::Body::wrap_stream(pieces))
}

/// A refused upload's error, named where the user wrote it: the server names a line
/// (`line 17.mode`), the user reads `tasks.jsonl:17` and the field; an option is named
/// by its flag.
fn upload_error(e: anyhow::Error, file: &str) -> anyhow::Error {
    let mut f = match e.downcast::<ApiFailure>() {
        Ok(f) => f,
        Err(e) => return e,
    };
    let Some(field) = f.field.clone() else {
        return anyhow::Error::new(f);
    };
    if let Some(rest) = field.strip_prefix("line ") {
        let (n, tail) = rest.split_once('.').unwrap_or((rest, ""));
        f.field = (!tail.is_empty()).then(|| tail.to_string());
        return anyhow::Error::new(f).context(format!("{file}:{n}"));
    }
    let flag = match field.as_str() {
        "max_running" => Some("--max-running"),
        f if f == "metadata" || f.starts_with("metadata.") => Some("--metadata"),
        _ => None,
    };
    match flag {
        Some(flag) => anyhow::Error::new(f).context(flag),
        None => anyhow::Error::new(f),
    }
}

/// `12/20 done · 2 failed · 3 running · 15234 tokens · $0.0123 · ETA 1m20s`
fn progress_line(v: &BatchView) -> String {
    let c = &v.counts;
    let done = c
        .completed
        .saturating_add(c.failed)
        .saturating_add(c.cancelled);
    let tokens = v.usage.input_tokens.saturating_add(v.usage.output_tokens);
    let cost = v
        .cost_usd
        .map(|c| format!(" · ${c:.4}"))
        .unwrap_or_default();
    let eta = v
        .eta_secs
        .map(|s| format!(" · ETA {}", duration(s)))
        .unwrap_or_default();
    format!(
        "{done}/{} done · {} failed · {} running · {tokens} tokens{cost}{eta}",
        v.total, c.failed, c.running
    )
}

/// `45s`, `3m20s`, `1h02m`.
fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn finished(v: &BatchView) -> bool {
    matches!(v.status, BatchStatus::Completed | BatchStatus::Cancelled)
}

/// Follow the batch until it finished (or `timeout`), with a progress line.
async fn follow(
    api: &Api,
    mut view: BatchView,
    timeout: Option<Duration>,
) -> anyhow::Result<ExitCode> {
    let progress = Progress::new(view.total, true, PLAIN_EVERY);
    let t0 = Instant::now();
    let path = batch_path(&view.id, "");
    loop {
        let c = &view.counts;
        let done = c
            .completed
            .saturating_add(c.failed)
            .saturating_add(c.cancelled);
        progress.update(done, &progress_line(&view), t0.elapsed());
        if finished(&view) || timeout.is_some_and(|t| t0.elapsed() >= t) {
            break;
        }
        tokio::time::sleep(POLL_EVERY).await;
        view = api.get(&path).await?;
    }
    progress.finish();
    eprintln!(
        "batch {}: {} ({:.1}s)",
        view.id,
        progress_line(&view),
        t0.elapsed().as_secs_f64()
    );
    if !finished(&view) {
        eprintln!(
            "agentq: gave up waiting; the batch goes on (agentq batch status {})",
            shell_word(&view.id)
        );
        return Ok(ExitCode::from(1));
    }
    eprintln!(
        "results: agentq batch results {} > results.jsonl",
        shell_word(&view.id)
    );
    let c = &view.counts;
    Ok(if c.failed == 0 && c.cancelled == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `agentq batch results ID`: every page to stdout, following the cursor.
async fn results(args: ResultsArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let mut after = args.after.clone();
    let mut written: u64 = 0;
    let mut out = std::io::stdout().lock();
    loop {
        let mut path = batch_path(&args.id, &format!("/results?limit={RESULTS_PAGE}"));
        if let Some(a) = &after {
            path.push_str(&format!("&after={}", encode(a)));
        }
        let (body, headers) = api.get_page(&path).await?;
        out.write_all(&body)?;
        out.flush()?;
        written = written.saturating_add(body.iter().filter(|b| **b == b'\n').count() as u64);
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        if let Some(next) = header(NEXT_HEADER) {
            after = Some(next);
        }
        let end = header(RESULTS_HEADER)
            .as_deref()
            .and_then(ResultsEnd::parse)
            .ok_or_else(|| anyhow!("unexpected answer from the API: no {RESULTS_HEADER} header"))?;
        match end {
            ResultsEnd::Complete => return Ok(ExitCode::SUCCESS),
            ResultsEnd::More => {}
            ResultsEnd::Waiting if args.wait => tokio::time::sleep(POLL_EVERY).await,
            ResultsEnd::Waiting => {
                let resume = after
                    .as_deref()
                    .map(|a| format!(" --after {}", shell_word(a)))
                    .unwrap_or_default();
                eprintln!(
                    "agentq: {written} results written; the next session has not finished: \
                     resume with `agentq batch results {}{resume}` (or add --wait)",
                    shell_word(&args.id)
                );
                return Ok(ExitCode::from(1));
            }
        }
    }
}

/// `agentq batch cancel ID`
async fn cancel(args: BatchIdArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let (status, view): (u16, BatchView) = api
        .post(&batch_path(&args.id, "/cancel"), &json!({}))
        .await?;
    println!("{}", pretty(&view)?);
    let stopping = if status == 202 {
        format!("; {} running stop at their next step", view.counts.running)
    } else {
        String::new()
    };
    eprintln!(
        "batch {}: {} cancelled{stopping}",
        view.id, view.counts.cancelled
    );
    Ok(ExitCode::SUCCESS)
}

/// `agentq batch list`
async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let mut path = format!("/v1/batches?limit={}", args.limit);
    if let Some(c) = &args.cursor {
        path.push_str(&format!("&cursor={}", encode(c)));
    }
    let page: BatchList = api.get(&path).await?;
    if args.json {
        println!("{}", pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 6]> = page
        .batches
        .iter()
        .map(|b| {
            let c = &b.counts;
            let done = c
                .completed
                .saturating_add(c.failed)
                .saturating_add(c.cancelled);
            let status = serde_json::to_value(b.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            [
                b.id.clone(),
                status,
                format!("{done}/{}", b.total),
                c.failed.to_string(),
                b.usage
                    .input_tokens
                    .saturating_add(b.usage.output_tokens)
                    .to_string(),
                b.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            ]
        })
        .collect();
    print_table(
        &["ID", "STATUS", "DONE", "FAILED", "TOKENS", "CREATED (UTC)"],
        &rows,
    );
    if let Some(next) = &page.next_cursor {
        eprintln!("more: agentq batch list --cursor {next}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(45), "45s");
        assert_eq!(duration(200), "3m20s");
        assert_eq!(duration(3_720), "1h02m");
    }

    #[test]
    fn a_refused_line_is_named_in_the_file() {
        let failure = |field: &str| {
            anyhow::Error::new(ApiFailure {
                status: 422,
                code: "invalid_field".into(),
                message: "unknown variant".into(),
                field: Some(field.into()),
            })
        };
        let e = upload_error(failure("line 17.mode"), "tasks.jsonl");
        let shown = format!("{e:#}");
        assert!(
            shown.starts_with("tasks.jsonl:17: unknown variant (field `mode`)"),
            "{shown}"
        );
        let e = upload_error(failure("line 3"), "-");
        assert!(
            format!("{e:#}").starts_with("-:3: unknown variant ["),
            "{e:#}"
        );
        let e = upload_error(failure("max_running"), "t.jsonl");
        assert!(format!("{e:#}").starts_with("--max-running: "), "{e:#}");
        let e = upload_error(failure("metadata.token"), "t.jsonl");
        assert!(format!("{e:#}").starts_with("--metadata: "), "{e:#}");
    }
}
