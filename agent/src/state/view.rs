//! What the model is shown of a history: the stored history put in call order, then
//! repaired (every call answered), windowed and compacted for one request, without the
//! stored history changing; and tool outputs cut to their limit.

use std::collections::HashMap;

use crate::provider::ViewMessage;
use crate::schema::{Message, Role};

/// The text a tool call gets when its result was lost (a crash between the assistant
/// response and the result) and it was not re-run.
pub const INTERRUPTED_RESULT: &str =
    "interrupted: no result was recorded for this call (the run stopped before it finished)";

/// Put each turn's tool results in call order (the store keeps them in the order they
/// finished).
pub fn normalize_history(messages: &mut [Message]) {
    let mut i = 0;
    while i < messages.len() {
        if messages[i].role == Role::Assistant && !messages[i].tool_calls.is_empty() {
            let order: HashMap<String, usize> = messages[i]
                .tool_calls
                .iter()
                .enumerate()
                .map(|(k, c)| (c.id.clone(), k))
                .collect();
            let start = i + 1;
            let end = messages[start..]
                .iter()
                .position(|m| m.role != Role::Tool)
                .map_or(messages.len(), |p| start + p);
            messages[start..end].sort_by_key(|m| {
                m.tool_call_id
                    .as_deref()
                    .and_then(|id| order.get(id).copied())
                    .unwrap_or(usize::MAX)
            });
            i = end;
        } else {
            i += 1;
        }
    }
}

/// Repair, window and compact a history for sending.
///
/// - Repair: every assistant tool call is followed by exactly one result, in call order; a
///   missing result becomes an explicit "interrupted" one; orphan results are dropped.
/// - Window: at most `window` messages, cut at a turn boundary, always keeping the first
///   user message (the task).
/// - Compaction: while the view is over `budget_chars`, old tool outputs (all but the last
///   two assistant turns') are shortened, oldest first.
pub fn request_view(
    history: &[Message],
    window: usize,
    budget_chars: Option<usize>,
) -> Vec<ViewMessage<'_>> {
    let repaired = repair(history);
    let mut view = apply_window(repaired, window);
    if let Some(budget) = budget_chars {
        compact(&mut view, budget);
    }
    view
}

fn repair(history: &[Message]) -> Vec<ViewMessage<'_>> {
    let mut out = Vec::with_capacity(history.len());
    let mut i = 0;
    while i < history.len() {
        let m = &history[i];
        match m.role {
            Role::System => {
                i += 1;
            }
            Role::Tool => {
                // A result not directly after its assistant turn is an orphan.
                i += 1;
            }
            Role::Assistant if !m.tool_calls.is_empty() => {
                out.push(ViewMessage::Borrowed(m));
                let start = i + 1;
                let end = history[start..]
                    .iter()
                    .position(|x| x.role != Role::Tool)
                    .map_or(history.len(), |p| start + p);
                let results = &history[start..end];
                for call in &m.tool_calls {
                    match results
                        .iter()
                        .find(|r| r.tool_call_id.as_deref() == Some(call.id.as_str()))
                    {
                        Some(r) => out.push(ViewMessage::Borrowed(r)),
                        None => out.push(ViewMessage::from(Message::tool_result(
                            call.id.clone(),
                            call.name.clone(),
                            INTERRUPTED_RESULT,
                            true,
                        ))),
                    }
                }
                i = end;
            }
            _ => {
                out.push(ViewMessage::Borrowed(m));
                i += 1;
            }
        }
    }
    out
}

fn apply_window(view: Vec<ViewMessage<'_>>, window: usize) -> Vec<ViewMessage<'_>> {
    if view.len() <= window {
        return view;
    }
    let first_user = view.iter().position(|m| m.role == Role::User);
    let mut start = view.len().saturating_sub(window.saturating_sub(1).max(1));
    // Never start on a tool result: its assistant turn would be cut off.
    while start < view.len() && view[start].role == Role::Tool {
        start += 1;
    }
    let mut out = Vec::with_capacity(window);
    if let Some(fu) = first_user
        && fu < start
    {
        out.push(view[fu].clone());
    }
    out.extend(view[start..].iter().cloned());
    out
}

fn view_chars(view: &[ViewMessage<'_>]) -> usize {
    view.iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.arguments.text().len())
                    .sum::<usize>()
        })
        .sum()
}

const COMPACT_KEEP_CHARS: usize = 200;

fn compact(view: &mut [ViewMessage<'_>], budget: usize) {
    let mut total = view_chars(view);
    if total <= budget {
        return;
    }
    // Protect the last two assistant turns and everything after them.
    let protected_from = view
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .rev()
        .nth(1)
        .unwrap_or(0);
    for m in view[..protected_from].iter_mut() {
        if total <= budget {
            break;
        }
        if m.role != Role::Tool || m.content.len() <= COMPACT_KEEP_CHARS * 2 {
            continue;
        }
        let cut = floor_char_boundary(&m.content, COMPACT_KEEP_CHARS);
        let omitted = m.content.len() - cut;
        let shortened = format!(
            "{}\n[… {omitted} characters of this earlier tool output omitted to fit the context budget]",
            &m.content[..cut]
        );
        total = total - m.content.len() + shortened.len();
        m.to_mut().content = shortened;
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Cut a tool output over `max` characters, saying how much was cut.
pub fn truncate_output(content: String, max: usize) -> String {
    let chars = content.chars().count();
    if chars <= max {
        return content;
    }
    let cut_at = content
        .char_indices()
        .nth(max)
        .map_or(content.len(), |(i, _)| i);
    let omitted = chars - max;
    format!(
        "{}\n[output truncated: {omitted} of {chars} characters omitted]",
        &content[..cut_at]
    )
}
