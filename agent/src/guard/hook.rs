//! What a hook and the pipeline say to each other: the points a hook is asked at, its
//! decision, the behaviour configured for a hook that cannot answer, what a hook is told
//! of the session ([`HookContext`]), and the [`Hook`] trait a host plugs in.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::schema::ToolCall;
use crate::spec::ExitReason;
use crate::tools::ToolOutput;

/// What a PreToolUse hook decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookDecision {
    Allow,
    Deny(String),
}

/// What a stage decides when it cannot decide (no answer in time, a failure, an answer
/// that is not a verdict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    Allow,
    Deny,
}

/// What the guardian does with a call it could not see whole (an argument, or a target
/// such as a path or URL, too long to show; see [`shown`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTruncated {
    /// Deny it without asking the model: what the reviewer cannot see may be the part
    /// that matters.
    #[default]
    Deny,
    /// Review what was shown, told which parts were cut.
    Review,
}

/// Where in the pipeline a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    PreToolUse,
    PostToolUse,
    SessionStart,
    SessionEnd,
}

impl HookPoint {
    pub fn as_str(&self) -> &'static str {
        match self {
            HookPoint::PreToolUse => "pre_tool_use",
            HookPoint::PostToolUse => "post_tool_use",
            HookPoint::SessionStart => "session_start",
            HookPoint::SessionEnd => "session_end",
        }
    }
}

impl std::fmt::Display for HookPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The most of a session's prompt a hook or the guardian is given: enough to judge a call
/// against the task, bounded so a huge prompt is not copied into every review.
pub const CONTEXT_PROMPT_MAX_BYTES: usize = 4 * 1024;

/// Which session a hook or the guardian is asked about.
#[derive(Debug, Clone, Copy)]
pub struct HookContext<'a> {
    pub session_id: &'a str,
    /// The tenant the session belongs to.
    pub tenant: &'a str,
    /// Model responses so far (0 before the first).
    pub iteration: u32,
    /// The session's task, at most [`CONTEXT_PROMPT_MAX_BYTES`] (cut at a character
    /// boundary).
    pub prompt: &'a str,
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn bounded(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Lifecycle hooks: PreToolUse, PostToolUse, SessionStart, SessionEnd.
/// Every method has a do-nothing default so a hook implements only what it needs.
///
/// SessionStart fires when a session first runs (a resume after a suspension or a crash
/// does not fire it again, unless the crash came before the first checkpoint); SessionEnd
/// fires once the terminal checkpoint of a run is committed (each turn of a session with
/// follow-ups ends once; a crash right after that commit skips it).
#[async_trait]
pub trait Hook: Send + Sync {
    async fn session_start(&self, _ctx: &HookContext<'_>) {}
    async fn session_end(&self, _ctx: &HookContext<'_>, _reason: ExitReason) {}
    async fn pre_tool_use(&self, _ctx: &HookContext<'_>, _call: &ToolCall) -> HookDecision {
        HookDecision::Allow
    }
    /// Fire and forget: runs on its own task, its outcome is never awaited by the loop.
    async fn post_tool_use(&self, _ctx: &HookContext<'_>, _call: &ToolCall, _output: &ToolOutput) {}
}
