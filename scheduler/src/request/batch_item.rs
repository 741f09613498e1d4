//! An item of a batch object (`POST /v1/batches`: an element of `requests`, or a line of
//! an upload) and the batch's options: the item's `custom_id` is taken out and checked,
//! and the rest is a session request, checked by [`parse_session`] exactly as `POST
//! /v1/sessions` checks one (`prefix` names the item: `requests[3]`, `line 17`).

use serde_json::{Map, Value};

use agentq_api::{MAX_BATCH_RUNNING, MAX_CUSTOM_ID};

use crate::error::ApiError;
use crate::http::body::{kind, path};

use super::guard::check_metadata;
use super::item::{Limits, SessionRequest, parse_session};

/// One item: its session request and its `custom_id`.
pub fn parse_batch_item(
    value: Value,
    limits: &Limits,
    prefix: &str,
) -> Result<(SessionRequest, Option<String>), ApiError> {
    let (value, custom) = match value {
        Value::Object(mut obj) => {
            let custom = obj.remove("custom_id");
            (Value::Object(obj), custom)
        }
        // Not an object: the session's parse names it.
        other => (other, None),
    };
    let custom_id = match custom {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_CUSTOM_ID => Some(s),
        Some(Value::String(s)) => {
            return Err(ApiError::invalid(
                path(prefix, "custom_id"),
                format!("must be 1 to {MAX_CUSTOM_ID} bytes, got {} bytes", s.len()),
            ));
        }
        Some(other) => {
            return Err(ApiError::invalid(
                path(prefix, "custom_id"),
                format!("expected a string, got {}", kind(&other)),
            ));
        }
    };
    Ok((parse_session(value, limits, prefix)?, custom_id))
}

/// A batch's options: its cap on sessions running at once and its metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchOptions {
    pub max_running: Option<u32>,
    pub metadata: Map<String, Value>,
}

impl BatchOptions {
    /// From a JSON body's fields (each absent as `null`).
    pub fn from_fields(max_running: Value, metadata: Value) -> Result<BatchOptions, ApiError> {
        let max_running = match max_running {
            Value::Null => None,
            Value::Number(n) => Some(running(&n.to_string())?),
            other => {
                return Err(ApiError::invalid(
                    "max_running",
                    format!("expected an integer, got {}", kind(&other)),
                ));
            }
        };
        Ok(BatchOptions {
            max_running,
            metadata: metadata_of(metadata)?,
        })
    }

    /// From a query's parameters (an upload's): `max_running`, and `metadata` as a JSON
    /// object.
    pub fn from_query(
        max_running: Option<&str>,
        metadata: Option<&str>,
    ) -> Result<BatchOptions, ApiError> {
        let metadata = match metadata {
            None => Value::Null,
            Some(text) => serde_json::from_str(text).map_err(|e| {
                ApiError::invalid("metadata", format!("expected a JSON object: {e}"))
            })?,
        };
        Ok(BatchOptions {
            max_running: max_running.map(running).transpose()?,
            metadata: metadata_of(metadata)?,
        })
    }
}

fn running(v: &str) -> Result<u32, ApiError> {
    v.parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_BATCH_RUNNING).contains(n))
        .ok_or_else(|| {
            ApiError::invalid(
                "max_running",
                format!("must be an integer from 1 to {MAX_BATCH_RUNNING}, got {v:?}"),
            )
        })
}

