//! Request bodies: the JSON extractors ([`JsonBody`], [`RawJson`]), the scan every body
//! passes before it is decoded ([`scan`]), and the decoding of a body into an API request
//! type ([`decode_object`]) with every failure named like the rest of the API.
//!
//! The body is parsed in steps: one pass over the bytes ([`scan`]: a syntax error is a
//! 400 `invalid_json`; a NUL character in any string or key, a key repeated in one
//! object, or an object of more than [`MAX_OBJECT_ENTRIES`] entries is a 422 naming it;
//! more JSON values than [`max_body_values`] allows for the body's size is a 413),
//! then bytes → `serde_json::Value` (answered before the path is looked at), then, in
//! the handler, `Value` → the request type through `serde_path_to_error`, so a wrong
//! value names its field (422); a session request's steps are in the `request` module.
//! NUL is refused at the door because a client never means it and ids, keys and cursors
//! must compare byte for byte; duplicate keys because JSON parsers disagree on which one
//! wins, so a proxy and the API could read different requests.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::value::MapDeserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use agentq_api::bounds::{BODY_BYTES_PER_VALUE, MAX_OBJECT_ENTRIES, max_body_values};
use agentq_api::de::{REQUIRED, struct_fields};
use agentq_core::workspace_path::MAX_INPUT_FILES;

use crate::error::ApiError;
use crate::http::refused_body::{limit_of, read_at_most};

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
        let RawJson(bytes) = RawJson::from_request(req, state).await?;
        decode_json(&bytes).map(JsonBody)
    }
}

/// The bytes of a body sent as JSON, not parsed yet: for a route that decodes them
/// itself, straight into its types ([`JsonBody`]'s content-type rule and errors apply).
#[derive(Debug)]
pub struct RawJson(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for RawJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, _: &S) -> Result<Self, ApiError> {
        require_json(req.headers())?;
        let limit = limit_of(&req);
        let (parts, body) = req.into_parts();
        read_at_most(&parts.headers, body, limit).await.map(RawJson)
    }
}

/// A 415 unless the request says its body is JSON.
pub(crate) fn require_json(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !is_json_content_type(ct) {
        return Err(ApiError::UnsupportedMediaType(format!(
            "expected `Content-Type: application/json`, got {}",
            if ct.is_empty() { "none" } else { ct }
        )));
    }
    Ok(())
}

/// A body's bytes as a `Value`, after [`scan`].
pub fn decode_json(bytes: &[u8]) -> Result<Value, ApiError> {
    scan(bytes)?;
    serde_json::from_slice(bytes).map_err(invalid_json)
}

fn invalid_json(e: serde_json::Error) -> ApiError {
    ApiError::InvalidJson(format!("invalid JSON: {e}"))
}

/// What the top level of a scanned body is (and, for an array, how many items it holds),
/// so a route can refuse the wrong shape before decoding anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Null,
    Bool,
    Number,
    String,
    Array(usize),
    Object,
}

impl Shape {
    /// How the value is named in an error, as [`kind`] names a `Value`.
    pub fn kind(self) -> &'static str {
        match self {
            Shape::Null => "null",
            Shape::Bool => "a boolean",
            Shape::Number => "a number",
            Shape::String => "a string",
            Shape::Array(_) => "an array",
            Shape::Object => "an object",
        }
    }
}

/// One pass over a JSON body, building nothing: a syntax error anywhere is a 400
/// `invalid_json`; else the first (in the order of the text) NUL character in a string
/// or key, key repeated within one object, or object with more than
/// [`MAX_OBJECT_ENTRIES`] entries (a session's `files`: [`MAX_INPUT_FILES`]) is a 422
/// naming it (`[3].prompt`, `metadata.a`).
///
/// Memory: the keys of the objects on the path to the current value (borrowed from
/// `bytes` unless escaped), at most [`MAX_OBJECT_ENTRIES`] per object; nesting is bounded
/// by the JSON parser's recursion limit.
pub fn scan(bytes: &[u8]) -> Result<Shape, ApiError> {
    scan_with(bytes, Scanner::default())
}

/// [`scan`] but for NUL characters in string values (one in a key is still refused): for
/// an envelope whose values are checked later, each by the scan of its own body (`/mcp`:
/// a tool's arguments, so that a bad one is the tool's error naming its field).
pub fn scan_envelope(bytes: &[u8]) -> Result<Shape, ApiError> {
    scan_with(
        bytes,
        Scanner {
            nul_values: true,
            ..Scanner::default()
        },
    )
}

