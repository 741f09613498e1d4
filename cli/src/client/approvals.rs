//! `agentq approvals list`: the tool calls the caller's sessions hold for a human
//! decision, across sessions (`GET /v1/approvals`), with the commands that decide them.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use agentq_api::ApprovalList;

use super::api::{Api, ApiArgs, encode};
use super::show::{one_line, pretty, print_table, shell_word};

pub const EXAMPLES: &str = "Examples:
  agentq approvals list                         # oldest first, with the commands to decide
  agentq approvals list --tool write_file --queue review
  agentq approvals list --batch 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d --json";

#[derive(Args, Debug)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    pub command: ApprovalsCommand,
}

#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// List the calls your sessions hold for a decision, oldest session first.
    #[command(after_help = EXAMPLES)]
    List(ListApprovalsArgs),
}

#[derive(Args, Debug)]
pub struct ListApprovalsArgs {
    /// Only sessions of this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only sessions of this batch.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
    /// Only calls of this tool (its exact name).
    #[arg(long)]
    pub tool: Option<String>,
    /// Only this session's calls.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// 1 to 100.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Go on from the `next` cursor the previous page printed.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq approvals …`
pub async fn approvals(args: ApprovalsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ApprovalsCommand::List(args) => list(args).await,
    }
}

async fn list(args: ListApprovalsArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let mut q = vec![format!("limit={}", args.limit)];
    let mut more = Vec::new();
    for (name, flag, v) in [
        ("queue", "--queue", &args.queue),
        ("batch_id", "--batch", &args.batch),
        ("tool", "--tool", &args.tool),
        ("session_id", "--session", &args.session),
    ] {
        if let Some(v) = v {
            q.push(format!("{name}={}", encode(v)));
            more.push(format!("{flag} {}", shell_word(v)));
        }
    }
    if let Some(c) = &args.cursor {
        q.push(format!("cursor={}", encode(c)));
    }
    let page: ApprovalList = api.get(&format!("/v1/approvals?{}", q.join("&"))).await?;
    if args.json {
        println!("{}", pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<[String; 6]> = page
        .approvals
        .iter()
        .map(|a| {
            [
                a.session_id.clone(),
                a.tool_call_id.clone(),
                a.tool.clone(),
                one_line(&a.arguments.to_string(), 60),
                a.requested_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                a.deadline
                    .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print_table(
        &[
            "SESSION",
            "CALL",
            "TOOL",
            "ARGUMENTS",
            "REQUESTED (UTC)",
            "DEADLINE (UTC)",
        ],
        &rows,
    );
    if let Some(first) = page.approvals.first() {
        eprintln!(
            "decide: agentq approve {} {} [--arguments JSON] | agentq deny {} {} --reason ...",
            first.session_id,
            shell_word(&first.tool_call_id),
            first.session_id,
            shell_word(&first.tool_call_id)
        );
    }
    if let Some(next) = &page.next_cursor {
        more.push(format!("--cursor {}", shell_word(next)));
        eprintln!("next: agentq approvals list {}", more.join(" "));
    }
    Ok(ExitCode::SUCCESS)
}
