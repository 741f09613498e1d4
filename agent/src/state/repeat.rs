//! Repeated calls: a model that makes the same call again and again (same tool, equal
//! arguments) and gets the same result each time learns nothing from it, and spends its
//! session's budget going round. The count is read back from the history, never kept
//! aside, so a resumed session counts exactly as the run before it did; the look-back
//! stops at the first turn that breaks the run of repeats, so it costs a few turns at most.
//!
//! A repeat is the same tool with equal arguments (as JSON values: key order, spacing
//! and how a number is written do not matter) in consecutive assistant turns, each of which got the same result as the one
//! before. A turn without the call, a changed result or a user message (a follow-up,
//! steering, a background result) ends the run: the model then has something new.

use serde_json::Value;

use super::SessionState;
use crate::schema::{Message, Role, ToolCall};

/// The most earlier turns a count looks back over when no limit ends the session first
/// (`max_repeated_calls` = 0): past it, the note says "more than" this many.
pub const REPEAT_LOOKBACK: u32 = 100;

/// The model made the same call `max_repeated_calls` times in a row: the session ends
/// `stuck` ([`SessionState::end_stuck`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Stuck {
    /// The calls of the last answer without a result: none of them runs.
    pub calls: Vec<ToolCall>,
    /// The repeated call's tool.
    pub tool: String,
    /// Times in a row the call was made, this one included.
    pub times: u32,
}

/// How the note [`SessionState::with_repeat_note`] adds to a result begins: results are
/// compared without it.
const NOTE_START: &str = "\n\n[agentq: you have called `";

/// A result as the tool gave it, without the note a repeat added.
fn without_note(content: &str) -> &str {
    content
        .rfind(NOTE_START)
        .map_or(content, |at| &content[..at])
}

/// Same tool, equal arguments.
fn same_call(a: &ToolCall, b: &ToolCall) -> bool {
    a.name == b.name
        && (a.arguments == b.arguments
            || same_arguments(&a.arguments.value(), &b.arguments.value()))
}

/// Equal as JSON values, which is what a tool reads: objects as maps (whatever order
/// their keys came in; spacing was gone once parsed), and numbers by value, so that `5`,
/// `5.0` and `5e0` are one number. Without that, a model could go round forever writing
/// the same number another way each time.
fn same_arguments(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => same_number(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_arguments(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_arguments(v, w)))
        }
        _ => a == b,
    }
}

/// Integers compare exactly (two above 2^53 that a float would confuse stay apart); a
/// number written with a fraction or an exponent compares by its value as a float.
fn same_number(x: &serde_json::Number, y: &serde_json::Number) -> bool {
    if x == y {
        return true;
    }
    if x.is_f64() || y.is_f64() {
        return matches!((x.as_f64(), y.as_f64()), (Some(a), Some(b)) if a == b);
    }
    false
}

/// The result of call `id` among `answers` (the messages after the call's answer).
fn result_of<'a>(answers: &'a [Message], id: &str) -> Option<&'a str> {
    answers
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(id))
        .map(|m| without_note(&m.content))
}

impl SessionState {
    /// How many earlier assistant turns in a row (the one before the last first) made
    /// `call` and got the same result each time, at most `cap`; with the result they got.
    /// `call` belongs to the last assistant turn.
    fn earlier_repeats(&self, call: &ToolCall, cap: u32) -> (u32, Option<&str>) {
        let Some(mut later) = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::Assistant)
        else {
            return (0, None);
        };
        let mut count = 0;
        let mut seen: Option<&str> = None;
        while count < cap {
            let Some(pos) = self.messages[..later]
                .iter()
                .rposition(|m| m.role != Role::Tool)
            else {
                break;
            };
            let turn = &self.messages[pos];
            if turn.role != Role::Assistant {
                break;
            }
            let Some(same) = turn.tool_calls.iter().find(|c| same_call(c, call)) else {
                break;
            };
            let Some(result) = result_of(&self.messages[pos + 1..later], &same.id) else {
                break;
            };
            if seen.is_some_and(|s| s != result) {
                break;
            }
            seen = Some(result);
            count += 1;
            later = pos;
        }
        (count, seen)
    }

    /// How many earlier turns a count looks back over: enough to reach the limit, or
    /// [`REPEAT_LOOKBACK`] without one.
    fn lookback(&self) -> u32 {
        match self.spec.max_repeated_calls {
            0 => REPEAT_LOOKBACK,
            max => max.max(2).saturating_sub(1).min(REPEAT_LOOKBACK),
        }
    }

    /// [`Stuck`] when one of the `pending` calls of the last answer is the
    /// `max_repeated_calls`-th same call in a row, the ones before it all answered alike.
    /// A limit of 1 counts as 2: a first call repeats nothing.
    pub(super) fn stuck(&self, pending: &[ToolCall]) -> Option<Stuck> {
        let max = self.spec.max_repeated_calls;
        if max == 0 {
            return None;
        }
        let lookback = self.lookback();
        pending.iter().find_map(|c| {
            let times = self.earlier_repeats(c, lookback).0.saturating_add(1);
            (times >= max.max(2)).then(|| Stuck {
                calls: pending.to_vec(),
                tool: c.name.clone(),
                times,
            })
        })
    }

    /// [`Step::Stuck`](super::Step::Stuck): answer the open calls without running them
    /// (the history stays replayable for a follow-up) and end the session `stuck`.
    pub fn end_stuck(&mut self, stuck: Stuck) {
        let Stuck { calls, tool, times } = stuck;
        for c in calls {
            let text = format!(
                "Not run: `{tool}` was called {times} times in a row with the same arguments \
                 and the same result, so the session was ended as stuck."
            );
            self.messages
                .push(Message::tool_result(c.id, c.name, text, true));
        }
        self.outcome = Some(super::Outcome {
            reason: crate::spec::ExitReason::Stuck,
            result: None,
            error: Some(format!(
                "`{tool}` was called {times} times in a row with the same arguments, and the \
                 same result every time"
            )),
        });
    }

    /// `content`, the result of `call` (of the last answer), with a note for the model
    /// when it is the `warn_repeated_calls`-th same call in a row with the same result:
    /// how many times it made it, and when the session will end if it goes on.
    pub fn with_repeat_note(&self, call: &ToolCall, content: String) -> String {
        let warn = self.spec.warn_repeated_calls;
        if warn == 0 {
            return content;
        }
        let (earlier, seen) = self.earlier_repeats(call, self.lookback());
        if earlier == 0 || seen != Some(without_note(&content)) {
            return content;
        }
        let times = earlier.saturating_add(1);
        if times < warn {
            return content;
        }
        let max = self.spec.max_repeated_calls;
        let counted = if max == 0 && earlier >= REPEAT_LOOKBACK {
            format!("more than {REPEAT_LOOKBACK} times")
        } else {
            format!("{times} times")
        };
        let end = if max == 0 {
            String::new()
        } else {
            format!(" The session ends as stuck if you make this same call {max} times in a row.")
        };
        format!(
            "{content}{NOTE_START}{}` with these same arguments {counted} in a row and the \
             result has not changed. Repeating the call will not tell you anything new: use \
             the result above, do something else, or give your final answer.{end}]",
            call.name
        )
    }
}