fn scan_with<'de>(bytes: &'de [u8], mut scanner: Scanner<'de>) -> Result<Shape, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let shape = Node(&mut scanner)
        .deserialize(&mut de)
        .and_then(|shape| de.end().map(|()| shape))
        .map_err(invalid_json)?;
    if let Some(e) = scanner.found {
        return Err(e);
    }
    let most = max_body_values(bytes.len());
    if scanner.values > most {
        return Err(ApiError::TooLarge {
            field: None,
            message: format!(
                "the body holds more than {most} JSON values; a body of {} bytes may hold \
                 one per {BODY_BYTES_PER_VALUE} bytes (at least {})",
                bytes.len(),
                agentq_api::bounds::MIN_BODY_VALUES
            ),
        });
    }
    Ok(shape)
}

/// Longest key of a path in an error; a longer one is cut (the field stays readable).
const MAX_PATH_KEY: usize = 64;

#[derive(Default)]
struct Scanner<'de> {
    path: Vec<Seg<'de>>,
    /// The first finding; the scan goes on to the end so that a syntax error, which
    /// makes the whole body unreadable, wins over it.
    found: Option<ApiError>,
    /// JSON values seen so far (each costs memory once the body is parsed).
    values: usize,
    /// NUL characters in string values pass (see [`scan_envelope`]).
    nul_values: bool,
}

enum Seg<'de> {
    Key(Cow<'de, str>),
    Index(usize),
}

impl Scanner<'_> {
    fn field(&self) -> String {
        let mut out = String::new();
        for seg in &self.path {
            match seg {
                Seg::Index(i) => out.push_str(&format!("[{i}]")),
                Seg::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    if k.is_empty() {
                        out.push_str("\"\"");
                    }
                    for c in k.chars().take(MAX_PATH_KEY) {
                        match c {
                            '\0' => out.push_str("\\u0000"),
                            c => out.push(c),
                        }
                    }
                }
            }
        }
        out
    }

    fn report(&mut self, message: &str) {
        if self.found.is_some() {
            return;
        }
        let field = self.field();
        // A body that is itself the bad string has no field to name.
        self.found = Some(if field.is_empty() {
            ApiError::Invalid {
                code: "invalid_body",
                field: None,
                message: format!("the body {message}"),
            }
        } else {
            ApiError::invalid(field, message)
        });
    }

    /// The most entries the object at the current path may hold: a session request's
    /// `files` (at the top level, or of a batch item) holds up to a file count's bound,
    /// any other object [`MAX_OBJECT_ENTRIES`].
    fn max_entries(&self) -> usize {
        let files = |k: &Seg<'_>| matches!(k, Seg::Key(k) if k == "files");
        match self.path.as_slice() {
            [k] | [Seg::Index(_), k] if files(k) => MAX_INPUT_FILES,
            _ => MAX_OBJECT_ENTRIES,
        }
    }

    fn string(&mut self, s: &str) {
        if self.found.is_none() && !self.nul_values && s.contains('\0') {
            self.report("must not contain a NUL character (\\u0000)");
        }
    }
}

/// A value at the scanner's current path.
struct Node<'a, 'de>(&'a mut Scanner<'de>);

impl<'de> DeserializeSeed<'de> for Node<'_, 'de> {
    type Value = Shape;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        self.0.values = self.0.values.saturating_add(1);
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, 'de> {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape::Null)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape::Bool)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape::Number)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape::Number)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape::Number)
    }

    fn visit_str<E>(self, s: &str) -> Result<Shape, E> {
        self.0.string(s);
        Ok(Shape::String)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut n = 0usize;
        loop {
            self.0.path.push(Seg::Index(n));
            let item = seq.next_element_seed(Node(self.0))?;
            self.0.path.pop();
            if item.is_none() {
                return Ok(Shape::Array(n));
            }
            n = n.saturating_add(1);
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let mut keys: HashSet<Cow<'de, str>> = HashSet::new();
        let most = self.0.max_entries();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            self.0.path.push(Seg::Key(key.clone()));
            if self.0.found.is_none() {
                if key.contains('\0') {
                    self.0
                        .report("a key must not contain a NUL character (\\u0000)");
                } else if keys.len() >= most {
                    self.0.path.pop();
                    self.0
                        .report(&format!("an object holds at most {most} entries"));
                    self.0.path.push(Seg::Key(Cow::Borrowed("")));
                } else if !keys.insert(key) {
                    self.0.report("this key appears twice in one object");
                }
            }
            map.next_value_seed(Node(self.0))?;
            self.0.path.pop();
        }
        Ok(Shape::Object)
    }
}

/// An object key, borrowed from the body when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_string()))
    }
}

/// A string of a path or query (`field` names it) with a NUL character in it, as [`scan`]
/// refuses one in a body.
pub fn no_nul(field: &str, value: &str) -> Result<(), ApiError> {
    if value.contains('\0') {
        return Err(ApiError::invalid(
            field,
            "must not contain a NUL character (\\u0000)",
        ));
    }
    Ok(())
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

/// A JSON Lines upload's content type (`application/x-ndjson`, or `application/jsonl`).
/// Like JSON, neither is one a web page may send cross-site without a CORS preflight.
pub(crate) fn is_jsonl_content_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == agentq_api::JSONL_CONTENT_TYPE || essence == "application/jsonl"
}