/// A batch's `metadata`, held to a session's rules (no credential-named key anywhere, an
/// object, at most 64 KiB).
fn metadata_of(v: Value) -> Result<Map<String, Value>, ApiError> {
    check_metadata(Some(&v), "")?;
    Ok(match v {
        Value::Object(m) => m,
        _ => Map::new(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use agentq_core::workspace_path::FileLimits;

    const LIMITS: Limits = Limits {
        max_prompt_bytes: 100,
        max_batch: 3,
        files: FileLimits::DEFAULT,
    };

    fn field(e: ApiError) -> (u16, String) {
        (
            e.status().as_u16(),
            e.field().unwrap_or_default().to_string(),
        )
    }

    #[test]
    fn an_item_is_a_session_request_with_a_custom_id() {
        let (req, custom) = parse_batch_item(
            json!({"prompt": "p", "custom_id": "row-7", "priority": 2}),
            &LIMITS,
            "line 3",
        )
        .unwrap();
        assert_eq!(custom.as_deref(), Some("row-7"));
        assert_eq!((req.spec.prompt.as_str(), req.priority), ("p", 2));
        let (_, none) =
            parse_batch_item(json!({"prompt": "p", "custom_id": null}), &LIMITS, "").unwrap();
        assert_eq!(none, None);
    }

    #[test]
    fn a_bad_custom_id_or_session_is_named_under_the_item() {
        let e = parse_batch_item(json!({"prompt": "p", "custom_id": 7}), &LIMITS, "line 2");
        assert_eq!(field(e.unwrap_err()), (422, "line 2.custom_id".into()));
        let long = "x".repeat(MAX_CUSTOM_ID + 1);
        let e = parse_batch_item(
            json!({"prompt": "p", "custom_id": long}),
            &LIMITS,
            "requests[0]",
        );
        assert_eq!(field(e.unwrap_err()), (422, "requests[0].custom_id".into()));
        let e = parse_batch_item(
            json!({"prompt": "p", "custom_id": ""}),
            &LIMITS,
            "requests[0]",
        );
        assert_eq!(field(e.unwrap_err()), (422, "requests[0].custom_id".into()));
        // The session's own checks, named the same way.
        let e = parse_batch_item(json!({"prompt": "p", "mode": "nope"}), &LIMITS, "line 9");
        assert_eq!(field(e.unwrap_err()), (422, "line 9.mode".into()));
        let e = parse_batch_item(json!({"prompt": "p", "api_key": "sk"}), &LIMITS, "line 9");
        assert_eq!(field(e.unwrap_err()), (422, "line 9.api_key".into()));
        let e = parse_batch_item(json!(["not", "an", "object"]), &LIMITS, "line 4");
        assert_eq!(field(e.unwrap_err()), (422, "line 4".into()));
        let e = parse_batch_item(json!({"prompt": "x".repeat(101)}), &LIMITS, "line 5");
        assert_eq!(field(e.unwrap_err()), (413, "line 5.prompt".into()));
    }

    #[test]
    fn options_from_fields_and_query() {
        let o = BatchOptions::from_fields(json!(5), json!({"team": "a"})).unwrap();
        assert_eq!(o.max_running, Some(5));
        assert_eq!(o.metadata["team"], "a");
        let o = BatchOptions::from_query(Some("7"), Some(r#"{"run":1}"#)).unwrap();
        assert_eq!(
            (o.max_running, o.metadata["run"].clone()),
            (Some(7), json!(1))
        );
        assert_eq!(
            BatchOptions::from_query(None, None).unwrap(),
            BatchOptions::default()
        );
        for (running, meta, named) in [
            (Some("0"), None, "max_running"),
            (Some("1000001"), None, "max_running"),
            (Some("two"), None, "max_running"),
            (None, Some("not json"), "metadata"),
            (None, Some("[1]"), "metadata"),
            (None, Some(r#"{"password":"x"}"#), "metadata.password"),
        ] {
            let e = BatchOptions::from_query(running, meta).unwrap_err();
            assert_eq!(field(e), (422, named.to_string()), "{running:?} {meta:?}");
        }
        let e = BatchOptions::from_fields(json!("5"), Value::Null).unwrap_err();
        assert_eq!(field(e), (422, "max_running".into()));
        let e = BatchOptions::from_fields(json!(-1), Value::Null).unwrap_err();
        assert_eq!(field(e), (422, "max_running".into()));
        let big = json!({"k": "v".repeat(70 * 1024)});
        let e = BatchOptions::from_fields(Value::Null, big).unwrap_err();
        assert_eq!(field(e), (413, "metadata".into()));
    }
}
