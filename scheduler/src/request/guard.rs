//! The checks of a request item that come before any of its values is decoded, in the
//! order the API keeps: the item is an object; no field is named like a credential (its
//! own code: provider keys live in the worker's configuration and must never be stored
//! in a session row) and none is unknown (a typo such as `max_iteration` would otherwise
//! run the session with the default silently); `metadata` holds no credential-named key
//! at any depth, is an object, and is not too large; and `prompt` and `system` are
//! within the size limit (a 413 even when another field is also wrong) and `prompt` is
//! there.

use serde_json::{Map, Value};

use agentq_api::CreateSession;
use agentq_core::config::is_credential_name;

use crate::error::ApiError;
use crate::http::body::{kind, path};

/// Serialised size of `metadata`.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// The item as an object, or a 422 `invalid_body` naming the item in a batch.
pub(super) fn item_object(value: Value, prefix: &str) -> Result<Map<String, Value>, ApiError> {
    match value {
        Value::Object(obj) => Ok(obj),
        other => Err(ApiError::Invalid {
            code: "invalid_body",
            field: (!prefix.is_empty()).then(|| prefix.to_string()),
            message: format!("expected a JSON object, got {}", kind(&other)),
        }),
    }
}

/// The first field (in key order) named like a credential, or unknown to the API.
pub(super) fn check_field_names(obj: &Map<String, Value>, prefix: &str) -> Result<(), ApiError> {
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
    Ok(())
}

/// `metadata`, when sent: no credential-named key anywhere in it, an object (or `null`),
/// at most [`MAX_METADATA_BYTES`] serialised.
pub(super) fn check_metadata(meta: Option<&Value>, prefix: &str) -> Result<(), ApiError> {
    let Some(meta) = meta else {
        return Ok(());
    };
    let at = path(prefix, "metadata");
    if let Some(found) = credential_in(meta, &at) {
        return Err(credential_error(&found));
    }
    if !(meta.is_null() || meta.is_object()) {
        return Err(ApiError::invalid(
            at,
            format!("expected a JSON object, got {}", kind(meta)),
        ));
    }
    if meta.to_string().len() > MAX_METADATA_BYTES {
        return Err(ApiError::TooLarge {
            field: Some(at),
            message: format!("metadata is larger than {MAX_METADATA_BYTES} bytes"),
        });
    }
    Ok(())
}

/// `prompt` and `system` within `max_bytes` (checked before the type of any other
/// field: a huge prompt is refused as such), and `prompt` present.
pub(super) fn check_prompt(
    obj: &Map<String, Value>,
    max_bytes: usize,
    prefix: &str,
) -> Result<(), ApiError> {
    for field in ["prompt", "system"] {
        if let Some(Value::String(s)) = obj.get(field)
            && s.len() > max_bytes
        {
            return Err(ApiError::TooLarge {
                field: Some(path(prefix, field)),
                message: format!("{field} is {} bytes; the limit is {max_bytes}", s.len()),
            });
        }
    }
    if !obj.contains_key("prompt") {
        return Err(ApiError::invalid(path(prefix, "prompt"), "is required"));
    }
    Ok(())
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
