//! What one session request may ask for, checked in one place: its spec's shape
//! ([`check_spec`]: what [`SessionSpec::validate`] checks, the names and URL the host
//! leaves to its caller, and the API's hard bounds) and its tenant's rules
//! ([`TenantPolicy::check_request`]: the queue, then [`TenantPolicy::apply`]).
//!
//! The scheduler runs both on every request before anything is written; the worker runs
//! [`TenantPolicy::check_request`] again on every stored row before running it (with
//! [`Sent::Stored`]), so a row written by an older or compromised scheduler cannot
//! escalate. Pure: no I/O.
//!
//! The bounds keep every number a session is created with inside what the worker can
//! add, multiply and sleep on without overflow, and every list and string inside what one
//! request may cost in memory and storage. A tenant's policy (`[policy]`) may narrow them
//! further; it cannot widen them.

use serde_json::Value;

use agentq_agent::spec::{SessionSpec, WEB_SEARCH_TOOL};

use super::{PolicyViolation, Sent, SpawnContext, TenantPolicy};

/// Longest `timeout_secs`, `approval_timeout_secs` and `tool_timeout_secs`: 30 days.
pub const MAX_TIMEOUT_SECS: u64 = 30 * 24 * 3600;
/// Most model calls of one session.
pub const MAX_ITERATIONS: u32 = 10_000;
/// Largest `max_tokens` of one model call.
pub const MAX_OUTPUT_TOKENS: u32 = 1_000_000;
/// Largest `token_budget` of a session.
pub const MAX_TOKEN_BUDGET: u64 = 1_000_000_000;
/// Largest `temperature`.
pub const MAX_TEMPERATURE: f32 = 2.0;
/// Largest `history_window` (messages).
pub const MAX_HISTORY_WINDOW: u64 = 100_000;
/// Largest `context_budget_chars`.
pub const MAX_CONTEXT_BUDGET_CHARS: u64 = 1_000_000_000;
/// Largest `tool_output_max_chars`.
pub const MAX_TOOL_OUTPUT_CHARS: u64 = 10_000_000;
/// Smallest `tool_output_max_chars`: a shorter cut leaves the model nothing to read.
pub const MIN_TOOL_OUTPUT_CHARS: u64 = 100;
/// Largest `max_llm_retries`.
pub const MAX_LLM_RETRIES: u32 = 100;
/// Largest `retry_delay_ms`: one hour.
pub const MAX_RETRY_DELAY_MS: u64 = 3_600_000;
/// Largest `max_background_drain_rounds`.
pub const MAX_DRAIN_ROUNDS: u32 = 1_000;
/// Largest `max_repeated_calls` and `warn_repeated_calls`: the look-back that counts
/// repeats walks at most this many turns.
pub const MAX_REPEATED_CALLS: u32 = agentq_agent::state::REPEAT_LOOKBACK;
/// Most entries of `tools` and of `sensitive_tools`.
pub const MAX_TOOLS: usize = 256;
/// Longest tool name, `model` and `base_url` (bytes).
pub const MAX_NAME_LEN: usize = 256;
/// Most top-level entries of `metadata`.
pub const MAX_METADATA_ENTRIES: usize = 256;
/// Longest key anywhere in `metadata` (bytes).
pub const MAX_METADATA_KEY_LEN: usize = 256;
/// Most entries of any one JSON object or array inside `metadata`, and of any object in a
/// request body.
pub const MAX_OBJECT_ENTRIES: usize = 1_000;

/// A value outside the bounds: the field (a path into the body) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

fn violation(field: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        field: field.into(),
        message: message.into(),
    }
}

/// `v` in `min..=max`, or a violation naming `field`.
fn within(field: &str, v: u64, min: u64, max: u64) -> Result<(), Violation> {
    if (min..=max).contains(&v) {
        Ok(())
    } else {
        Err(violation(
            field,
            format!("must be between {min} and {max}, got {v}"),
        ))
    }
}

