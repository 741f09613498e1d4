//! One session request, from the item's JSON object to a [`SessionRequest`]: the steps of
//! [`parse_session`], in the order that decides which of several problems is answered.

use std::collections::BTreeSet;

use serde_json::Value;

use agentq_agent::spec::SessionSpec;
use agentq_core::policy::request::check_spec;
use agentq_core::workspace::InputFile;
use agentq_core::workspace_path::FileLimits;

use crate::error::ApiError;
use crate::http::body::{decode_at, path, take_fields};

use super::envelope::{Envelope, Source};
use super::files::parse_files;
use super::guard::{check_field_names, check_metadata, check_prompt, item_object};

/// The queue of a session that names none.
pub const DEFAULT_QUEUE: &str = "default";

/// Limits of one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_prompt_bytes: usize,
    pub max_batch: usize,
    /// What its `files` may hold (the tenant's policy).
    pub files: FileLimits,
}

/// One session request, decoded and checked (all but its tenant's policy).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRequest {
    pub spec: SessionSpec,
    pub queue: String,
    pub idempotency_key: Option<String>,
    /// 0 (lowest) to 9.
    pub priority: u8,
    /// The spec's fields the client sent (the others hold their defaults), for the policy.
    pub sent: BTreeSet<String>,
    /// The workspace's files, paths normalised.
    pub files: Vec<InputFile>,
    /// The session whose workspace this one starts from (not looked up yet).
    pub workspace_from: Option<String>,
}

/// One session request (`prefix` names it inside a batch, e.g. `[17]`).
pub fn parse_session(
    value: Value,
    limits: &Limits,
    prefix: &str,
) -> Result<SessionRequest, ApiError> {
    let mut obj = item_object(value, prefix)?;
    check_field_names(&obj, prefix)?;
    check_metadata(obj.get("metadata"), prefix)?;
    let envelope: Envelope = take_fields(&mut obj, prefix)?;
    check_prompt(&obj, limits.max_prompt_bytes, prefix)?;
    let Source { workspace_from } = take_fields(&mut obj, prefix)?;
    let files_value = obj.remove("files");

    // What is left is the spec's fields.
    let sent: BTreeSet<String> = obj.keys().cloned().collect();
    let spec = decode_at::<SessionSpec>(obj, prefix)?;
    check_spec(&spec).map_err(|v| ApiError::invalid(path(prefix, &v.field), v.message))?;
    // Last: the spec's errors come first, and its checks are cheaper than decoding files.
    let files = parse_files(files_value, &limits.files, prefix)?;
    Ok(SessionRequest {
        spec,
        queue: envelope.queue.unwrap_or_else(|| DEFAULT_QUEUE.to_string()),
        idempotency_key: envelope.idempotency_key,
        priority: envelope
            .priority
            .unwrap_or(agentq_core::scheduling::DEFAULT_PRIORITY),
        sent,
        files,
        workspace_from,
    })
}
