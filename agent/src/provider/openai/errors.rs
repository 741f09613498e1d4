//! What an OpenAI-compatible server's error answers say: the message and code of the
//! error shapes compatible servers use, whether it is a context overflow, and the cut of a
//! body that is not JSON.

use serde_json::Value;

/// Longest error body kept in an error message when the body is not the usual JSON.
pub(super) const MAX_RAW_ERROR: usize = 500;

/// `(message, code)` from the error shapes compatible servers use: OpenAI's
/// `{"error": {"message", "type", "code"}}`, `{"error": "text"}`, and vLLM/FastAPI-style
/// top-level `message`/`detail`. The code is `error.code`, else `error.type`.
pub(super) fn parse_error_body(body: &str) -> (Option<String>, Option<String>) {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return (None, None);
    };
    let err = match v.get("error") {
        Some(e @ Value::Object(_)) => e,
        Some(Value::String(s)) => return (Some(s.clone()), None),
        _ => &v,
    };
    let message = err
        .get("message")
        .or_else(|| err.get("detail"))
        .and_then(|m| match m {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        });
    (message, error_code(err))
}

pub(super) fn error_code(err: &Value) -> Option<String> {
    let as_code = |v: Option<&Value>| match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    as_code(err.get("code")).or_else(|| as_code(err.get("type")))
}

pub(super) fn is_context_length(status: u16, code: Option<&str>, message: &str) -> bool {
    if !matches!(status, 400 | 413) {
        return false;
    }
    if matches!(
        code,
        Some("context_length_exceeded" | "exceed_context_size_error")
    ) {
        return true;
    }
    let m = message.to_ascii_lowercase();
    m.contains("maximum context length") || m.contains("context_length_exceeded")
}

pub(super) fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