/// `usize` as `u64` for [`within`]; saturates on a platform where it would not fit.
fn wide(v: usize) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Everything about a spec's shape, in this order (the first failure is named): what
/// [`SessionSpec::validate`] checks, the limits it leaves to the host (the API is a trust
/// boundary: `model`, `base_url` and tool names), then the bounds above. A violation
/// names the field as a path into the body (`tools[3]`, `metadata.user`).
pub fn check_spec(spec: &SessionSpec) -> Result<(), Violation> {
    spec.validate()
        .map_err(|(field, message)| violation(field, message))?;
    check_names(spec)?;
    check_bounds(spec)?;
    check_web_search(spec)
}

/// The web search's options are within their bounds, and a session that names its
/// provider asks for the search only of one that runs it: the search is the provider's
/// own, with no local stand-in. (A session left to the host's provider is held to this
/// by the worker, which knows it.)
fn check_web_search(spec: &SessionSpec) -> Result<(), Violation> {
    if let Some(w) = &spec.web_search {
        w.validate()
            .map_err(|(field, message)| violation(field, message))?;
    }
    if let (Some(i), Some(p)) = (spec.web_search_index(), spec.provider.as_deref())
        && !agentq_agent::provider::factory::searches_the_web(p)
    {
        return Err(violation(
            format!("tools[{i}]"),
            format!(
                "`{WEB_SEARCH_TOOL}` is a search the provider runs itself, and provider \
                 `{p}` cannot (anthropic can)"
            ),
        ));
    }
    Ok(())
}

/// `model`, `base_url` and tool names: 1 to [`MAX_NAME_LEN`] characters without white
/// space or control characters; `base_url` an http(s) URL with a host.
fn check_names(spec: &SessionSpec) -> Result<(), Violation> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_NAME_LEN
            && !s.chars().any(|c| c.is_whitespace() || c.is_control())
    };
    if let Some(m) = &spec.model
        && !name_ok(m)
    {
        return Err(violation(
            "model",
            format!("must be 1 to {MAX_NAME_LEN} characters without spaces"),
        ));
    }
    if let Some(u) = &spec.base_url {
        let rest = u
            .strip_prefix("https://")
            .or_else(|| u.strip_prefix("http://"));
        if !rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/')) || !name_ok(u) {
            return Err(violation("base_url", "must be an http:// or https:// URL"));
        }
    }
    for (field, list) in [
        ("tools", spec.tools.as_deref().unwrap_or_default()),
        ("sensitive_tools", spec.sensitive_tools.as_slice()),
    ] {
        if let Some(i) = list.iter().position(|t| !name_ok(t)) {
            return Err(violation(
                format!("{field}[{i}]"),
                "a tool name is 1 to 256 characters without spaces",
            ));
        }
    }
    Ok(())
}

impl TenantPolicy {
    /// Hold a session request to this tenant's rules: its queue (the queue picks the
    /// worker pool that runs it), then its spec ([`TenantPolicy::apply`]: a value beyond
    /// a bound is refused naming the field, a default above one is lowered to it). The
    /// one policy check of a request, at the scheduler and again at the worker.
    pub fn check_request(
        &self,
        queue: &str,
        spec: &mut SessionSpec,
        sent: Sent<'_>,
        at: SpawnContext,
    ) -> Result<(), PolicyViolation> {
        self.check_queue(queue)?;
        self.apply(spec, sent, at)
    }
}

