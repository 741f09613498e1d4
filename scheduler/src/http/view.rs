//! A session's row as the API shows it, and the calls it holds for a decision.

use agentq_agent::schema::ToolCall;
use agentq_api::{PendingApproval, SessionView};
use agentq_core::{SessionRow, SessionStatus, WaitReason};

/// The view of a row: its spec's fields beside its state. Its `model` is the one the
/// session runs on once a worker has chosen it (a request that names none gets that
/// worker's default), the requested one (or none) before.
pub fn session_view(row: &SessionRow) -> SessionView {
    let mut spec = row.spec.clone();
    if let Some(m) = &row.model_used {
        spec.model = Some(m.clone());
    }
    SessionView {
        spec,
        id: row.id.clone(),
        status: row.status,
        finish_reason: row.finish_reason,
        result: row.result.clone(),
        error: row.error.clone(),
        iterations: row.iteration,
        usage: row.usage,
        parent_id: row.parent_id.clone(),
        root_id: row.root_id.clone(),
        depth: row.depth,
        queue: row.queue.clone(),
        cancel_requested: row.cancel_requested,
        attempts: row.attempts,
        takeovers: row.takeovers,
        lease_owner: row.lease_owner.clone(),
        idempotency_key: row.idempotency_key.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        finished_at: row.finished_at,
        priority: row.priority,
        batch_id: row.batch_id.clone(),
        wait_reason: wait_reason(row),
        wake_at: row.wake_at.filter(|_| row.status == SessionStatus::Waiting),
        forked_from: row.forked_from.clone(),
        fork_at: row.fork_at,
    }
}

/// What a suspended session waits for. A row suspended before reasons were stored waited
/// for its children or for a human, as its status says; a running or finished one waits
/// for nothing, whatever its last suspension left in the row.
pub fn wait_reason(row: &SessionRow) -> Option<WaitReason> {
    match row.status {
        SessionStatus::Waiting => Some(row.wait_reason.unwrap_or(WaitReason::Children)),
        SessionStatus::AwaitingApproval => Some(WaitReason::Approval),
        _ => None,
    }
}

/// A call `row` holds for a decision, as the API shows it: the session's deadline applies
/// to every call it holds.
pub fn pending_approval(row: &SessionRow, call: ToolCall) -> PendingApproval {
    PendingApproval {
        tool_call_id: call.id,
        tool: call.name,
        arguments: call.arguments.value(),
        deadline: row.approval_deadline,
    }
}
