//! Assembling one streamed LLM answer: the [`LlmEvent`]s a provider yields become the
//! assistant [`Message`] (text, thinking blocks, tool calls, usage, model, finish reason).
//! `<think>` spans inside the text are split out as thinking, whatever the chunking, and
//! tool-call fragments are joined by their index. When the provider ran a tool of its own
//! during the answer (web search), the answer is also kept block by block, in order, as
//! the message's `server_content` (the provider wants it back so); those uses are never
//! tool calls.
//!
//! Pure: no I/O and no waiting. The driver feeds events as they arrive and forwards the
//! text and thinking deltas the assembler hands back (each delta string is moved, not
//! copied, into its event).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::event::AgentEvent;
use crate::provider::LlmEvent;
use crate::schema::{FinishReason, Message, ServerBlock, ThinkingBlock, ToolCall, Usage};
use crate::state::{Piece, ThinkSplitter};

/// One streamed answer, assembled.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Assembled {
    pub message: Message,
    /// The model answered with an `error` finish and no content: retry it.
    pub empty_error: bool,
}

/// A tool call being streamed: id, name, argument text.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Where a block of the answer begins in its text, and what it is.
#[derive(Debug)]
struct Mark {
    at: usize,
    kind: MarkKind,
}

#[derive(Debug)]
enum MarkKind {
    Text {
        citations: Vec<Value>,
    },
    /// A use of the provider's own tool, streamed like a tool call.
    Use(PartialCall),
    Result(ServerBlock),
}

/// Builds the assistant message from the events of one response.
#[derive(Debug, Default)]
pub(crate) struct StreamAssembler {
    text: String,
    /// The answer's blocks by where they begin in `text`: kept as `server_content` only
    /// when the provider ran a tool of its own.
    marks: Vec<Mark>,
    /// The uses of the provider's tools being streamed: their index in `marks`, by the
    /// provider's index.
    server_uses: BTreeMap<usize, usize>,
    splitter: ThinkSplitter,
    thinking: Vec<ThinkingBlock>,
    /// The last thinking block still takes text (no signature or redaction closed it).
    open_thinking: bool,
    calls: BTreeMap<usize, PartialCall>,
    usage: Usage,
    model: Option<String>,
    finish: Option<FinishReason>,
}

/// Whether this event is the answer's first token when nothing came before it (what
/// time-to-first-token measures): text, thinking or a tool-call fragment.
pub(crate) fn is_token(ev: &LlmEvent) -> bool {
    matches!(
        ev,
        LlmEvent::TextDelta(_)
            | LlmEvent::ThinkingDelta(_)
            | LlmEvent::ToolCallDelta { .. }
            | LlmEvent::ServerToolDelta { .. }
    )
}

