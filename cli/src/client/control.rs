//! The commands that act on a session: `agentq cancel` (or on a batch: `--batch`),
//! `agentq approve`/`deny` (decide a held tool call) and `agentq send` (steer it, or
//! start a follow-up turn).

use std::process::ExitCode;

use anyhow::{anyhow, bail};
use clap::Args;
use serde_json::json;

use agentq_api::{
    ApprovalRequest, ApprovalResponse, BulkCancelResponse, CancelResponse, PostMessage,
    PostMessageResponse, SessionDetail, SessionFilter,
};
use agentq_core::protocol::Strategy;

use super::api::{Api, ApiArgs, ApiFailure};

const CANCEL_EXAMPLES: &str = "Examples:
  agentq cancel 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d
  agentq cancel --batch 0190c2d4-5e6f-7a8b-9c0d-1e2f3a4b5c6d";

#[derive(Args, Debug)]
#[command(after_help = CANCEL_EXAMPLES)]
pub struct CancelArgs {
    /// The session to cancel.
    #[arg(conflicts_with = "batch")]
    pub id: Option<String>,
    /// Cancel every unfinished session of this batch (the id `submit --file/--each`
    /// prints); running ones stop at their next step.
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq cancel ID` / `agentq cancel --batch ID`
pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let id = match (&args.id, &args.batch) {
        (_, Some(batch)) => return cancel_batch(&api, batch).await,
        (Some(id), None) => id,
        (None, None) => bail!("give the id of the session to cancel, or --batch ID"),
    };
    let answer: anyhow::Result<(u16, CancelResponse)> = api
        .post(&format!("/v1/sessions/{id}/cancel"), &json!({}))
        .await;
    match answer {
        Ok((202, _)) => {
            println!("cancel requested for {id} (running; its worker stops it at the next step)");
            Ok(ExitCode::SUCCESS)
        }
        Ok(_) => {
            println!("cancelled {id}");
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

/// Every page of `POST /v1/sessions/cancel` for the batch; exit 1 when nothing was left
/// to cancel (as for a session that already finished).
async fn cancel_batch(api: &Api, batch: &str) -> anyhow::Result<ExitCode> {
    let mut filter = SessionFilter {
        batch_id: Some(batch.to_string()),
        ..SessionFilter::default()
    };
    let (mut now, mut requested) = (0usize, 0usize);
    loop {
        let (_, page): (u16, BulkCancelResponse) = api.post("/v1/sessions/cancel", &filter).await?;
        for c in &page.sessions {
            if c.cancel_requested {
                requested = requested.saturating_add(1);
            } else {
                now = now.saturating_add(1);
            }
        }
        match page.next_cursor {
            // A cursor that does not move would page forever.
            Some(next) if filter.cursor.as_deref() != Some(next.as_str()) => {
                filter.cursor = Some(next);
            }
            _ => break,
        }
    }
    if now == 0 && requested == 0 {
        eprintln!("agentq: batch {batch} has no unfinished session");
        return Ok(ExitCode::from(1));
    }
    println!(
        "batch {batch}: cancelled {now}; cancel requested for {requested} running (their \
         workers stop them at the next step)"
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub struct DecideArgs {
    /// The session holding the call.
    pub id: String,
    /// The held tool call's id (`agentq status ID` lists the calls a session holds); may
    /// be left out when the session holds one call only.
    pub tool_call_id: Option<String>,
    /// Why (shown to the model when denied).
    #[arg(long)]
    pub reason: Option<String>,
    /// Approve only: run the call with these arguments (a JSON object) instead of the
    /// model's; they pass the same checks, and the transcript shows the edit.
    #[arg(long, value_name = "JSON")]
    pub arguments: Option<String>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq approve` / `agentq deny`
pub async fn decide(args: DecideArgs, approve: bool) -> anyhow::Result<ExitCode> {
    let arguments = match &args.arguments {
        None => None,
        Some(_) if !approve => anyhow::bail!("--arguments goes with approve only"),
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            Ok(_) => anyhow::bail!("--arguments must be a JSON object"),
            Err(e) => anyhow::bail!("--arguments is not JSON: {e}"),
        },
    };
    let api = Api::new(&args.api)?;
    let tool_call_id = match &args.tool_call_id {
        Some(call) => call.clone(),
        None => the_held_call(&api, &args.id).await?,
    };
    let body = ApprovalRequest {
        tool_call_id: tool_call_id.clone(),
        approve,
        reason: args.reason.clone(),
        arguments,
    };
    let (_, resp): (u16, ApprovalResponse) = api
        .post(&format!("/v1/sessions/{}/approvals", args.id), &body)
        .await?;
    let verb = if approve { "approved" } else { "denied" };
    let resumed = resp.resumed;
    println!(
        "{verb} {} of {}{}",
        tool_call_id,
        args.id,
        if resumed { "; the session resumes" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

/// The one call `id` holds for a decision; with none or several, the error says which to
/// name.
async fn the_held_call(api: &Api, id: &str) -> anyhow::Result<String> {
    let session: SessionDetail = api.get(&format!("/v1/sessions/{id}")).await?;
    let mut held = session
        .pending_approvals
        .iter()
        .map(|p| p.tool_call_id.clone());
    match (held.next(), held.next()) {
        (Some(call), None) => Ok(call),
        (None, _) => bail!("session {id} holds no tool call for a decision (`agentq status {id}`)"),
        (Some(_), Some(_)) => {
            let all: Vec<&str> = session
                .pending_approvals
                .iter()
                .map(|p| p.tool_call_id.as_str())
                .collect();
            bail!(
                "session {id} holds {} calls for a decision: name one ({})",
                all.len(),
                all.join(", ")
            )
        }
    }
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
