//! The commands that act on a session: `agentq cancel`, `agentq approve`/`deny` (decide a
//! held tool call) and `agentq send` (steer it, or start a follow-up turn).

use std::process::ExitCode;

use anyhow::anyhow;
use clap::Args;
use serde_json::json;

use agentq_api::{
    ApprovalRequest, ApprovalResponse, CancelResponse, PostMessage, PostMessageResponse,
};
use agentq_core::protocol::Strategy;

use super::api::{Api, ApiArgs, ApiFailure};

#[derive(Args, Debug)]
pub struct CancelArgs {
    pub id: String,
    #[command(flatten)]
    pub api: ApiArgs,
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
