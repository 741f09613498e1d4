//! The one rule by which both stores keep text that Postgres cannot hold: U+0000 (NUL),
//! which neither Postgres' `text` nor its `jsonb` can store, and which its `json`
//! operators refuse to extract. A model's answer, a tool's output or a caller's input may
//! contain it, and the store must give it back exactly as it came.
//!
//! Every text value the stores write (and every string inside a JSON document they
//! write, keys included) is escaped with [`ESC`], U+FDD0, a Unicode noncharacter (set
//! aside for a program's internal use, never assigned):
//!
//! | in the value | stored as      |
//! |--------------|----------------|
//! | U+0000       | `ESC` `0`      |
//! | `ESC`        | `ESC` `ESC`    |
//! | anything else| itself         |
//!
//! The rule is injective (each stored form has one decoding: after an `ESC` comes `0` or
//! `ESC`), and every read of those columns decodes it ([`Text`], [`Doc`]), so a value
//! reads back byte for byte, on either store. Text without NUL or `ESC` is stored as it
//! is, so rows written before the rule read back unchanged unless they held an `ESC`
//! followed by `0` or `ESC` (a noncharacter pair nothing had reason to write).
//!
//! For a JSON document the rule is applied to its serialized text, where a NUL is the
//! escape `\u0000` (how `serde_json` writes it) and `ESC` is written as itself: the
//! result is the document whose strings are escaped. Decoding undoes it on the text
//! before parsing.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use sqlx::error::BoxDynError;
use sqlx::types::Json;
use sqlx::{Database, Decode, Type};

/// The escape character (see the module docs).
pub(crate) const ESC: char = '\u{FDD0}';

/// `ESC` followed by this stands for U+0000.
const NUL_MARK: char = '0';

/// A value as stored.
pub(crate) fn escape_text(s: &str) -> Cow<'_, str> {
    if !s.contains(['\0', ESC]) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len().saturating_add(8));
    for c in s.chars() {
        match c {
            '\0' => {
                out.push(ESC);
                out.push(NUL_MARK);
            }
            ESC => {
                out.push(ESC);
                out.push(ESC);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`escape_text`] of an optional value.
pub(crate) fn escape_opt(s: Option<&str>) -> Option<Cow<'_, str>> {
    s.map(escape_text)
}

/// Ids (of tool calls: a model's choice) as stored, for a statement that compares them
/// with a stored column.
pub(crate) fn stored_ids(ids: &[String]) -> Vec<String> {
    ids.iter().map(|id| escape_text(id).into_owned()).collect()
}

/// A stored value as it was given.
pub(crate) fn unescape_text(s: &str) -> Cow<'_, str> {
    if !s.contains(ESC) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != ESC {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some(&NUL_MARK) => {
                chars.next();
                out.push('\0');
            }
            Some(&ESC) => {
                chars.next();
                out.push(ESC);
            }
            // Not a stored form: text from before the rule, kept as it is.
            _ => out.push(ESC),
        }
    }
    Cow::Owned(out)
}

/// A serialized JSON document as stored: its strings escaped.
pub(crate) fn escape_json(json: &str) -> Cow<'_, str> {
    if !json.contains("\\u0000") && !json.contains(ESC) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len().saturating_add(8));
    let mut rest = json;
    while let Some(i) = rest.find(['\\', ESC]) {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix(ESC) {
            out.push(ESC);
            out.push(ESC);
            rest = after;
        } else if let Some(after) = rest.strip_prefix("\\u0000") {
            out.push(ESC);
            out.push(NUL_MARK);
            rest = after;
        } else {
            // Any other escape, kept whole, so that `\\` never starts a `\u0000`.
            let len = rest[1..].chars().next().map_or(1, |c| 1 + c.len_utf8());
            out.push_str(&rest[..len]);
            rest = &rest[len..];
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// A stored JSON document's text as it was given.
pub(crate) fn unescape_json(json: &str) -> Cow<'_, str> {
    if !json.contains(ESC) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len().saturating_add(8));
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if c != ESC {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some(&NUL_MARK) => {
                chars.next();
                out.push_str("\\u0000");
            }
            Some(&ESC) => {
                chars.next();
                out.push(ESC);
            }
            _ => out.push(ESC),
        }
    }
    Cow::Owned(out)
}

/// `value` serialized as stored.
pub(crate) fn to_stored_json<T: serde::Serialize + ?Sized>(
    value: &T,
) -> serde_json::Result<String> {
    let json = serde_json::to_string(value)?;
    Ok(match escape_json(&json) {
        Cow::Borrowed(_) => json,
        Cow::Owned(s) => s,
    })
}

