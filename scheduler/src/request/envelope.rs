//! The fields of a session request about the request rather than the session's work,
//! typed: `queue`, `idempotency_key` and `priority` ([`Envelope`]), and `workspace_from`
//! ([`Source`]). Each is decoded by its own field deserializer, whose refusals are the
//! messages the API has always answered with; absent and `null` are the same.

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
use serde_json::Value;

use crate::http::MAX_ID_LEN;
use crate::http::body::kind;

pub const MAX_QUEUE_NAME: usize = 64;
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// `queue`, `idempotency_key` and `priority`, decoded in this order: with several bad
/// ones, the first is named.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Envelope {
    #[serde(default, deserialize_with = "queue_name")]
    pub queue: Option<String>,
    #[serde(default, deserialize_with = "idempotency_key")]
    pub idempotency_key: Option<String>,
    #[serde(default, deserialize_with = "priority")]
    pub priority: Option<u8>,
}

/// `workspace_from`: a session id's form (whether that session exists, and is the
/// caller's, the route decides).
#[derive(Debug, Default, Deserialize)]
pub(super) struct Source {
    #[serde(default, deserialize_with = "session_id")]
    pub workspace_from: Option<String>,
}

/// Whether `name` may be a queue: `[A-Za-z0-9_.-]{1,64}` (it becomes part of a Redis key).
pub fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_QUEUE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn queue_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(q) if valid_queue_name(&q) => Ok(Some(q)),
        Value::String(q) => Err(D::Error::custom(format!(
            "invalid queue name {q:?}: use 1 to {MAX_QUEUE_NAME} of A-Z a-z 0-9 _ . -"
        ))),
        other => Err(expected("a string", &other)),
    }
}

fn idempotency_key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(k) if !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY => Ok(Some(k)),
        Value::String(_) => Err(D::Error::custom(format!(
            "must be 1 to {MAX_IDEMPOTENCY_KEY} bytes"
        ))),
        other => Err(expected("a string", &other)),
    }
}

fn priority<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u8>, D::Error> {
    use agentq_core::scheduling::{MAX_PRIORITY, MIN_PRIORITY};
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_u64().and_then(|p| u8::try_from(p).ok()) {
            Some(p) if p <= MAX_PRIORITY => Ok(Some(p)),
            _ => Err(D::Error::custom(format!(
                "must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {n}"
            ))),
        },
        other => Err(expected("an integer from 0 to 9", &other)),
    }
}

fn session_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) if !s.is_empty() && s.len() <= MAX_ID_LEN => Ok(Some(s)),
        Value::String(_) => Err(D::Error::custom(format!(
            "must be a session id (1 to {MAX_ID_LEN} bytes)"
        ))),
        other => Err(expected("a session id", &other)),
    }
}

fn expected<E: serde::de::Error>(what: &str, got: &Value) -> E {
    E::custom(format!("expected {what}, got {}", kind(got)))
}