impl StreamAssembler {
    /// Take one event. Text and thinking deltas go to `emit` as they are classified.
    pub fn push(&mut self, ev: LlmEvent, emit: &mut impl FnMut(AgentEvent)) {
        match ev {
            LlmEvent::TextDelta(t) => {
                for piece in self.splitter.push(&t) {
                    self.piece(piece, emit);
                }
            }
            LlmEvent::ThinkingDelta(t) => {
                if !t.is_empty() {
                    self.think(&t);
                    emit(AgentEvent::ThinkingDelta { text: t });
                }
            }
            LlmEvent::ThinkingSignature(sig) => {
                if !self.open_thinking {
                    self.thinking.push(ThinkingBlock::default());
                }
                if let Some(b) = self.thinking.last_mut() {
                    b.signature = Some(sig);
                }
                self.open_thinking = false;
            }
            LlmEvent::RedactedThinking(data) => {
                self.thinking.push(ThinkingBlock {
                    text: String::new(),
                    signature: None,
                    redacted: Some(data),
                });
                self.open_thinking = false;
            }
            LlmEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                // The first non-empty id and name win: later fragments may repeat them
                // or send "".
                let entry = self.calls.entry(index).or_default();
                if let Some(id) = id.filter(|s| !s.is_empty())
                    && entry.id.is_empty()
                {
                    entry.id = id;
                }
                if let Some(n) = name.filter(|s| !s.is_empty())
                    && entry.name.is_empty()
                {
                    entry.name = n;
                }
                entry.arguments.push_str(&arguments);
            }
            LlmEvent::TextBlock => self.mark(MarkKind::Text {
                citations: Vec::new(),
            }),
            LlmEvent::Citation(c) => match self.marks.last_mut() {
                Some(Mark {
                    kind: MarkKind::Text { citations },
                    ..
                }) => citations.push(c),
                _ => self.mark(MarkKind::Text { citations: vec![c] }),
            },
            LlmEvent::ServerToolDelta {
                index,
                id,
                name,
                input,
            } => self.server_use(index, id, name, &input),
            LlmEvent::ServerToolResult {
                tool_use_id,
                kind,
                content,
            } => self.mark(MarkKind::Result(ServerBlock::ToolResult {
                tool_use_id,
                kind,
                content,
            })),
            // Providers report usage as a running total.
            LlmEvent::Usage(u) => self.usage = u,
            LlmEvent::Model(m) => self.model = Some(m),
            LlmEvent::Done(f) => self.finish = Some(f),
            // The caller hands these to its admission; they are no part of the message.
            LlmEvent::RateLimits(_) => {}
        }
    }

    /// The stream ended: flush the text held back for a possible `<think>` tag and build
    /// the message. `requested_model` names it when the provider did not.
    pub fn finish(mut self, requested_model: &str, emit: &mut impl FnMut(AgentEvent)) -> Assembled {
        for piece in self.splitter.finish() {
            self.piece(piece, emit);
        }
        let mut tool_calls: Vec<ToolCall> = self
            .calls
            .into_values()
            // A fragment stream that never named its tool cannot be run or replayed.
            .filter(|c| !c.name.is_empty())
            .map(|c| ToolCall {
                id: if c.id.is_empty() {
                    format!("call_{}", uuid::Uuid::new_v4().simple())
                } else {
                    c.id
                },
                name: c.name,
                arguments: ToolCall::parse_arguments(&c.arguments),
            })
            .collect();
        // What the message keeps is kept for the session's life, by every session in
        // flight: the calls without the room the filter's collect reserves (four), the text
        // without what its growth left spare.
        tool_calls.shrink_to_fit();
        self.text.shrink_to_fit();
        let empty_error = self.finish == Some(FinishReason::Error)
            && self.text.trim().is_empty()
            && tool_calls.is_empty();
        let server_content = server_content(&self.text, std::mem::take(&mut self.marks));
        let mut message = Message::assistant(self.text);
        message.server_content = server_content;
        message.thinking = self.thinking;
        message.tool_calls = tool_calls;
        message.usage = Some(self.usage);
        message.model = self.model.or_else(|| Some(requested_model.to_string()));
        message.finish_reason = self.finish;
        Assembled {
            message,
            empty_error,
        }
    }

    fn piece(&mut self, piece: Piece, emit: &mut impl FnMut(AgentEvent)) {
        match piece {
            Piece::Text(s) => {
                self.text.push_str(&s);
                emit(AgentEvent::TextDelta { text: s });
            }
            Piece::Thinking(s) => {
                self.think(&s);
                emit(AgentEvent::ThinkingDelta { text: s });
            }
        }
    }

    /// A block begins here.
    fn mark(&mut self, kind: MarkKind) {
        self.marks.push(Mark {
            at: self.text.len(),
            kind,
        });
    }

    /// A fragment of a use of the provider's tool: the first of its index marks its place;
    /// the first non-empty id and name win, as for a tool call.
    fn server_use(&mut self, index: usize, id: Option<String>, name: Option<String>, input: &str) {
        let at = match self.server_uses.get(&index) {
            Some(&at) => at,
            None => {
                self.mark(MarkKind::Use(PartialCall::default()));
                let at = self.marks.len() - 1;
                self.server_uses.insert(index, at);
                at
            }
        };
        if let Some(Mark {
            kind: MarkKind::Use(call),
            ..
        }) = self.marks.get_mut(at)
        {
            if let Some(id) = id.filter(|s| !s.is_empty())
                && call.id.is_empty()
            {
                call.id = id;
            }
            if let Some(n) = name.filter(|s| !s.is_empty())
                && call.name.is_empty()
            {
                call.name = n;
            }
            call.arguments.push_str(input);
        }
    }

    /// Append to the open thinking block, opening one if none is.
    fn think(&mut self, s: &str) {
        if !self.open_thinking {
            self.thinking.push(ThinkingBlock::default());
            self.open_thinking = true;
        }
        if let Some(b) = self.thinking.last_mut() {
            b.text.push_str(s);
        }
    }
}

/// The answer block by block, from `marks` into `text`, when the provider ran a tool of its
/// own in it; empty otherwise. A use without an id or a name cannot be sent back, and
/// neither can a result whose use is not kept; empty text blocks are left out.
fn server_content(text: &str, marks: Vec<Mark>) -> Vec<ServerBlock> {
    let uses = marks
        .iter()
        .any(|m| matches!(&m.kind, MarkKind::Use(c) if !c.id.is_empty() && !c.name.is_empty()));
    if !uses {
        return Vec::new();
    }
    let ends: Vec<usize> = marks
        .iter()
        .skip(1)
        .map(|m| m.at)
        .chain(std::iter::once(text.len()))
        .collect();
    let slice = |from: usize, to: usize| text.get(from..to).unwrap_or_default().to_string();
    let mut out = Vec::with_capacity(marks.len().saturating_add(1));
    let push_text = |out: &mut Vec<ServerBlock>, text: String, citations: Vec<Value>| {
        if !text.is_empty() {
            out.push(ServerBlock::Text { text, citations });
        }
    };
    push_text(
        &mut out,
        slice(0, marks.first().map_or(0, |m| m.at)),
        Vec::new(),
    );
    let mut kept: std::collections::HashSet<String> = Default::default();
    for (mark, end) in marks.into_iter().zip(ends) {
        let mut after = mark.at;
        match mark.kind {
            MarkKind::Text { citations } => {
                push_text(&mut out, slice(mark.at, end), citations);
                after = end;
            }
            MarkKind::Use(c) if !c.id.is_empty() && !c.name.is_empty() => {
                kept.insert(c.id.clone());
                out.push(ServerBlock::ToolUse {
                    input: ToolCall::parse_arguments(&c.arguments).value(),
                    id: c.id,
                    name: c.name,
                });
            }
            MarkKind::Result(r @ ServerBlock::ToolResult { .. }) => {
                if matches!(&r, ServerBlock::ToolResult { tool_use_id, .. } if kept.contains(tool_use_id))
                {
                    out.push(r);
                }
            }
            MarkKind::Use(_) | MarkKind::Result(_) => {}
        }
        // Text after a tool's block that no block start announced.
        push_text(&mut out, slice(after, end), Vec::new());
    }
    out
}

#[cfg(test)]
#[path = "stream/tests.rs"]
mod tests;
