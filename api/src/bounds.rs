//! The API's hard bounds: the largest (and smallest) value each field of a request may
//! carry, whoever sends it. They keep every number a session is created with inside what
//! the worker can add, multiply and sleep on without overflow, and every list and string
//! inside what one request may cost in memory and storage. A tenant's policy
//! (`[policy]`) may narrow them further; it cannot widen them.
//!
//! [`check_spec`] holds a [`SessionSpec`] to them; a violation names the field as a path
//! into the body (`tools[3]`, `metadata.user`).

use serde_json::Value;

use agentq_agent::spec::SessionSpec;

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

/// Hold every number, list and string of `spec` to the bounds above. NUL characters are
/// not looked for here: the request decoding refuses them in any string of any body.
pub fn check_spec(spec: &SessionSpec) -> Result<(), Violation> {
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
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn field(spec: &SessionSpec) -> Option<String> {
        check_spec(spec).err().map(|v| v.field)
    }

    #[test]
    fn defaults_are_within_the_bounds() {
        assert_eq!(check_spec(&SessionSpec::new("p")), Ok(()));
    }

    #[test]
    fn each_number_has_an_upper_bound_naming_its_field() {
        type Set = fn(&mut SessionSpec, bool);
        // Each case sets its field at the bound (`true`) or one past it (`false`).
        let cases: &[(&str, Set)] = &[
            ("max_iterations", |s, at| {
                s.max_iterations = MAX_ITERATIONS + u32::from(!at)
            }),
            ("max_tokens", |s, at| {
                s.max_tokens = MAX_OUTPUT_TOKENS + u32::from(!at)
            }),
            ("tool_timeout_secs", |s, at| {
                s.tool_timeout_secs = MAX_TIMEOUT_SECS + u64::from(!at)
            }),
            ("approval_timeout_secs", |s, at| {
                s.approval_timeout_secs = MAX_TIMEOUT_SECS + u64::from(!at)
            }),
            ("timeout_secs", |s, at| {
                s.timeout_secs = Some(MAX_TIMEOUT_SECS + u64::from(!at))
            }),
            ("token_budget", |s, at| {
                s.token_budget = Some(MAX_TOKEN_BUDGET + u64::from(!at))
            }),
            ("history_window", |s, at| {
                s.history_window = 100_000 + usize::from(!at)
            }),
            ("context_budget_chars", |s, at| {
                s.context_budget_chars = Some(1_000_000_000 + usize::from(!at))
            }),
            ("max_llm_retries", |s, at| {
                s.max_llm_retries = Some(MAX_LLM_RETRIES + u32::from(!at))
            }),
            ("retry_delay_ms", |s, at| {
                s.retry_delay_ms = MAX_RETRY_DELAY_MS + u64::from(!at)
            }),
            ("max_background_drain_rounds", |s, at| {
                s.max_background_drain_rounds = MAX_DRAIN_ROUNDS + u32::from(!at)
            }),
            ("tool_output_max_chars", |s, at| {
                s.tool_output_max_chars = 10_000_000 + usize::from(!at)
            }),
            ("temperature", |s, at| {
                s.temperature = if at { MAX_TEMPERATURE } else { 2.01 }
            }),
        ];
        for (name, set) in cases {
            let mut s = SessionSpec::new("p");
            set(&mut s, true);
            assert_eq!(field(&s), None, "{name} at its bound");
            set(&mut s, false);
            assert_eq!(field(&s).as_deref(), Some(*name), "{name} past its bound");
        }
        // The values of the reports: far beyond any bound, and nothing wraps.
        let mut s = SessionSpec::new("p");
        s.timeout_secs = Some(9_000_000_000_000_000);
        let v = check_spec(&s).unwrap_err();
        assert_eq!(v.field, "timeout_secs");
        assert!(v.message.contains("2592000"), "{}", v.message);
        let mut s = SessionSpec::new("p");
        s.approval_timeout_secs = u64::MAX;
        assert_eq!(field(&s).as_deref(), Some("approval_timeout_secs"));
        let mut s = SessionSpec::new("p");
        s.temperature = f32::NAN;
        assert_eq!(field(&s).as_deref(), Some("temperature"));
        let mut s = SessionSpec::new("p");
        s.timeout_secs = Some(0);
        assert_eq!(field(&s).as_deref(), Some("timeout_secs"));
    }

    #[test]
    fn lists_and_metadata_are_bounded() {
        let mut s = SessionSpec::new("p");
        s.tools = Some(vec!["t".into(); MAX_TOOLS]);
        assert_eq!(field(&s), None);
        s.tools = Some(vec!["t".into(); MAX_TOOLS + 1]);
        assert_eq!(field(&s).as_deref(), Some("tools"));
        let mut s = SessionSpec::new("p");
        s.sensitive_tools = vec!["t".into(); 10_000];
        assert_eq!(field(&s).as_deref(), Some("sensitive_tools"));

        let entries = |n: usize| {
            Value::Object(
                (0..n)
                    .map(|i| (format!("k{i}"), json!(i)))
                    .collect::<serde_json::Map<_, _>>(),
            )
        };
        let mut s = SessionSpec::new("p");
        s.metadata = entries(MAX_METADATA_ENTRIES);
        assert_eq!(field(&s), None);
        s.metadata = entries(MAX_METADATA_ENTRIES + 1);
        assert_eq!(field(&s).as_deref(), Some("metadata"));
        s.metadata = json!({"a": {"b": entries(MAX_OBJECT_ENTRIES + 1)}});
        assert_eq!(field(&s).as_deref(), Some("metadata.a.b"));
        s.metadata = json!({"a": [1, vec![0; MAX_OBJECT_ENTRIES + 1]]});
        assert_eq!(field(&s).as_deref(), Some("metadata.a[1]"));
        s.metadata = json!({"a": {"x".repeat(MAX_METADATA_KEY_LEN + 1): 1}});
        assert_eq!(field(&s), Some(format!("metadata.a.{}", "x".repeat(32))));
        s.metadata = json!({"a": {"x".repeat(MAX_METADATA_KEY_LEN): 1}});
        assert_eq!(field(&s), None);
    }
}