/// `prefix.name`, or `name` at the top level (`prefix` names an item of a batch: `[17]`).
/// An empty key is written `""`, so that a field is never named by an empty string.
pub(crate) fn path(prefix: &str, name: &str) -> String {
    if name.is_empty() {
        return path(prefix, "\"\"");
    }
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
            field: Some(path("", k)),
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
    take_fields(&mut body, "")
}

/// Take the fields `T` declares out of `obj` and decode them into `T` in its declared
/// order, each absent one as `null` (so the first declared bad field is the one named,
/// under `prefix`); the other entries of `obj` stay.
pub(crate) fn take_fields<T: DeserializeOwned>(
    obj: &mut Map<String, Value>,
    prefix: &str,
) -> Result<T, ApiError> {
    let ordered: Vec<(String, Value)> = struct_fields::<T>()
        .iter()
        .map(|name| {
            let v = obj.remove(*name).unwrap_or(Value::Null);
            (name.to_string(), v)
        })
        .collect();
    let de = MapDeserializer::<_, serde_json::Error>::new(ordered.into_iter());
    serde_path_to_error::deserialize(de).map_err(|e| field_error(e, prefix))
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

    /// What [`scan`] answers for a body: its shape, or (status, field).
    fn scanned(body: &str) -> Result<Shape, (u16, Option<String>)> {
        scan(body.as_bytes()).map_err(|e| (e.status().as_u16(), e.field().map(str::to_string)))
    }

    #[test]
    fn the_scan_names_nul_repeated_keys_and_oversize_objects() {
        let at = |f: &str| Err((422, Some(f.to_string())));
        assert_eq!(scanned(r#"{"a": [1, "x"]}"#), Ok(Shape::Object));
        assert_eq!(scanned(r#"[{}, {}, 3]"#), Ok(Shape::Array(3)));
        assert_eq!(scanned(r#""s""#), Ok(Shape::String));
        assert_eq!(scanned(r#"{"prompt": "a\u0000"}"#), at("prompt"));
        assert_eq!(
            scanned(r#"[{}, {"m": {"k": ["", "\u0000"]}}]"#),
            at("[1].m.k[1]")
        );
        assert_eq!(scanned(r#"{"m": {"a\u0000": 1}}"#), at("m.a\\u0000"));
        assert_eq!(scanned(r#"{"a": 1, "b": {"c": 1, "c": 2}}"#), at("b.c"));
        assert_eq!(scanned(r#"{"a": 1, "\u0061": 2}"#), at("a"));
        assert_eq!(scanned(r#"{"": 1, "": 2}"#), at("\"\""));
        // The same key in sibling objects is no repeat.
        assert_eq!(scanned(r#"[{"a": 1}, {"a": 1}]"#), Ok(Shape::Array(2)));
        let many: Vec<String> = (0..=MAX_OBJECT_ENTRIES)
            .map(|i| format!("\"k{i}\": 0"))
            .collect();
        assert_eq!(
            scanned(&format!(r#"{{"m": {{{}}}}}"#, many.join(","))),
            at("m")
        );
        // A session's files may be more, to their own bound, and no further.
        let files = |n: usize| {
            let f: Vec<String> = (0..n).map(|i| format!("\"f{i}\": \"\"")).collect();
            f.join(",")
        };
        assert_eq!(
            scanned(&format!(r#"{{"files": {{{}}}}}"#, files(MAX_INPUT_FILES))),
            Ok(Shape::Object)
        );
        assert_eq!(
            scanned(&format!(
                r#"[{{}}, {{"files": {{{}}}}}]"#,
                files(MAX_INPUT_FILES)
            )),
            Ok(Shape::Array(2))
        );
        assert_eq!(
            scanned(&format!(
                r#"{{"files": {{{}}}}}"#,
                files(MAX_INPUT_FILES + 1)
            )),
            at("files")
        );
        assert_eq!(
            scanned(&format!(r#"{{"m": {{"files": {{{}}}}}}}"#, many.join(","))),
            at("m.files")
        );
        // The first finding in the text is the one named.
        assert_eq!(scanned(r#"{"a": "\u0000", "a": 1}"#), at("a"));
        assert_eq!(
            scanned(r#"{"x": {"a": 1, "a": 2}, "y": "\u0000"}"#),
            at("x.a")
        );
        // A syntax error anywhere wins: the body cannot be read at all.
        assert_eq!(scanned(r#"{"a": "\u0000", "a": "#), Err((400, None)));
        assert_eq!(scanned(r#"{"a": 1} x"#), Err((400, None)));
        assert_eq!(scanned(""), Err((400, None)));
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(scanned(&deep), Err((400, None)));
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
