//! The typed protocol between processes: what one process writes and another reads back,
//! whether through the store (inbox items), the signal channel (worker signals) or the
//! event streams (event kinds). Every producer builds these values and every consumer
//! parses them, so that a field renamed on one side cannot be silently read as empty on
//! the other.
//!
//! The wire forms are those deployed workers and schedulers already speak (inbox payload
//! keys, `wake:<id>` signals beside a bare id for cancel), so a rolling deploy can mix old
//! and new processes.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use agentq_agent::event::AgentEvent;
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Phase;

use crate::error::{Error, Result};
use crate::model::{InboxItem, SessionRow, SessionStatus, SpawnInfo};

/// What an inbox item is for; stored in the item's `kind` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxKind {
    /// A background (`wait: false`) child's final result, to inject into the parent.
    ChildResult,
    /// A foreground (`wait: true`) child finished: only wakes the parent, whose
    /// `spawn_agent` call then reads the child's row.
    ChildDone,
    /// A steering message to add at the next iteration boundary (`inject`, `interrupt`).
    Message,
    /// A steering message to run as a new turn once the session finishes (`enqueue`).
    Followup,
}

impl InboxKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            InboxKind::ChildResult => "child_result",
            InboxKind::ChildDone => "child_done",
            InboxKind::Message => "message",
            InboxKind::Followup => "followup",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "child_result" => InboxKind::ChildResult,
            "child_done" => InboxKind::ChildDone,
            "message" => InboxKind::Message,
            "followup" => InboxKind::Followup,
            _ => return None,
        })
    }
}

impl std::fmt::Display for InboxKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The payload of a `child_result` / `child_done` item: how a child ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildOutcome {
    pub child_id: String,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub tool_call_id: String,
    pub status: SessionStatus,
    #[serde(default)]
    pub finish_reason: Option<ExitReason>,
    #[serde(default)]
    pub result: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

impl ChildOutcome {
    /// `info`: how the child was spawned (its spec's metadata, which the caller has read).
    pub fn of(child: &SessionRow, info: SpawnInfo) -> Self {
        ChildOutcome {
            child_id: child.id.clone(),
            label: info.label,
            tool_call_id: info.tool_call_id,
            status: child.status,
            finish_reason: child.finish_reason,
            result: child.result.clone(),
            error: child.error.clone(),
        }
    }

    /// What the parent is told: the answer, or why there is none.
    pub fn text(&self) -> String {
        match self.result.as_deref() {
            Some(r) if !r.is_empty() => r.to_string(),
            _ => self.error.clone().unwrap_or_default(),
        }
    }
}

/// How a steering message is delivered to a session that has not finished.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Added at the next iteration boundary.
    #[default]
    Inject,
    /// Run as a new turn once the session finishes.
    Enqueue,
    /// Ends the current model call or tool round now, then added.
    Interrupt,
    /// Refused unless the session has finished.
    Reject,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [
        Strategy::Inject,
        Strategy::Enqueue,
        Strategy::Interrupt,
        Strategy::Reject,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::Inject => "inject",
            Strategy::Enqueue => "enqueue",
            Strategy::Interrupt => "interrupt",
            Strategy::Reject => "reject",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Strategy::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The inbox kind a message of this strategy is stored as.
    pub fn inbox_kind(self) -> InboxKind {
        match self {
            Strategy::Enqueue => InboxKind::Followup,
            _ => InboxKind::Message,
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The payload of a `message` / `followup` item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SteerMessage {
    pub content: String,
    #[serde(default)]
    pub strategy: Strategy,
}

/// One typed inbox payload: the kind decides which shape it has.
#[derive(Debug, Clone, PartialEq)]
pub enum InboxPayload {
    Child(ChildOutcome),
    Steer(SteerMessage),
}

impl InboxPayload {
    /// The payload as stored.
    pub fn to_value(&self) -> Result<serde_json::Value> {
        Ok(match self {
            InboxPayload::Child(c) => serde_json::to_value(c)?,
            InboxPayload::Steer(m) => serde_json::to_value(m)?,
        })
    }
}

impl InboxItem {
    /// The item's kind, if this process knows it (a newer writer may add kinds).
    pub fn kind(&self) -> Option<InboxKind> {
        InboxKind::parse(&self.kind)
    }

    /// The payload read back as `T`; a malformed payload is a data error naming the item.
    pub fn payload_as<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.payload).map_err(|e| {
            Error::invalid(
                "payload",
                format!("inbox item {} ({}) is malformed: {e}", self.seq, self.kind),
            )
        })
    }

    /// A child's outcome (`child_result`, `child_done`).
    pub fn child_outcome(&self) -> Result<ChildOutcome> {
        self.payload_as()
    }

    /// A steering message (`message`, `followup`).
    pub fn steer_message(&self) -> Result<SteerMessage> {
        self.payload_as()
    }
}

/// A message to the worker running a session, on the signal channel.
///
/// Wire form: a bare session id is a cancel (the form the channel started with, which
/// older processes still send), `wake:<id>` and `interrupt:<id>` the others.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkerSignal {
    /// Stop the session at its next check.
    Cancel(String),
    /// New inbox items: re-read the inbox at the next boundary.
    Wake(String),
    /// A steering message that interrupts the current turn (and wakes).
    Interrupt(String),
}

impl WorkerSignal {
    const WAKE: &'static str = "wake";
    const INTERRUPT: &'static str = "interrupt";

