//! The tools `/mcp` offers, each with the scope its REST route needs and an input schema
//! exact enough for a model to call it: types, required fields, bounds (those of the
//! caller's tenant where its policy sets them), no other field.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use agentq_api::bounds::{
    MAX_ITERATIONS, MAX_NAME_LEN, MAX_OUTPUT_TOKENS, MAX_REASON_BYTES, MAX_TEMPERATURE,
    MAX_TIMEOUT_SECS, MAX_TOKEN_BUDGET, MAX_TOOL_CALL_ID_LEN, MAX_TOOLS,
};
use agentq_core::auth::Scope;
use agentq_core::workspace_path::FileLimits;

use crate::http::MAX_ID_LEN;
use crate::request::{MAX_IDEMPOTENCY_KEY, MAX_QUEUE_NAME};

/// Longest wait of one `wait_session` call.
pub(super) const MAX_WAIT_SECS: u64 = 120;
/// A `wait_session` without `timeout_secs` waits this long.
pub(super) const DEFAULT_WAIT_SECS: u64 = 30;
/// Most bytes of a file one `read_file` call answers with.
pub(super) const MAX_READ_BYTES: u64 = 1024 * 1024;
/// `read_file` without `max_bytes` answers with at most this many.
pub(super) const DEFAULT_READ_BYTES: u64 = 256 * 1024;

/// The fields of `submit_session` that go to `POST /v1/sessions` as they are (`files`
/// is turned from a list into the API's object).
pub(super) const SUBMIT_FIELDS: &[&str] = &[
    "prompt",
    "system",
    "provider",
    "model",
    "mode",
    "max_iterations",
    "temperature",
    "max_tokens",
    "tools",
    "sensitive_tools",
    "token_budget",
    "timeout_secs",
    "metadata",
    "queue",
    "priority",
    "idempotency_key",
    "workspace_from",
    "files",
];

/// One tool: its name and the scope a key needs to call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Name {
    Submit,
    Get,
    Wait,
    ListFiles,
    ReadFile,
    ListApprovals,
    DecideApproval,
    Cancel,
}

impl Name {
    pub(super) const ALL: [Name; 8] = [
        Name::Submit,
        Name::Get,
        Name::Wait,
        Name::ListFiles,
        Name::ReadFile,
        Name::ListApprovals,
        Name::DecideApproval,
        Name::Cancel,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Name::Submit => "submit_session",
            Name::Get => "get_session",
            Name::Wait => "wait_session",
            Name::ListFiles => "list_files",
            Name::ReadFile => "read_file",
            Name::ListApprovals => "list_approvals",
            Name::DecideApproval => "decide_approval",
            Name::Cancel => "cancel_session",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Name> {
        Name::ALL.into_iter().find(|n| n.as_str() == s)
    }

    /// What the matching REST route requires.
    pub(super) fn scope(self) -> Scope {
        match self {
            Name::Submit | Name::Cancel => Scope::SessionsWrite,
            Name::DecideApproval => Scope::ApprovalsWrite,
            Name::Get | Name::Wait | Name::ListFiles | Name::ReadFile | Name::ListApprovals => {
                Scope::SessionsRead
            }
        }
    }
}

/// The bounds a tenant's schemas carry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub max_prompt_bytes: usize,
    pub files: FileLimits,
}

fn object(properties: Value, required: &[&str]) -> Arc<JsonObject> {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::default(),
    }
}

fn session_id() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_ID_LEN,
        "description": "A session id, as submit_session answered it.",
    })
}

fn name_list(what: &str) -> Value {
    json!({
        "type": "array",
        "maxItems": MAX_TOOLS,
        "items": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LEN},
        "description": what,
    })
}

