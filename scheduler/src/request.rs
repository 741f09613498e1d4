//! What a client may send to create sessions: the checks that turn a body into
//! [`SessionRequest`]s, and the query of `GET /v1/sessions`. Everything here runs before
//! anything is written, so a rejected request (or a batch with one bad item) leaves no
//! trace.
//!
//! A body is an [`agentq_api::CreateSession`] (a batch: a JSON array of them). Its
//! fields are checked on the `Value` before it is decoded, in an order the API keeps:
//! unknown fields are refused rather than ignored (a typo such as `max_iteration` would
//! otherwise run the session with the default silently), fields named like credentials
//! are refused with a code of their own (provider keys live in the worker's
//! configuration and must never be stored in a session row), and a prompt over the limit
//! is a 413 even when another field is also wrong. The spec is then decoded through
//! `serde_path_to_error`, so a wrong type names its field (422). Last, [`admit`] holds
//! the request to its tenant's policy (422 naming the field).

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::Value;

use agentq_agent::spec::SessionSpec;
use agentq_api::CreateSession;
use agentq_api::bounds::{self, MAX_NAME_LEN};
use agentq_core::config::is_credential_name;
use agentq_core::policy::{Sent, SpawnContext, TenantPolicy};
use agentq_core::workspace::InputFile;
use agentq_core::workspace_path::FileLimits;

use crate::error::ApiError;
use crate::http::body::{Shape, decode_at, kind, no_nul, path, scan};
use crate::inputs::{parse_files, parse_workspace_from};

pub use crate::http::body::{decode_json, decode_object};
pub use crate::http::{JsonBody, RawJson};

/// The queue of a session that names none.
pub const DEFAULT_QUEUE: &str = "default";
pub const MAX_QUEUE_NAME: usize = 64;
pub const MAX_IDEMPOTENCY_KEY: usize = 256;
/// Serialised size of `metadata`.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Limits of one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_prompt_bytes: usize,
    pub max_batch: usize,
    /// What its `files` may hold (the tenant's policy).
    pub files: FileLimits,
}

/// One validated session request.
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

/// Hold a parsed request to its tenant's policy (`prefix` names it inside a batch): a
/// value beyond it is refused naming the field; a default above a bound is lowered to it.
pub fn admit(
    req: &mut SessionRequest,
    policy: &TenantPolicy,
    prefix: &str,
) -> Result<(), ApiError> {
    policy
        .check_queue(&req.queue)
        .and_then(|()| {
            policy.admit(
                &mut req.spec,
                Sent::Fields(&req.sent),
                SpawnContext::default(),
            )
        })
        .map_err(|v| ApiError::invalid(path(prefix, v.field), v.message))
}

/// [`admit`] for every item of a batch, each named by its index (`[3].base_url`).
pub fn admit_batch(reqs: &mut [SessionRequest], policy: &TenantPolicy) -> Result<(), ApiError> {
    for (i, req) in reqs.iter_mut().enumerate() {
        admit(req, policy, &format!("[{i}]"))?;
    }
    Ok(())
}

