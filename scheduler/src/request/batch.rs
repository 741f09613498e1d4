//! A batch: a JSON array of 1..=`max_batch` session requests, every item checked before
//! anything is written; the first bad one is reported, named by its index (`[17].mode`).

use serde_json::Value;

use crate::error::ApiError;
use crate::http::body::{Shape, kind, scan};

use super::item::{Limits, SessionRequest, parse_session};

/// A batch already parsed into a `Value`.
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
