//! Assembling one streamed LLM answer: the [`LlmEvent`]s a provider yields become the
//! assistant [`Message`] (text, thinking blocks, tool calls, usage, model, finish reason).
//! `<think>` spans inside the text are split out as thinking, whatever the chunking, and
//! tool-call fragments are joined by their index.
//!
//! Pure: no I/O and no waiting. The driver feeds events as they arrive and forwards the
//! text and thinking deltas the assembler hands back (each delta string is moved, not
//! copied, into its event).

use std::collections::BTreeMap;

use crate::event::AgentEvent;
use crate::provider::LlmEvent;
use crate::schema::{FinishReason, Message, ThinkingBlock, ToolCall, Usage};
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

/// Builds the assistant message from the events of one response.
#[derive(Debug, Default)]
pub(crate) struct StreamAssembler {
    text: String,
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
        LlmEvent::TextDelta(_) | LlmEvent::ThinkingDelta(_) | LlmEvent::ToolCallDelta { .. }
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
            // Providers report usage as a running total.
            LlmEvent::Usage(u) => self.usage = u,
            LlmEvent::Model(m) => self.model = Some(m),
            LlmEvent::Done(f) => self.finish = Some(f),
        }
    }

    /// The stream ended: flush the text held back for a possible `<think>` tag and build
    /// the message. `requested_model` names it when the provider did not.
    pub fn finish(mut self, requested_model: &str, emit: &mut impl FnMut(AgentEvent)) -> Assembled {
        for piece in self.splitter.finish() {
            self.piece(piece, emit);
        }
        let tool_calls: Vec<ToolCall> = self
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
        let empty_error = self.finish == Some(FinishReason::Error)
            && self.text.trim().is_empty()
            && tool_calls.is_empty();
        let mut message = Message::assistant(self.text);
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