/// Whether `name` may be a queue: `[A-Za-z0-9_.-]{1,64}` (it becomes part of a Redis key).
pub fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// One session request (`prefix` names it inside a batch, e.g. `[17]`).
pub fn parse_session(
    value: Value,
    limits: &Limits,
    prefix: &str,
) -> Result<SessionRequest, ApiError> {
    let Value::Object(mut obj) = value else {
        return Err(ApiError::Invalid {
            code: "invalid_body",
            field: (!prefix.is_empty()).then(|| prefix.to_string()),
            message: format!("expected a JSON object, got {}", kind(&value)),
        });
    };

    for key in obj.keys() {
        if is_credential_name(key) {
            return Err(credential_error(&path(prefix, key)));
        }
        if !CreateSession::accepts(key) {
            return Err(ApiError::Invalid {
                code: "unknown_field",
                field: Some(path(prefix, key)),
                message: format!("unknown field `{key}`"),
            });
        }
    }
    if let Some(meta) = obj.get("metadata") {
        if let Some(found) = credential_in(meta, &path(prefix, "metadata")) {
            return Err(credential_error(&found));
        }
        if !(meta.is_null() || meta.is_object()) {
            return Err(ApiError::invalid(
                path(prefix, "metadata"),
                format!("expected a JSON object, got {}", kind(meta)),
            ));
        }
        if meta.to_string().len() > MAX_METADATA_BYTES {
            return Err(ApiError::TooLarge {
                field: Some(path(prefix, "metadata")),
                message: format!("metadata is larger than {MAX_METADATA_BYTES} bytes"),
            });
        }
    }

    let queue = match obj.remove("queue") {
        None | Some(Value::Null) => None,
        Some(Value::String(q)) if valid_queue_name(&q) => Some(q),
        Some(Value::String(q)) => {
            return Err(ApiError::invalid(
                path(prefix, "queue"),
                format!("invalid queue name {q:?}: use 1 to {MAX_QUEUE_NAME} of A-Z a-z 0-9 _ . -"),
            ));
        }
        Some(other) => {
            return Err(ApiError::invalid(
                path(prefix, "queue"),
                format!("expected a string, got {}", kind(&other)),
            ));
        }
    };
    let idempotency_key = match obj.remove("idempotency_key") {
        None | Some(Value::Null) => None,
        Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY => Some(k),
        Some(Value::String(_)) => {
            return Err(ApiError::invalid(
                path(prefix, "idempotency_key"),
                format!("must be 1 to {MAX_IDEMPOTENCY_KEY} bytes"),
            ));
        }
        Some(other) => {
            return Err(ApiError::invalid(
                path(prefix, "idempotency_key"),
                format!("expected a string, got {}", kind(&other)),
            ));
        }
    };
    let priority = match obj.remove("priority") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64().and_then(|p| u8::try_from(p).ok()) {
            Some(p) if p <= agentq_core::scheduling::MAX_PRIORITY => Some(p),
            _ => {
                return Err(ApiError::invalid(
                    path(prefix, "priority"),
                    format!(
                        "must be an integer from {} to {}, got {n}",
                        agentq_core::scheduling::MIN_PRIORITY,
                        agentq_core::scheduling::MAX_PRIORITY
                    ),
                ));
            }
        },
        Some(other) => {
            return Err(ApiError::invalid(
                path(prefix, "priority"),
                format!("expected an integer from 0 to 9, got {}", kind(&other)),
            ));
        }
    };

    // Size before type checks of the rest: a huge prompt is refused as such (413) even
    // when another field is also wrong.
    for field in ["prompt", "system"] {
        if let Some(Value::String(s)) = obj.get(field)
            && s.len() > limits.max_prompt_bytes
        {
            return Err(ApiError::TooLarge {
                field: Some(path(prefix, field)),
                message: format!(
                    "{field} is {} bytes; the limit is {}",
                    s.len(),
                    limits.max_prompt_bytes
                ),
            });
        }
    }
    if !obj.contains_key("prompt") {
        return Err(ApiError::invalid(path(prefix, "prompt"), "is required"));
    }
    let workspace_from = parse_workspace_from(obj.remove("workspace_from"), prefix)?;
    let files_value = obj.remove("files");

    let sent: BTreeSet<String> = obj.keys().cloned().collect();
    let spec = decode_at::<SessionSpec>(obj, prefix)?;
    spec.validate()
        .map_err(|(field, message)| ApiError::invalid(path(prefix, field), message))?;
    check_extra(&spec, prefix)?;
    // Last: the spec's errors come first, and its checks are cheaper than decoding files.
    let files = parse_files(files_value, &limits.files, prefix)?;
    Ok(SessionRequest {
        spec,
        queue: queue.unwrap_or_else(|| DEFAULT_QUEUE.to_string()),
        idempotency_key,
        priority: priority.unwrap_or(agentq_core::scheduling::DEFAULT_PRIORITY),
        sent,
        files,
        workspace_from,
    })
}

