//! `[[hooks]]` (the operator's webhooks and commands) and `[guardian]` (the LLM
//! reviewer), with their timeouts' defaults and bounds.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use agentq_agent::guard::{Behavior, HookPoint, OnTruncated};

use super::section::section;
use super::values::Secret;

/// A hook's timeout unless configured.
pub const DEFAULT_HOOK_TIMEOUT_MS: u64 = 5_000;
/// The longest a hook may take: a PreToolUse hook holds up every call it sees.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 60_000;
/// The guardian's timeout unless configured.
pub const DEFAULT_GUARDIAN_TIMEOUT_MS: u64 = 30_000;
pub const MAX_GUARDIAN_TIMEOUT_MS: u64 = 300_000;

fn d_hook_timeout() -> u64 {
    DEFAULT_HOOK_TIMEOUT_MS
}

/// One `[[hooks]]` entry: a webhook (`url`) or a command (`command`) asked at one point.
/// Only `pre_tool_use` hooks decide (`on_timeout` and `on_error` apply to them, and
/// default to deny: a hook that cannot answer blocks the call); the other points observe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSettings {
    pub on: HookPoint,
    /// An http(s) URL the event is POSTed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A program and its arguments, given the event on stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default = "d_hook_timeout")]
    pub timeout_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<Behavior>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<Behavior>,
    /// Tool points: only tools whose name matches one of these globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// A header sent to the webhook with every request, whose value is read from the
    /// environment variable `header_env` (never from the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_env: Option<String>,
    /// The value of `header_env`, read by the environment layer.
    #[serde(skip)]
    pub header_value: Option<Secret>,
}

impl HookSettings {
    /// What the hook does when it cannot answer in time.
    pub fn timeout_behavior(&self) -> Behavior {
        self.on_timeout.unwrap_or(Behavior::Deny)
    }

    /// What the hook does when it fails or answers no verdict.
    pub fn error_behavior(&self) -> Behavior {
        self.on_error.unwrap_or(Behavior::Deny)
    }
}

section! {
    /// `[guardian]`: an LLM reviewer asked about each tool call the other automatic
    /// stages let through. Off unless `provider` is set. It is built from the worker's own
    /// provider settings (endpoints and keys of `[providers]`), never from a session's.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct GuardianSection {
        /// `openai`, `anthropic` or `scripted`; unset: no guardian.
        pub provider: Option<String> = None,
        /// Unset: the provider's default model.
        pub model: Option<String> = None,
        /// The reviewer's instructions; unset: a built-in reviewer prompt.
        pub prompt: Option<String> = None,
        pub timeout_ms: u64 = DEFAULT_GUARDIAN_TIMEOUT_MS,
        /// When the review fails or its answer is not a verdict.
        pub on_error: Behavior = Behavior::Deny,
        /// A call the reviewer cannot be shown whole (an argument or a target too long):
        /// `deny` it unasked, or `review` what was shown, told what was cut.
        pub on_truncated: OnTruncated = OnTruncated::Deny,
        /// Only tools whose name matches one of these globs are reviewed; unset: every
        /// tool.
        pub tools: Option<Vec<String>> = None,
        /// The scripted provider's script for the guardian (tests and demos).
        pub script: Option<PathBuf> = None,
    }
}
