//! The events a run would have emitted, rebuilt from a stored history: what a client is
//! sent when a session's stream has expired or was lost with Redis.

use serde_json::{Value, json};

use agentq_agent::schema::{Message, Role};
use agentq_api::CompletionEvent;
use agentq_core::SessionRow;
use agentq_core::protocol::EventKind;

/// The `session_completed` event of a terminal row.
pub(crate) fn completion_from_row(row: &SessionRow, seq: u64) -> Value {
    let event = CompletionEvent {
        kind: EventKind::SessionCompleted,
        finish_reason: row.finish_reason,
        result: row.result.clone(),
        error: row.error.clone(),
        iterations: row.iteration,
        usage: row.usage,
        seq,
    };
    // Strings, numbers and enums only: encoding cannot fail.
    serde_json::to_value(event).unwrap_or_default()
}

/// The events a run would have emitted for a stored history: per assistant message its
/// iteration, text, tool calls and completion; per tool message its result; then the
/// completion of a terminal session. Ids `t-<seq>-<k>`.
pub fn transcript_events(messages: &[Message], row: Option<&SessionRow>) -> Vec<(u64, u64, Value)> {
    let mut out = Vec::new();
    let mut iteration = 0u32;
    for (seq, m) in messages.iter().enumerate() {
        let seq = seq as u64;
        let mut evs: Vec<Value> = Vec::new();
        match m.role {
            Role::Assistant => {
                iteration += 1;
                evs.push(json!({"type": EventKind::IterationStarted, "iteration": iteration}));
                for t in m.thinking.iter().filter(|t| !t.text.is_empty()) {
                    evs.push(json!({"type": EventKind::ThinkingDelta, "text": t.text}));
                }
                if !m.content.is_empty() {
                    evs.push(json!({"type": EventKind::TextDelta, "text": m.content}));
                }
                for c in &m.tool_calls {
                    evs.push(json!({"type": EventKind::ToolCall, "id": c.id, "name": c.name, "arguments": c.arguments}));
                }
                evs.push(json!({
                    "type": EventKind::IterationCompleted,
                    "iteration": iteration,
                    "usage": m.usage.unwrap_or_default(),
                }));
            }
            Role::Tool => evs.push(json!({
                "type": EventKind::ToolResult,
                "id": m.tool_call_id,
                "name": m.name,
                "content": m.content,
                "is_error": m.is_error,
            })),
            _ => {}
        }
        for (k, mut v) in evs.into_iter().enumerate() {
            if let Some(o) = v.as_object_mut() {
                o.insert("seq".into(), json!(seq));
            }
            out.push((seq, k as u64, v));
        }
    }
    if let Some(row) = row.filter(|r| r.status.is_terminal()) {
        let seq = messages.len() as u64;
        out.push((seq, 0, completion_from_row(row, seq)));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn transcript_rebuilds_the_live_events() {
        let mut a = Message::assistant("Fetching.");
        a.tool_calls.push(agentq_agent::schema::ToolCall {
            id: "c1".into(),
            name: "http_fetch".into(),
            arguments: json!({"url": "u"}),
        });
        let msgs = vec![
            Message::user("do it"),
            a,
            Message::tool_result("c1", "http_fetch", "ok", false),
            Message::assistant("Done."),
        ];
        let evs = transcript_events(&msgs, None);
        let kinds: Vec<(u64, u64, &str)> = evs
            .iter()
            .map(|(s, k, v)| (*s, *k, v["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (1, 0, "iteration_started"),
                (1, 1, "text_delta"),
                (1, 2, "tool_call"),
                (1, 3, "iteration_completed"),
                (2, 0, "tool_result"),
                (3, 0, "iteration_started"),
                (3, 1, "text_delta"),
                (3, 2, "iteration_completed"),
            ]
        );
        assert_eq!(evs[4].2["seq"], json!(2));
    }
}
