//! Request bodies: the JSON extractor ([`JsonBody`]) and the decoding of a body into an
//! API request type ([`decode_object`]) with every failure named like the rest of the API.
//!
//! The body is parsed in two steps: bytes → `serde_json::Value` (a failure is a 400
//! `invalid_json`, answered before the path is looked at), then, in the handler, checks
//! and `Value` → the request type through `serde_path_to_error`, so a wrong value names
//! its field (422).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use serde::de::value::MapDeserializer;
use serde_json::{Map, Value};

use agentq_api::de::{REQUIRED, struct_fields};

use crate::error::ApiError;

/// A JSON body: requires a JSON content type and maps every failure to an [`ApiError`].
///
/// The content type is required (not just tolerated) because the API usually listens on
/// localhost: a browser may send a cross-site `text/plain` POST without a preflight, but
/// not an `application/json` one.
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_json_content_type(ct) {
            return Err(ApiError::UnsupportedMediaType(format!(
                "expected `Content-Type: application/json`, got {}",
                if ct.is_empty() { "none" } else { ct }
            )));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge {
                    field: None,
                    message: "request body is too large".into(),
                }
            } else {
                ApiError::InvalidJson(format!("cannot read the request body: {r}"))
            }
        })?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::InvalidJson(format!("invalid JSON: {e}")))
    }
}

pub(crate) fn is_json_content_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// `prefix.name`, or `name` at the top level (`prefix` names an item of a batch: `[17]`).
pub(crate) fn path(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else if name.starts_with('[') {
        format!("{prefix}{name}")
    } else {
        format!("{prefix}.{name}")
    }
}

/// The body as a JSON object, or a 422 `invalid_body`.
pub fn object(body: Value) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::Invalid {
            code: "invalid_body",
            field: None,
            message: "the body must be a JSON object".into(),
        }),
    }
}

/// Refuse fields `T` does not declare, naming the first.
pub fn known_fields<T: DeserializeOwned>(body: &Map<String, Value>) -> Result<(), ApiError> {
    let declared = struct_fields::<T>();
    match body.keys().find(|k| !declared.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(ApiError::Invalid {
            code: "unknown_field",
            field: Some(k.clone()),
            message: format!(
                "unknown field `{k}` (expected one of {})",
                declared.join(", ")
            ),
        }),
    }
}

/// A body that must be a JSON object of the fields `T` declares, decoded into `T`.
///
/// Unknown fields are refused ([`known_fields`]), all before any value is looked at. The
/// fields are then decoded in `T`'s declared order, each absent one as `null` (the API
/// types' field deserializers read `null` as absent), so that with several bad fields the
/// first declared is the one named, whatever order the client wrote them in.
pub fn decode_object<T: DeserializeOwned>(body: Value) -> Result<T, ApiError> {
    decode_fields(object(body)?)
}

/// [`decode_object`] of a body known to be an object.
pub fn decode_fields<T: DeserializeOwned>(mut body: Map<String, Value>) -> Result<T, ApiError> {
    known_fields::<T>(&body)?;
    let ordered: Vec<(String, Value)> = struct_fields::<T>()
        .iter()
        .map(|name| {
            let v = body.remove(*name).unwrap_or(Value::Null);
            (name.to_string(), v)
        })
        .collect();
    let de = MapDeserializer::<_, serde_json::Error>::new(ordered.into_iter());
    serde_path_to_error::deserialize(de).map_err(|e| field_error(e, ""))
}

/// `Value` → `T`, a failure naming its field under `prefix`.
pub(crate) fn decode_at<T: DeserializeOwned>(
    obj: Map<String, Value>,
    prefix: &str,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(obj)).map_err(|e| field_error(e, prefix))
}

/// A decoding failure as a 422 naming the field it happened at.
fn field_error(e: serde_path_to_error::Error<serde_json::Error>, prefix: &str) -> ApiError {
    let inner = e.inner().to_string();
    let at = e.path().to_string();
    if at == "." {
        // A missing field has no path; its name is in the message.
        if let Some(name) = inner
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
        {
            return ApiError::invalid(path(prefix, name), REQUIRED);
        }
        return ApiError::Invalid {
            code: "invalid_field",
            field: (!prefix.is_empty()).then(|| prefix.to_string()),
            message: inner,
        };
    }
    ApiError::Invalid {
        code: "invalid_field",
        field: Some(path(prefix, &at)),
        message: inner,
    }
}

/// How a value is named in an error: "a string", "an object", …
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use agentq_api::{ApprovalRequest, PostMessage};
    use serde_json::json;

    use super::*;

    fn err<T: DeserializeOwned + std::fmt::Debug>(
        v: Value,
    ) -> (u16, String, Option<String>, String) {
        let e = decode_object::<T>(v).unwrap_err();
        (
            e.status().as_u16(),
            e.code().to_string(),
            e.field().map(str::to_string),
            e.to_string(),
        )
    }

    #[test]
    fn content_types() {
        assert!(is_json_content_type("application/json"));
        assert!(is_json_content_type("Application/JSON; charset=utf-8"));
        assert!(is_json_content_type("application/vnd.agentq+json"));
        assert!(!is_json_content_type("text/plain"));
        assert!(!is_json_content_type(""));
    }

    #[test]
    fn message_bodies() {
        let m: PostMessage = decode_object(json!({"content": "hi"})).unwrap();
        assert_eq!(m.content, "hi");
        let invalid = |f: &str, m: &str| (422, "invalid_field".into(), Some(f.into()), m.into());
        assert_eq!(
            err::<PostMessage>(json!([1])),
            (
                422,
                "invalid_body".into(),
                None,
                "the body must be a JSON object".into()
            )
        );
        assert_eq!(
            err::<PostMessage>(json!({"content": 3, "zzz": 1})),
            (
                422,
                "unknown_field".into(),
                Some("zzz".into()),
                "unknown field `zzz` (expected one of content, strategy)".into()
            )
        );
        assert_eq!(
            err::<PostMessage>(json!({})),
            invalid("content", "is required")
        );
        assert_eq!(
            err::<PostMessage>(json!({"content": null})),
            invalid("content", "is required")
        );
        assert_eq!(
            err::<PostMessage>(json!({"content": 1})),
            invalid("content", "must be a string")
        );
        assert_eq!(
            err::<PostMessage>(json!({"content": " ", "strategy": "x"})),
            invalid("content", "must not be empty")
        );
        assert_eq!(
            err::<PostMessage>(json!({"strategy": "shout", "content": "x"})),
            invalid(
                "strategy",
                "unknown strategy `shout` (expected inject, enqueue, interrupt or reject)"
            )
        );
    }

    #[test]
    fn approval_bodies_name_the_first_declared_bad_field() {
        let invalid = |f: &str, m: &str| (422, "invalid_field".into(), Some(f.into()), m.into());
        assert_eq!(
            err::<ApprovalRequest>(json!({"approve": "x"})),
            invalid("tool_call_id", "is required")
        );
        assert_eq!(
            err::<ApprovalRequest>(json!({"approve": "x", "tool_call_id": "c"})),
            invalid("approve", "must be true or false")
        );
        assert_eq!(
            err::<ApprovalRequest>(json!({"tool_call_id": "c"})),
            invalid("approve", "is required")
        );
        assert_eq!(
            err::<ApprovalRequest>(json!({"tool_call_id": "c", "approve": true, "reason": 1})),
            invalid("reason", "must be a string")
        );
        let a: ApprovalRequest =
            decode_object(json!({"tool_call_id": "c", "approve": false, "reason": null})).unwrap();
        assert_eq!((a.approve, a.reason), (false, None));
    }
}