/// `value` as a JSON parameter holding its stored form.
pub(crate) fn stored_json<T: serde::Serialize + ?Sized>(
    value: &T,
) -> serde_json::Result<Json<Box<RawValue>>> {
    RawValue::from_string(to_stored_json(value)?).map(Json)
}

fn parse_stored<T: DeserializeOwned>(raw: &str) -> serde_json::Result<T> {
    serde_json::from_str(&unescape_json(raw))
}

/// A text column (or a text extracted from JSON), decoded by the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Text(pub String);

impl Text {
    pub fn into_inner(self) -> String {
        self.0
    }
}

impl<DB: Database> Type<DB> for Text
where
    String: Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <String as Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <String as Type<DB>>::compatible(ty)
    }
}

impl<'r, DB: Database> Decode<'r, DB> for Text
where
    &'r str: Decode<'r, DB>,
{
    fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        let s = <&'r str as Decode<'r, DB>>::decode(value)?;
        Ok(Text(unescape_text(s).into_owned()))
    }
}

impl<'de> serde::Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Text(match unescape_text(&s) {
            Cow::Borrowed(_) => s,
            Cow::Owned(o) => o,
        }))
    }
}

/// A JSON column, decoded by the rule, then parsed. Its value is `.0`, as with `Json`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Doc<T>(pub T);

impl<DB: Database, T> Type<DB> for Doc<T>
where
    Json<T>: Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <Json<T> as Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <Json<T> as Type<DB>>::compatible(ty)
    }
}

impl<'r, DB: Database, T: DeserializeOwned> Decode<'r, DB> for Doc<T>
where
    Json<&'r RawValue>: Decode<'r, DB>,
{
    fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        let Json(raw) = <Json<&'r RawValue> as Decode<'r, DB>>::decode(value)?;
        Ok(Doc(parse_stored(raw.get())?))
    }
}

impl<'de, T: DeserializeOwned> serde::Deserialize<'de> for Doc<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        parse_stored(raw.get())
            .map(Doc)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const CASES: &[&str] = &[
        "",
        "plain",
        "\0",
        "a\0b\0\0",
        "\u{FDD0}",
        "\u{FDD0}0",
        "\u{FDD0}\u{FDD0}",
        "\0\u{FDD0}0\u{FDD0}\0",
        "\\u0000 is six characters",
        "\\\0",
        "é\u{FDD0}ü\0",
    ];

    #[test]
    fn text_round_trips_and_holds_no_nul() {
        for case in CASES {
            let stored = escape_text(case);
            assert!(!stored.contains('\0'), "{case:?} → {stored:?}");
            assert_eq!(unescape_text(&stored), *case, "{case:?}");
        }
    }

    #[test]
    fn the_rule_is_injective() {
        let stored: std::collections::HashSet<String> =
            CASES.iter().map(|c| escape_text(c).into_owned()).collect();
        assert_eq!(stored.len(), CASES.len());
    }

    #[test]
    fn json_round_trips_and_is_the_document_with_escaped_strings() {
        for case in CASES {
            let doc = serde_json::json!({ "k": case, *case: [case, 1] });
            let stored = to_stored_json(&doc).unwrap();
            assert!(!stored.contains('\0'), "{stored}");
            // The same as escaping each string of the document (so no string holds NUL).
            let escaped = serde_json::json!({
                "k": escape_text(case), escape_text(case): [escape_text(case), 1]
            });
            let parsed: serde_json::Value = serde_json::from_str(&stored).unwrap();
            assert_eq!(parsed, escaped, "{case:?}");
            let back: serde_json::Value = parse_stored(&stored).unwrap();
            assert_eq!(back, doc, "{case:?}");
        }
    }

    #[test]
    fn text_without_nul_or_esc_is_stored_as_it_is() {
        assert!(matches!(escape_text("abc"), Cow::Borrowed(_)));
        assert!(matches!(escape_json(r#"{"a":"\\u0000"}"#), Cow::Owned(_)));
        assert!(matches!(escape_json(r#"{"a":"\n"}"#), Cow::Borrowed(_)));
        // An escaped backslash before `u0000` is not a NUL.
        assert_eq!(escape_json(r#""\\u0000""#), r#""\\u0000""#);
        assert!(matches!(unescape_text("abc"), Cow::Borrowed(_)));
    }
}