/// A batch: a JSON array of 1..=`max_batch` session requests. Every item is checked
/// before anything is written; the first bad one is reported (`[17].mode`).
pub fn parse_batch(value: Value, limits: &Limits) -> Result<Vec<SessionRequest>, ApiError> {
    let Value::Array(items) = value else {
        return Err(ApiError::Invalid {
            code: "invalid_body",
            field: None,
            message: format!("expected a JSON array of sessions, got {}", kind(&value)),
        });
    };
    check_batch_len(items.len(), limits)?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| parse_session(v, limits, &format!("[{i}]")))
        .collect()
}

/// [`parse_batch`] of a body's bytes, decoding each item straight from them: the
/// body is [`scan`]ned, then each item becomes a `Value` only while it is checked, so
/// parsing holds the body, one item and the requests built so far — about twice the
/// body — where a whole-body `Value` took several times its size.
pub fn parse_batch_bytes(bytes: &[u8], limits: &Limits) -> Result<Vec<SessionRequest>, ApiError> {
    let n = match scan(bytes)? {
        Shape::Array(n) => n,
        other => {
            return Err(ApiError::Invalid {
                code: "invalid_body",
                field: None,
                message: format!("expected a JSON array of sessions, got {}", other.kind()),
            });
        }
    };
    check_batch_len(n, limits)?;
    let mut items = Items {
        limits,
        out: Vec::with_capacity(n),
        refused: None,
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    match serde::Deserializer::deserialize_seq(&mut de, &mut items) {
        Ok(()) => Ok(items.out),
        Err(e) => Err(items
            .refused
            .unwrap_or_else(|| ApiError::InvalidJson(format!("invalid JSON: {e}")))),
    }
}

fn check_batch_len(n: usize, limits: &Limits) -> Result<(), ApiError> {
    if n == 0 || n > limits.max_batch {
        return Err(ApiError::Invalid {
            code: "invalid_batch",
            field: None,
            message: format!("a batch holds 1 to {} sessions, got {n}", limits.max_batch),
        });
    }
    Ok(())
}

/// The items of a batch, parsed one by one as the array is read.
struct Items<'a> {
    limits: &'a Limits,
    out: Vec<SessionRequest>,
    /// Why an item was refused (the parse is stopped with a placeholder error).
    refused: Option<ApiError>,
}

impl<'de> serde::de::Visitor<'de> for &mut Items<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of sessions")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<Value>()? {
            let at = format!("[{}]", self.out.len());
            match parse_session(item, self.limits, &at) {
                Ok(req) => self.out.push(req),
                Err(e) => {
                    self.refused = Some(e);
                    return Err(serde::de::Error::custom("item refused"));
                }
            }
        }
        Ok(())
    }
}

/// Limits `SessionSpec::validate` leaves to the host: the API is a trust boundary.
fn check_extra(spec: &SessionSpec, prefix: &str) -> Result<(), ApiError> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_NAME_LEN
            && !s.chars().any(|c| c.is_whitespace() || c.is_control())
    };
    if let Some(m) = &spec.model
        && !name_ok(m)
    {
        return Err(ApiError::invalid(
            path(prefix, "model"),
            format!("must be 1 to {MAX_NAME_LEN} characters without spaces"),
        ));
    }
    if let Some(u) = &spec.base_url {
        let rest = u
            .strip_prefix("https://")
            .or_else(|| u.strip_prefix("http://"));
        if !rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/')) || !name_ok(u) {
            return Err(ApiError::invalid(
                path(prefix, "base_url"),
                "must be an http:// or https:// URL",
            ));
        }
    }
    for (field, list) in [
        ("tools", spec.tools.as_deref().unwrap_or_default()),
        ("sensitive_tools", spec.sensitive_tools.as_slice()),
    ] {
        if let Some(i) = list.iter().position(|t| !name_ok(t)) {
            return Err(ApiError::invalid(
                path(prefix, &format!("{field}[{i}]")),
                "a tool name is 1 to 256 characters without spaces",
            ));
        }
    }
    bounds::check_spec(spec).map_err(|v| ApiError::invalid(path(prefix, &v.field), v.message))
}

