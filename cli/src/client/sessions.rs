//! The commands that read sessions: `agentq status ID` (one session, and the calls it
//! holds) and `agentq sessions` (a page of them as a table).

use std::process::ExitCode;

use clap::Args;

use agentq_api::{ListResponse, SessionDetail, SessionView};

use super::api::{Api, ApiArgs, encode};
use super::show::{pending_lines, pretty, truncate};

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