    pub fn session_id(&self) -> &str {
        match self {
            WorkerSignal::Cancel(id) | WorkerSignal::Wake(id) | WorkerSignal::Interrupt(id) => id,
        }
    }

    pub fn encode(&self) -> String {
        match self {
            WorkerSignal::Cancel(id) => id.clone(),
            WorkerSignal::Wake(id) => format!("{}:{id}", Self::WAKE),
            WorkerSignal::Interrupt(id) => format!("{}:{id}", Self::INTERRUPT),
        }
    }

    /// Any message decodes: what is not a known prefix is a session id to cancel (an
    /// unknown id cancels nothing).
    pub fn decode(msg: &str) -> WorkerSignal {
        match msg.split_once(':') {
            Some((Self::WAKE, id)) => WorkerSignal::Wake(id.to_string()),
            Some((Self::INTERRUPT, id)) => WorkerSignal::Interrupt(id.to_string()),
            _ => WorkerSignal::Cancel(msg.to_string()),
        }
    }
}

/// The `type` of an event on a session's stream: the variants of `AgentEvent`, plus
/// what a reader adds itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    IterationStarted,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolResult,
    ApprovalRequested,
    ApprovalDecided,
    IterationCompleted,
    SessionCompleted,
    Error,
    SessionWaiting,
    RateLimited,
}

impl EventKind {
    pub const ALL: [EventKind; 12] = [
        EventKind::IterationStarted,
        EventKind::TextDelta,
        EventKind::ThinkingDelta,
        EventKind::ToolCall,
        EventKind::ToolResult,
        EventKind::ApprovalRequested,
        EventKind::ApprovalDecided,
        EventKind::IterationCompleted,
        EventKind::SessionCompleted,
        EventKind::Error,
        EventKind::SessionWaiting,
        EventKind::RateLimited,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::IterationStarted => "iteration_started",
            EventKind::TextDelta => "text_delta",
            EventKind::ThinkingDelta => "thinking_delta",
            EventKind::ToolCall => "tool_call",
            EventKind::ToolResult => "tool_result",
            EventKind::ApprovalRequested => "approval_requested",
            EventKind::ApprovalDecided => "approval_decided",
            EventKind::IterationCompleted => "iteration_completed",
            EventKind::SessionCompleted => "session_completed",
            EventKind::Error => "error",
            EventKind::SessionWaiting => "session_waiting",
            EventKind::RateLimited => "rate_limited",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn of(event: &AgentEvent) -> Self {
        match event {
            AgentEvent::IterationStarted { .. } => EventKind::IterationStarted,
            AgentEvent::TextDelta { .. } => EventKind::TextDelta,
            AgentEvent::ThinkingDelta { .. } => EventKind::ThinkingDelta,
            AgentEvent::ToolCall { .. } => EventKind::ToolCall,
            AgentEvent::ToolResult { .. } => EventKind::ToolResult,
            AgentEvent::ApprovalRequested { .. } => EventKind::ApprovalRequested,
            AgentEvent::ApprovalDecided { .. } => EventKind::ApprovalDecided,
            AgentEvent::IterationCompleted { .. } => EventKind::IterationCompleted,
            AgentEvent::SessionCompleted { .. } => EventKind::SessionCompleted,
            AgentEvent::Error { .. } => EventKind::Error,
            AgentEvent::SessionWaiting { .. } => EventKind::SessionWaiting,
            AgentEvent::RateLimited { .. } => EventKind::RateLimited,
        }
    }

    /// The kind of a stored event's JSON (`{"type": …}`), if it names a known one.
    pub fn of_json(data: &str) -> Option<Self> {
        #[derive(Deserialize)]
        struct Tag<'a> {
            #[serde(borrow, rename = "type")]
            kind: std::borrow::Cow<'a, str>,
        }
        let tag: Tag<'_> = serde_json::from_str(data).ok()?;
        EventKind::parse(&tag.kind)
    }

