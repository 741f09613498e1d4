//! What `GET /v1/sessions/{id}/events` sends beside the agent's own events. Every event's
//! `data` carries `seq`, the position in the session's history it belongs to.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentq_agent::event::AgentEvent;
use agentq_agent::schema::Usage;
use agentq_agent::spec::ExitReason;
use agentq_types::protocol::EventKind;

/// The SSE `event:` name of [`ResetEvent`].
pub const RESET: &str = "reset";

/// `event: reset` (sent without an `id`): a step the client received events of is being
/// redone by another worker; discard what was received for positions `>= seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResetEvent {
    pub seq: u64,
}

/// The `data` of every event but `reset` and `session_completed`: the agent's own event,
/// tagged by `type` (the SSE `event:` name), with the position it belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionEvent {
    #[serde(flatten)]
    pub event: AgentEvent,
    pub seq: u64,
}

/// The `data` of `event: session_completed`: the agent's completion event, or one the
/// scheduler rebuilt from a terminal session whose worker never wrote it (then
/// `finish_reason` may be `null`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletionEvent {
    /// Always `session_completed`.
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub finish_reason: Option<ExitReason>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub iterations: u32,
    pub usage: Usage,
    pub seq: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn round_trips() {
        let wire = json!({"seq": 3});
        let r: ResetEvent = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(serde_json::to_value(r).unwrap(), wire);

        let wire = json!({
            "type": "session_completed", "finish_reason": null, "result": null,
            "error": "dead-lettered", "iterations": 2, "seq": 5,
            "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_tokens": 0,
                      "cache_write_tokens": 0, "reasoning_tokens": 0},
        });
        let c: CompletionEvent = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(c.kind, EventKind::SessionCompleted);
        assert_eq!(serde_json::to_value(&c).unwrap(), wire);
        // The worker's own event (an `AgentEvent` plus `seq`) reads the same way.
        let ev = agentq_agent::event::AgentEvent::SessionCompleted {
            finish_reason: ExitReason::Stop,
            result: Some("42".into()),
            error: None,
            iterations: 1,
            usage: Usage::default(),
        };
        let mut v = serde_json::to_value(&ev).unwrap();
        v["seq"] = json!(9);
        let c: CompletionEvent = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(c.finish_reason, Some(ExitReason::Stop));
        assert_eq!(c.seq, 9);
        // Any event of the stream reads as the agent's event with its position.
        let s: SessionEvent = serde_json::from_value(v.clone()).unwrap();
        assert_eq!((&s.event, s.seq), (&ev, 9));
        assert_eq!(serde_json::to_value(&s).unwrap(), v);
        let wire = json!({"type": "text_delta", "text": "hi", "seq": 2});
        let s: SessionEvent = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(
            s.event,
            agentq_agent::event::AgentEvent::TextDelta { text: "hi".into() }
        );
        assert_eq!(serde_json::to_value(&s).unwrap(), wire);
    }
}