fn credential_error(field: &str) -> ApiError {
    ApiError::Invalid {
        code: "credential_not_allowed",
        field: Some(field.to_string()),
        message: "credentials are not accepted in a session: provider keys are configured \
                  on the workers"
            .into(),
    }
}

/// The path of the first object key named like a credential anywhere inside `v`.
fn credential_in(v: &Value, at: &str) -> Option<String> {
    match v {
        Value::Object(m) => m.iter().find_map(|(k, v)| {
            let p = format!("{at}.{k}");
            if is_credential_name(k) {
                Some(p)
            } else {
                credential_in(v, &p)
            }
        }),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| credential_in(v, &format!("{at}[{i}]"))),
        _ => None,
    }
}

/// Query of `GET /v1/sessions`: all strings, parsed by hand so each error names its field.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    pub status: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
    pub parent_id: Option<String>,
}

impl ListQuery {
    /// A NUL character in any parameter is a 422 naming it, as in a body.
    pub fn check_text(&self) -> Result<(), ApiError> {
        for (field, v) in [
            ("status", &self.status),
            ("limit", &self.limit),
            ("cursor", &self.cursor),
            ("parent_id", &self.parent_id),
        ] {
            if let Some(v) = v {
                no_nul(field, v)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    const LIMITS: Limits = Limits {
        max_prompt_bytes: 100,
        max_batch: 3,
        files: FileLimits::DEFAULT,
    };

    fn err(v: Value) -> (u16, String, Option<String>) {
        let e = parse_session(v, &LIMITS, "").unwrap_err();
        (
            e.status().as_u16(),
            e.code().to_string(),
            e.field().map(str::to_string),
        )
    }

    #[test]
    fn every_spec_field_is_accepted() {
        // A spec with every optional field set serialises every field name: the API
        // type's list of spec fields must be exactly those, and each must parse back.
        let mut spec = SessionSpec::new("hi");
        spec.system = Some("s".into());
        spec.provider = Some("openai".into());
        spec.model = Some("m".into());
        spec.base_url = Some("http://x".into());
        spec.tools = Some(vec!["read_file".into()]);
        spec.context_budget_chars = Some(1);
        spec.token_budget = Some(1);
        spec.timeout_secs = Some(1);
        spec.max_llm_retries = Some(1);
        spec.sensitive_tools = vec!["shell".into()];
        spec.metadata = json!({"k": 1});
        let Value::Object(m) = serde_json::to_value(&spec).unwrap() else {
            panic!()
        };
        let mut names: Vec<&str> = m.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut known = CreateSession::spec_fields().to_vec();
        known.sort_unstable();
        assert_eq!(names, known);
        let req = parse_session(Value::Object(m), &LIMITS, "").unwrap();
        assert_eq!(req.spec, spec);
        assert_eq!(req.queue, "default");
    }

    #[test]
    fn good_request() {
        let r = parse_session(
            json!({"prompt": "p", "mode": "plan-act", "queue": "batch.v2", "idempotency_key": "k1",
                   "max_iterations": 3, "temperature": 0.5, "metadata": {"user": "u"}}),
            &LIMITS,
            "",
        )
        .unwrap();
        assert_eq!(r.queue, "batch.v2");
        assert_eq!(r.idempotency_key.as_deref(), Some("k1"));
        assert_eq!(r.spec.max_iterations, 3);
        assert_eq!(r.spec.mode, agentq_agent::spec::Mode::PlanAct);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let f = |s: &str| Some(s.to_string());
        assert_eq!(err(json!([])), (422, "invalid_body".into(), None));
        assert_eq!(err(json!({})), (422, "invalid_field".into(), f("prompt")));
        assert_eq!(
            err(json!({"prompt": 3})),
            (422, "invalid_field".into(), f("prompt"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "mode": "fast"})),
            (422, "invalid_field".into(), f("mode"))
        );
        let e = parse_session(json!({"prompt": "p", "mode": "fast"}), &LIMITS, "").unwrap_err();
        assert!(e.to_string().contains("plan-act"), "{e}");
        assert_eq!(
            err(json!({"prompt": "p", "max_iterations": -1})),
            (422, "invalid_field".into(), f("max_iterations"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "temperature": 5})),
            (422, "invalid_field".into(), f("temperature"))
        );
        assert_eq!(
            err(json!({"prompt": "x".repeat(101)})),
            (413, "too_large".into(), f("prompt"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "queue": "a b"})),
            (422, "invalid_field".into(), f("queue"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "queue": "x".repeat(65)})),
            (422, "invalid_field".into(), f("queue"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "api_key": "sk"})),
            (422, "credential_not_allowed".into(), f("api_key"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "metadata": {"a": [{"openai_api_key": "sk"}]}})),
            (
                422,
                "credential_not_allowed".into(),
                f("metadata.a[0].openai_api_key")
            )
        );
        assert_eq!(
            err(json!({"prompt": "p", "max_iteration": 3})),
            (422, "unknown_field".into(), f("max_iteration"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "provider": "gemini"})),
            (422, "invalid_field".into(), f("provider"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "tools": ["a", 3]})),
            (422, "invalid_field".into(), f("tools[1]"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "base_url": "file:///etc/passwd"})),
            (422, "invalid_field".into(), f("base_url"))
        );
        // Each of these would let the host's key reach a place nobody configured.
        for bad in [
            "http://user:pw@llm.test/v1",
            "http://llm.test/v1?x=/",
            "http://llm.test/v1#f",
            "ftp://llm.test/v1",
        ] {
            assert_eq!(
                err(json!({"prompt": "p", "base_url": bad})),
                (422, "invalid_field".into(), f("base_url")),
                "{bad}"
            );
        }
        assert_eq!(
            err(json!({"prompt": "p", "metadata": [1]})),
            (422, "invalid_field".into(), f("metadata"))
        );
        assert_eq!(
            err(json!({"prompt": "p", "idempotency_key": ""})),
            (422, "invalid_field".into(), f("idempotency_key"))
        );
    }

    #[test]
    fn batch_items_are_prefixed() {
        let e = parse_batch(
            json!([{"prompt": "a"}, {"prompt": "b", "mode": "x"}]),
            &LIMITS,
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("[1].mode"));
        let e = parse_batch(json!([{"prompt": "a"}, {}]), &LIMITS).unwrap_err();
        assert_eq!(e.field(), Some("[1].prompt"));
        let e = parse_batch(json!([{"prompt": "a"}, 7]), &LIMITS).unwrap_err();
        assert_eq!(e.field(), Some("[1]"));
        assert_eq!(
            parse_batch(json!([]), &LIMITS).unwrap_err().code(),
            "invalid_batch"
        );
        let four = json!([{"prompt": "a"}, {"prompt": "a"}, {"prompt": "a"}, {"prompt": "a"}]);
        assert_eq!(
            parse_batch(four, &LIMITS).unwrap_err().code(),
            "invalid_batch"
        );
        assert_eq!(
            parse_batch(json!({"prompt": "a"}), &LIMITS)
                .unwrap_err()
                .code(),
            "invalid_body"
        );
        assert_eq!(
            parse_batch(json!([{"prompt": "a"}]), &LIMITS)
                .unwrap()
                .len(),
            1
        );
    }
}