    /// Events a run emits while a model call is in progress, before its response is
    /// committed: seen at the first uncommitted position, they show a call was under way.
    pub fn marks_llm_call(self) -> bool {
        matches!(
            self,
            EventKind::IterationStarted
                | EventKind::TextDelta
                | EventKind::ThinkingDelta
                | EventKind::Error
        )
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stored name of a plan-act session's phase (the `phase` column).
#[inline]
pub const fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Plan => "plan",
        Phase::Act => "act",
    }
}

#[inline]
pub fn parse_phase_name(s: &str) -> Option<Phase> {
    [Phase::Plan, Phase::Act]
        .into_iter()
        .find(|p| phase_name(*p) == s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn signals_round_trip_and_bare_ids_cancel() {
        for s in [
            WorkerSignal::Cancel("0190-a".into()),
            WorkerSignal::Wake("0190-b".into()),
            WorkerSignal::Interrupt("0190-c".into()),
        ] {
            assert_eq!(WorkerSignal::decode(&s.encode()), s);
        }
        assert_eq!(WorkerSignal::Wake("x".into()).encode(), "wake:x");
        assert_eq!(
            WorkerSignal::decode("abc"),
            WorkerSignal::Cancel("abc".into())
        );
        assert_eq!(
            WorkerSignal::decode("other:abc"),
            WorkerSignal::Cancel("other:abc".into())
        );
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for k in [
            InboxKind::ChildResult,
            InboxKind::ChildDone,
            InboxKind::Message,
            InboxKind::Followup,
        ] {
            assert_eq!(InboxKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.as_str()), Some(s));
        }
        assert_eq!(InboxKind::parse("nope"), None);
    }

    #[test]
    fn phase_names_match_their_serde_names() {
        for p in [Phase::Plan, Phase::Act] {
            assert_eq!(serde_json::to_value(p).unwrap(), phase_name(p));
            assert_eq!(parse_phase_name(phase_name(p)), Some(p));
        }
    }

    #[test]
    fn event_kinds_match_the_agent_events_tags() {
        let ev = AgentEvent::ToolResult {
            id: "c".into(),
            name: "n".into(),
            content: "x".into(),
            is_error: false,
        };
        let json = serde_json::to_string(&ev).unwrap();
        assert_eq!(EventKind::of_json(&json), Some(EventKind::of(&ev)));
        let held = AgentEvent::ApprovalRequested {
            id: "c".into(),
            name: "write_file".into(),
            arguments: serde_json::json!({"path": "a"}).into(),
        };
        let json = serde_json::to_string(&held).unwrap();
        assert_eq!(
            EventKind::of_json(&json),
            Some(EventKind::ApprovalRequested)
        );
        assert_eq!(EventKind::of(&held), EventKind::ApprovalRequested);
        assert!(!EventKind::ApprovalRequested.marks_llm_call());
        let decided = AgentEvent::ApprovalDecided {
            id: "c".into(),
            name: "write_file".into(),
            approved: false,
            reason: Some("timeout".into()),
        };
        let json = serde_json::to_string(&decided).unwrap();
        assert_eq!(EventKind::of_json(&json), Some(EventKind::ApprovalDecided));
        assert_eq!(EventKind::of(&decided), EventKind::ApprovalDecided);
        assert_eq!(EventKind::of_json(r#"{"type":"x"}"#), None);
        assert_eq!(EventKind::of_json("not json"), None);
    }

    #[test]
    fn payloads_keep_the_stored_keys() {
        // Rows written before these types existed must still read back.
        let old = serde_json::json!({
            "child_id": "c1", "label": "l", "tool_call_id": "t",
            "status": "completed", "finish_reason": "stop", "result": "ok", "error": null,
        });
        let c: ChildOutcome = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(c.text(), "ok");
        assert_eq!(InboxPayload::Child(c).to_value().unwrap(), old);
        let m = serde_json::json!({"content": "hi", "strategy": "interrupt"});
        let s: SteerMessage = serde_json::from_value(m.clone()).unwrap();
        assert_eq!(s.strategy, Strategy::Interrupt);
        assert_eq!(InboxPayload::Steer(s).to_value().unwrap(), m);
        let failed = ChildOutcome {
            result: Some(String::new()),
            error: Some("boom".into()),
            ..serde_json::from_value(old).unwrap()
        };
        assert_eq!(failed.text(), "boom");
    }
}
