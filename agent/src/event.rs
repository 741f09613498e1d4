//! Events a running session emits, in order, as they happen. The CLI prints them, the
//! worker forwards them to the session's event stream.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::schema::{Arguments, Usage};
use crate::spec::ExitReason;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    IterationStarted {
        iteration: u32,
    },
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        text: String,
    },
    ToolCall {
        id: String,
        name: String,
        #[schema(value_type = Value)]
        arguments: Arguments,
    },
    ToolResult {
        id: String,
        name: String,
        content: String,
        is_error: bool,
    },
    /// A sensitive call is held until a human decides on it; the session suspends once
    /// the calls of its round are done. Emitted once per call, by the run that first held
    /// it, at the position of the response that made it (or later, when that response was
    /// committed by a run before this one).
    ApprovalRequested {
        id: String,
        name: String,
        #[schema(value_type = Value)]
        arguments: Arguments,
    },
    /// A run found the decision on a call it asked a human about: approved, or not (with
    /// the reason the model is told: the reviewer's, or `timeout`). Emitted by the host's
    /// approver when the call is checked again, before it runs or gets its denial.
    ApprovalDecided {
        id: String,
        name: String,
        approved: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    IterationCompleted {
        iteration: u32,
        usage: Usage,
    },
    SessionCompleted {
        finish_reason: ExitReason,
        result: Option<String>,
        error: Option<String>,
        iterations: u32,
        usage: Usage,
    },
    Error {
        message: String,
        /// Whether the loop will try again.
        retrying: bool,
    },
    /// The session gave up its slot to wait without a lease: `reason` is `rate_limit`
    /// (woken by itself at `wake_at`) or `budget` (woken when the budget is raised).
    /// Emitted by the host as the run suspends.
    SessionWaiting {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wake_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// The next LLM call waits `wait_ms` for a rate limit before it starts (or the
    /// session suspends, when that is longer than the host holds a slot for). `reason`:
    /// `rpm`, `tpm`, `concurrency` (a configured limit), or `provider` (a limit the
    /// provider announced or refused a call for).
    RateLimited {
        wait_ms: u64,
        reason: String,
    },
}

/// Where events go. Must not block: implementations buffer or drop.
///
/// `seq` is the position in the session's history of the message the event belongs to
/// (the assistant message being streamed, the tool result being added, or the history
/// length for session-level events). Together with an ordinal it gives every event a
/// stable id that survives a worker handover: events of a step that was never committed
/// belong to a `seq` the next worker will produce again.
pub trait EventSink: Send + Sync {
    fn emit(&self, seq: usize, event: AgentEvent);
}

/// Discards every event.
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _seq: usize, _event: AgentEvent) {}
}

/// Forwards events into an unbounded channel, dropping the position.
impl EventSink for tokio::sync::mpsc::UnboundedSender<AgentEvent> {
    fn emit(&self, _seq: usize, event: AgentEvent) {
        let _ = self.send(event);
    }
}

/// Forwards events with their position.
impl EventSink for tokio::sync::mpsc::UnboundedSender<(usize, AgentEvent)> {
    fn emit(&self, seq: usize, event: AgentEvent) {
        let _ = self.send((seq, event));
    }
}
