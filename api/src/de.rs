//! Decoding helpers of the request types: the field names a type accepts
//! ([`struct_fields`]), and field deserializers whose errors are the messages the API has
//! always answered with ("is required", "must be a string", …), so that a decoding error
//! reads the same as a hand-written check.
//!
//! The field deserializers take `null` like an absent field: a server may decode a body
//! with every absent field set to `null`, so that each field decides in its declared order
//! what absence means.

use serde::de::{self, Deserialize, Deserializer, Error as _, Visitor};
use serde_json::Value;

use agentq_types::protocol::Strategy;

/// The field names `T` reads, in declaration order, as its derived `Deserialize` states
/// them (renames applied). Empty for a type that is not a plain struct (one with a
/// flattened field reads a map and names no fields).
pub fn struct_fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut fields = None;
    // The deserializer records the fields and then fails on purpose: nothing is built.
    let _ = T::deserialize(FieldsOf(&mut fields));
    fields.unwrap_or_default()
}

struct FieldsOf<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for FieldsOf<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(Self::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = Some(fields);
        Err(Self::Error::custom("fields recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// The message of an absent or `null` required field.
pub const REQUIRED: &str = "is required";

/// A required string.
pub fn required_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Err(D::Error::custom(REQUIRED)),
        Value::String(s) => Ok(s),
        _ => Err(D::Error::custom("must be a string")),
    }
}

/// A required string with more than white space in it.
pub fn non_blank_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = required_string(d)?;
    if s.trim().is_empty() {
        return Err(D::Error::custom("must not be empty"));
    }
    Ok(s)
}

/// An optional string (`null` is absent).
pub fn optional_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(D::Error::custom("must be a string")),
    }
}

/// A required `true` or `false`.
pub fn required_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Err(D::Error::custom(REQUIRED)),
        Value::Bool(b) => Ok(b),
        _ => Err(D::Error::custom("must be true or false")),
    }
}

/// A steering strategy by name; absent or `null` is the default (`inject`).
pub fn strategy<'de, D: Deserializer<'de>>(d: D) -> Result<Strategy, D::Error> {
    match optional_string(d)? {
        None => Ok(Strategy::default()),
        Some(name) => Strategy::parse(&name).ok_or_else(|| {
            D::Error::custom(format!(
                "unknown strategy `{name}` (expected inject, enqueue, interrupt or reject)"
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Two {
        #[serde(rename = "b_renamed")]
        b: u32,
        a: String,
    }

    #[test]
    fn fields_come_from_the_derive_in_order() {
        assert_eq!(struct_fields::<Two>(), ["b_renamed", "a"]);
        assert!(struct_fields::<Vec<u32>>().is_empty());
        assert!(struct_fields::<String>().is_empty());
    }

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "non_blank_string")]
        content: String,
        #[serde(default, deserialize_with = "strategy")]
        strategy: Strategy,
        #[serde(default, deserialize_with = "optional_string")]
        reason: Option<String>,
        #[serde(deserialize_with = "required_bool")]
        approve: bool,
    }

    fn err(v: Value) -> String {
        serde_json::from_value::<Body>(v).unwrap_err().to_string()
    }

    #[test]
    fn field_messages() {
        let b: Body = serde_json::from_value(
            json!({"content": "hi", "strategy": null, "reason": null, "approve": true}),
        )
        .unwrap();
        assert_eq!(
            (b.content.as_str(), b.strategy, b.reason, b.approve),
            ("hi", Strategy::Inject, None, true)
        );
        let ok = |v: Value| serde_json::from_value::<Body>(v).unwrap();
        assert_eq!(
            ok(json!({"content": "x", "strategy": "interrupt", "approve": false})).strategy,
            Strategy::Interrupt
        );
        assert_eq!(err(json!({"content": null, "approve": true})), REQUIRED);
        assert_eq!(
            err(json!({"content": 3, "approve": true})),
            "must be a string"
        );
        assert_eq!(
            err(json!({"content": "  ", "approve": true})),
            "must not be empty"
        );
        assert_eq!(
            err(json!({"content": "x", "strategy": "shout", "approve": true})),
            "unknown strategy `shout` (expected inject, enqueue, interrupt or reject)"
        );
        assert_eq!(
            err(json!({"content": "x", "strategy": 1, "approve": true})),
            "must be a string"
        );
        assert_eq!(
            err(json!({"content": "x", "reason": [], "approve": true})),
            "must be a string"
        );
        assert_eq!(err(json!({"content": "x", "approve": null})), REQUIRED);
        assert_eq!(
            err(json!({"content": "x", "approve": "yes"})),
            "must be true or false"
        );
    }
}