fn submit_schema(b: Bounds) -> Arc<JsonObject> {
    object(
        json!({
            "prompt": {"type": "string", "minLength": 1, "maxLength": b.max_prompt_bytes,
                "description": "The task for the agent (the bound is in bytes)."},
            "system": {"type": "string", "maxLength": b.max_prompt_bytes,
                "description": "A system prompt replacing the default one."},
            "provider": {"type": "string", "enum": ["openai", "anthropic", "scripted"],
                "description": "The model provider; the server's default when absent."},
            "model": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LEN},
            "mode": {"type": "string", "enum": ["act", "think", "plan", "plan-act"],
                "description": "act: tools run; think/plan: no tools; plan-act: a plan, then act."},
            "max_iterations": {"type": "integer", "minimum": 1, "maximum": MAX_ITERATIONS},
            "temperature": {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE},
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT_TOKENS},
            "tools": name_list("The tools the agent may use; the server's default set when absent."),
            "sensitive_tools": name_list("Tools whose calls wait for a human decision (see decide_approval)."),
            "token_budget": {"type": "integer", "minimum": 1, "maximum": MAX_TOKEN_BUDGET},
            "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_SECS,
                "description": "Wall-clock limit of the whole session."},
            "metadata": {"type": "object", "description": "Free-form labels kept with the session."},
            "queue": {"type": "string", "minLength": 1, "maxLength": MAX_QUEUE_NAME,
                "pattern": "^[A-Za-z0-9_.-]+$"},
            "priority": {"type": "integer", "minimum": 0, "maximum": 9},
            "idempotency_key": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY,
                "description": "A repeat with the same key answers with the session it created."},
            "workspace_from": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LEN,
                "description": "Start from the files of this session of yours."},
            "files": {
                "type": "array",
                "maxItems": b.files.max_files,
                "description": format!(
                    "Text files the session's workspace starts with: at most {} bytes in all.",
                    b.files.max_bytes
                ),
                "items": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "minLength": 1,
                            "maxLength": b.files.max_path_bytes,
                            "description": "Relative, `/`-separated; no `..`."},
                        "content": {"type": "string"},
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false,
                },
            },
        }),
        &["prompt"],
    )
}

fn input_schema(name: Name, b: Bounds) -> Arc<JsonObject> {
    match name {
        Name::Submit => submit_schema(b),
        Name::Get | Name::ListFiles | Name::Cancel => {
            object(json!({"session_id": session_id()}), &["session_id"])
        }
        Name::Wait => object(
            json!({
                "session_id": session_id(),
                "timeout_secs": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECS,
                    "default": DEFAULT_WAIT_SECS},
            }),
            &["session_id"],
        ),
        Name::ReadFile => object(
            json!({
                "session_id": session_id(),
                "path": {"type": "string", "minLength": 1, "maxLength": b.files.max_path_bytes.max(1),
                    "description": "A path as list_files shows it."},
                "offset": {"type": "integer", "minimum": 0, "default": 0,
                    "description": "Where to start: the next_offset of the last read."},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ_BYTES,
                    "default": DEFAULT_READ_BYTES},
            }),
            &["session_id", "path"],
        ),
        Name::ListApprovals => object(json!({"session_id": session_id()}), &[]),
        Name::DecideApproval => object(
            json!({
                "session_id": session_id(),
                "tool_call_id": {"type": "string", "minLength": 1, "maxLength": MAX_TOOL_CALL_ID_LEN},
                "approve": {"type": "boolean"},
                "reason": {"type": "string", "maxLength": MAX_REASON_BYTES,
                    "description": "Shown to the agent when the call is denied."},
                "arguments": {"type": "object",
                    "description": "With approve true only: run the call with these arguments \
                        instead of the agent's (they pass the same checks)."},
            }),
            &["session_id", "tool_call_id", "approve"],
        ),
    }
}

fn description(name: Name) -> String {
    let text = match name {
        Name::Submit => {
            "Start an agent session that runs the prompt in the background on agentq's \
             workers. Answers with the session's id and status; follow it with wait_session \
             or get_session."
        }
        Name::Get => {
            "A session's state: status, result, error, token usage, children and the tool \
             calls it holds for a human decision."
        }
        Name::Wait => {
            "Wait until a session ends, at most timeout_secs; answers with the session \
             (`ended` says whether it did). Returns early when the session holds a call for \
             a human decision."
        }
        Name::ListFiles => "The files of a session's workspace: path, size and SHA-256.",
        Name::ReadFile => {
            "One file of a session's workspace, as text (or base64 when it is not UTF-8): \
             at most max_bytes from offset; next_offset says where the rest begins."
        }
        Name::ListApprovals => {
            "The tool calls waiting for a human decision: of one session, or of your \
             sessions awaiting approval when session_id is absent."
        }
        Name::DecideApproval => "Approve or deny a tool call a session holds for a decision.",
        Name::Cancel => "Cancel a session and its sub-agents.",
    };
    format!("{text} Needs the API key scope `{}`.", name.scope())
}

fn annotations(name: Name) -> ToolAnnotations {
    let reads = !matches!(name, Name::Submit | Name::DecideApproval | Name::Cancel);
    ToolAnnotations::new()
        .read_only(reads)
        .destructive(name == Name::Cancel)
        .idempotent(reads || name == Name::Cancel)
        .open_world(false)
}

/// The tool `name` as listed.
pub(super) fn tool(name: Name, b: Bounds) -> Tool {
    Tool::new(name.as_str(), description(name), input_schema(name, b)).annotate(annotations(name))
}
