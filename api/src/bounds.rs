//! The API's hard bounds: the largest (and smallest) value each field of a request may
//! carry, whoever sends it. They keep every number a session is created with inside what
//! the worker can add, multiply and sleep on without overflow, and every list and string
//! inside what one request may cost in memory and storage. A tenant's policy
//! (`[policy]`) may narrow them further; it cannot widen them.
//!
//! The bounds of a spec's fields, and [`check_spec`] that holds a spec to them, live with
//! the rest of a request's checks in `agentq_types::policy::request` (the worker runs
//! part of them too); they are re-exported here under their API names.

pub use agentq_types::policy::request::{
    MAX_CONTEXT_BUDGET_CHARS, MAX_DRAIN_ROUNDS, MAX_HISTORY_WINDOW, MAX_ITERATIONS,
    MAX_LLM_RETRIES, MAX_METADATA_ENTRIES, MAX_METADATA_KEY_LEN, MAX_NAME_LEN, MAX_OBJECT_ENTRIES,
    MAX_OUTPUT_TOKENS, MAX_RETRY_DELAY_MS, MAX_TEMPERATURE, MAX_TIMEOUT_SECS, MAX_TOKEN_BUDGET,
    MAX_TOOL_OUTPUT_CHARS, MAX_TOOLS, MIN_TOOL_OUTPUT_CHARS, Violation, check_spec,
};

/// A body may hold one JSON value (of any kind, containers and their entries alike) per
/// this many bytes of its size, and [`MIN_BODY_VALUES`] whatever its size: a parsed value
/// takes up to about a hundred bytes, so a body of tiny values (`[[0],[0],…]`) would
/// otherwise take forty times its size once parsed, where one of ordinary values (strings
/// longer than a few bytes) stays within twice.
pub const BODY_BYTES_PER_VALUE: usize = 64;
/// The JSON values any body may hold, however short it is: at most some 20 MB parsed,
/// and room for a full batch of short sessions with a few tools each.
pub const MIN_BODY_VALUES: usize = 200_000;

/// The most JSON values a body of `len` bytes may hold.
pub fn max_body_values(len: usize) -> usize {
    (len / BODY_BYTES_PER_VALUE).max(MIN_BODY_VALUES)
}

/// Longest `tool_call_id` of an approval (bytes).
pub const MAX_TOOL_CALL_ID_LEN: usize = 1_024;
/// Longest `reason` of an approval (bytes).
pub const MAX_REASON_BYTES: usize = 64 * 1024;
/// Largest `limit` of `GET /v1/sessions`.
pub const MAX_LIST_LIMIT: u32 = 1_000;
/// Largest `arguments` of an approval that edits a call (bytes of its JSON text).
pub const MAX_EDITED_ARGUMENTS_BYTES: usize = 256 * 1024;
/// Largest `limit` of `GET /v1/approvals`.
pub const MAX_APPROVALS_LIMIT: u32 = 100;
/// Sessions one page of `GET /v1/sessions` or `GET /v1/approvals` reads at most when
/// filters that the store cannot apply (metadata, cost, tool) leave rows out: past it the
/// page ends early with a cursor, so a filter matching nothing costs a bounded read.
pub const MAX_SCANNED_PER_PAGE: usize = 5_000;
