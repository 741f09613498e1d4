//! The commands that read sessions: `agentq status ID` (one session, and the calls it
//! holds) and `agentq sessions` (a page of them as a table).

use std::process::ExitCode;

use clap::Args;

use agentq_api::{ListResponse, SessionDetail, SessionView};
use agentq_core::SessionStatus;

use super::api::{Api, ApiArgs, encode};
use super::show::{one_line, pending_lines, pretty, print_table, shell_word, truncate};

#[derive(Args, Debug)]
pub struct StatusArgs {
    pub id: String,
    #[command(flatten)]
    pub api: ApiArgs,
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

const SESSIONS_EXAMPLES: &str = "Examples:
  agentq sessions --status running
  agentq sessions --batch 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --status failed
  agentq sessions --batch 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --limit 1000 --json > batch.json";

#[derive(Args, Debug)]
#[command(after_help = SESSIONS_EXAMPLES)]
pub struct SessionsArgs {
    /// queued, running, waiting, awaiting_approval, completed, failed or cancelled.
    #[arg(long)]
    pub status: Option<String>,
    /// Only the sessions of this batch (the id `submit --file/--each` prints); the table
    /// then shows why each finished and its error.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
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

/// `agentq sessions`
pub async fn sessions(args: SessionsArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let mut q = vec![format!("limit={}", args.limit)];
    let mut more = Vec::new();
    for (name, flag, v) in [
        ("status", "--status", &args.status),
        ("batch_id", "--batch", &args.batch),
    ] {
        if let Some(v) = v {
            q.push(format!("{name}={}", encode(v)));
            more.push(format!("{flag} {}", shell_word(v)));
        }
    }
    if let Some(c) = &args.cursor {
        q.push(format!("cursor={}", encode(c)));
    }
    let body: ListResponse = api.get(&format!("/v1/sessions?{}", q.join("&"))).await?;
    if args.json {
        println!("{}", pretty(&body)?);
        return Ok(ExitCode::SUCCESS);
    }
    // Why a session ended matters most where sessions have ended: a batch, or a listing
    // of finished ones.
    let finished = args
        .status
        .as_deref()
        .and_then(SessionStatus::parse)
        .is_some_and(|s| s.is_terminal());
    if args.batch.is_some() || finished {
        let rows: Vec<[String; 7]> = body.sessions.iter().map(outcome_row).collect();
        print_table(
            &[
                "ID",
                "STATUS",
                "REASON",
                "ITER",
                "TOKENS",
                "CREATED (UTC)",
                "ERROR",
            ],
            &rows,
        );
    } else {
        let rows: Vec<[String; 6]> = body.sessions.iter().map(table_row).collect();
        print_table(
            &["ID", "STATUS", "ITER", "TOKENS", "CREATED (UTC)", "PROMPT"],
            &rows,
        );
    }
    if let Some(next) = &body.next_cursor {
        more.push(format!("--cursor {next}"));
        eprintln!("more: agentq sessions {}", more.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}

/// ID, STATUS, REASON, ITER, TOKENS, CREATED (UTC), ERROR.
pub(super) fn outcome_row(s: &SessionView) -> [String; 7] {
    let [id, status, iter, tokens, created, _] = table_row(s);
    let reason = s.finish_reason.map(|r| r.to_string()).unwrap_or_default();
    let error = s
        .error
        .as_deref()
        .map(|e| one_line(e, 80))
        .unwrap_or_default();
    [id, status, reason, iter, tokens, created, error]
}

/// ID, STATUS, ITER, TOKENS, CREATED (UTC), PROMPT.
pub(super) fn table_row(s: &SessionView) -> [String; 6] {
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
