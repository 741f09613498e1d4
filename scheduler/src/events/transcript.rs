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
/// iteration, text, tool calls and completion, then the approval requests of the calls
/// the session still holds; per tool message its result; then the completion of a
/// terminal session. Ids `t-<seq>-<k>`.
pub fn transcript_events(messages: &[Message], row: Option<&SessionRow>) -> Vec<(u64, u64, Value)> {
    let held: &[String] = match row {
        Some(r) if r.may_hold_calls() => &r.held_calls,
        _ => &[],
    };
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
                for c in m.tool_calls.iter().filter(|c| held.contains(&c.id)) {
                    evs.push(json!({"type": EventKind::ApprovalRequested, "id": c.id, "name": c.name, "arguments": c.arguments}));
                }
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
            arguments: json!({"url": "u"}).into(),
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

    #[test]
    fn calls_still_held_are_requested_again() {
        let mut a = Message::assistant("");
        for (id, path) in [("w1", "a"), ("w2", "b")] {
            a.tool_calls.push(agentq_agent::schema::ToolCall {
                id: id.into(),
                name: "write_file".into(),
                arguments: json!({"path": path}).into(),
            });
        }
        let msgs = vec![
            Message::user("write"),
            a,
            Message::tool_result("w1", "write_file", "ok", false),
        ];
        let mut row: SessionRow = serde_json::from_value(json!({
            "id": "s1", "root_id": "s1", "parent_id": null, "depth": 0, "queue": "default",
            "status": "awaiting_approval", "finish_reason": null,
            "spec": {"prompt": "write"}, "iteration": 1,
            "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                      "cache_write_tokens": 0, "reasoning_tokens": 0},
            "result": null, "error": null, "lease_owner": null, "lease_epoch": 1,
            "lease_expires_at": null, "attempts": 0, "cancel_requested": false,
            "idempotency_key": null, "created_at": "2026-12-01T08:00:00Z",
            "updated_at": "2026-12-01T08:00:00Z", "finished_at": null,
            "held_calls": ["w2"],
        }))
        .unwrap();
        let requested = |row: &SessionRow| -> Vec<(u64, u64, Value)> {
            transcript_events(&msgs, Some(row))
                .into_iter()
                .filter(|(_, _, v)| v["type"] == "approval_requested")
                .collect()
        };
        let got = requested(&row);
        assert_eq!(got.len(), 1);
        // After the response's own events: started, two calls, completed.
        assert_eq!((got[0].0, got[0].1), (1, 4));
        assert_eq!(got[0].2["id"], "w2");
        assert_eq!(got[0].2["arguments"], json!({"path": "b"}));
        // A finished session holds nothing, whatever its row last recorded.
        row.status = agentq_core::SessionStatus::Cancelled;
        assert!(requested(&row).is_empty());
    }
}