/// Hold every number, list and string of `spec` to the bounds above. NUL characters are
/// not looked for here: the request decoding refuses them in any string of any body.
fn check_bounds(spec: &SessionSpec) -> Result<(), Violation> {
    within(
        "max_iterations",
        spec.max_iterations.into(),
        1,
        MAX_ITERATIONS.into(),
    )?;
    if !(0.0..=MAX_TEMPERATURE).contains(&spec.temperature) {
        return Err(violation(
            "temperature",
            format!("must be between 0 and {MAX_TEMPERATURE}"),
        ));
    }
    within(
        "max_tokens",
        spec.max_tokens.into(),
        1,
        MAX_OUTPUT_TOKENS.into(),
    )?;
    within(
        "tool_timeout_secs",
        spec.tool_timeout_secs,
        1,
        MAX_TIMEOUT_SECS,
    )?;
    within(
        "approval_timeout_secs",
        spec.approval_timeout_secs,
        1,
        MAX_TIMEOUT_SECS,
    )?;
    within(
        "history_window",
        wide(spec.history_window),
        1,
        MAX_HISTORY_WINDOW,
    )?;
    if let Some(c) = spec.context_budget_chars {
        within("context_budget_chars", wide(c), 0, MAX_CONTEXT_BUDGET_CHARS)?;
    }
    if let Some(t) = spec.token_budget {
        within("token_budget", t, 1, MAX_TOKEN_BUDGET)?;
    }
    if let Some(t) = spec.timeout_secs {
        within("timeout_secs", t, 1, MAX_TIMEOUT_SECS)?;
    }
    if let Some(r) = spec.max_llm_retries {
        within("max_llm_retries", r.into(), 0, MAX_LLM_RETRIES.into())?;
    }
    within("retry_delay_ms", spec.retry_delay_ms, 0, MAX_RETRY_DELAY_MS)?;
    within(
        "max_background_drain_rounds",
        spec.max_background_drain_rounds.into(),
        0,
        MAX_DRAIN_ROUNDS.into(),
    )?;
    // 1 would end a session at its first call of any tool: nothing repeats yet.
    if spec.max_repeated_calls == 1 {
        return Err(violation(
            "max_repeated_calls",
            format!("must be 0 (never) or between 2 and {MAX_REPEATED_CALLS}, got 1"),
        ));
    }
    within(
        "max_repeated_calls",
        spec.max_repeated_calls.into(),
        0,
        MAX_REPEATED_CALLS.into(),
    )?;
    within(
        "warn_repeated_calls",
        spec.warn_repeated_calls.into(),
        0,
        MAX_REPEATED_CALLS.into(),
    )?;
    within(
        "tool_output_max_chars",
        wide(spec.tool_output_max_chars),
        MIN_TOOL_OUTPUT_CHARS,
        MAX_TOOL_OUTPUT_CHARS,
    )?;
    for (field, list) in [
        ("tools", spec.tools.as_deref().unwrap_or_default()),
        ("sensitive_tools", spec.sensitive_tools.as_slice()),
    ] {
        if list.len() > MAX_TOOLS {
            return Err(violation(
                field,
                format!("holds at most {MAX_TOOLS} names, got {}", list.len()),
            ));
        }
    }
    check_metadata(&spec.metadata)
}

/// `metadata`: at most [`MAX_METADATA_ENTRIES`] top-level entries, keys of at most
/// [`MAX_METADATA_KEY_LEN`] bytes and objects and arrays of at most
/// [`MAX_OBJECT_ENTRIES`] entries at any depth. Its total size is the host's to bound.
fn check_metadata(meta: &Value) -> Result<(), Violation> {
    if let Value::Object(m) = meta
        && m.len() > MAX_METADATA_ENTRIES
    {
        return Err(violation(
            "metadata",
            format!(
                "holds at most {MAX_METADATA_ENTRIES} entries, got {}",
                m.len()
            ),
        ));
    }
    check_nested(meta, "metadata")
}

fn check_nested(v: &Value, at: &str) -> Result<(), Violation> {
    match v {
        Value::Object(m) => {
            if m.len() > MAX_OBJECT_ENTRIES {
                return Err(violation(
                    at,
                    format!("holds at most {MAX_OBJECT_ENTRIES} entries"),
                ));
            }
            for (k, v) in m {
                let p = format!("{at}.{k}");
                if k.len() > MAX_METADATA_KEY_LEN {
                    let short: String = k.chars().take(32).collect();
                    return Err(violation(
                        format!("{at}.{short}"),
                        format!("a key is at most {MAX_METADATA_KEY_LEN} bytes"),
                    ));
                }
                check_nested(v, &p)?;
            }
            Ok(())
        }
        Value::Array(a) => {
            if a.len() > MAX_OBJECT_ENTRIES {
                return Err(violation(
                    at,
                    format!("holds at most {MAX_OBJECT_ENTRIES} entries"),
                ));
            }
            a.iter()
                .enumerate()
                .try_for_each(|(i, v)| check_nested(v, &format!("{at}[{i}]")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "request/tests.rs"]
mod tests;
