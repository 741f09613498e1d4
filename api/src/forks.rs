//! Forking a session from a step: `POST /v1/sessions/{id}/fork`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use agentq_types::model::SessionStatus;

/// `POST /v1/sessions/{id}/fork`: a new session whose history is the first
/// `at_iteration` iterations of this one (each a model response and the tool results
/// answering its calls; 0: the prompt alone), read from the original rather than copied,
/// and whose workspace holds the tree's files as of that step. Reaching the step costs
/// nothing: the fork's first model call is iteration `at_iteration + 1`, its usage starts
/// at zero, and the original is never changed. The fork runs with the original's spec,
/// but for the overrides given here, held to the tenant's policy as a new session is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkRequest {
    /// How many iterations of the original to keep: 0 to its `iterations` (a running
    /// original: to its last finished iteration).
    pub at_iteration: u32,
    /// A user message after the kept history (1 to `max_prompt_bytes` bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Another model for the fork's own calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Another tool list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Another token budget for the fork's own calls (the kept history cost it nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
}

impl ForkRequest {
    /// The body's fields.
    pub const FIELDS: &'static [&'static str] =
        &["at_iteration", "message", "model", "tools", "token_budget"];
    /// The ones that override the original's spec.
    pub const OVERRIDES: &'static [&'static str] = &["model", "tools", "token_budget"];
}

/// The fork, queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForkResponse {
    pub id: String,
    pub status: SessionStatus,
    pub forked_from: String,
    pub at_iteration: u32,
}
