//! A session request's `files`: decoded and held to the path rules of
//! [`agentq_core::workspace_path`] and to the tenant's [`FileLimits`]. Every refusal names
//! the field as a path into the body: `files`, `files["../x"]`, `[3].files["a"].base64`.

use base64::Engine as _;
use serde_json::{Map, Value};

use agentq_core::workspace::InputFile;
use agentq_core::workspace_path::{FileLimits, Tree, normalize};

use crate::error::ApiError;
use crate::http::body::{kind, path};

/// Longest path shown in a field name; a longer one is cut (the field stays readable).
const SHOWN_PATH_CHARS: usize = 64;

/// `files["<path>"]` under `at` (the `files` field itself), the path cut and escaped as
/// a JSON string so that control characters and quotes cannot garble the name.
fn file_field(at: &str, key: &str) -> String {
    let short: String = key.chars().take(SHOWN_PATH_CHARS).collect();
    let quoted = serde_json::to_string(&short).unwrap_or_else(|_| "\"?\"".into());
    format!("{at}[{quoted}]")
}

/// The decoded size of `b64` at most (padding and white space counted as data).
fn decoded_len_at_most(b64: &str) -> u64 {
    u64::try_from(b64.len())
        .unwrap_or(u64::MAX)
        .div_ceil(4)
        .saturating_mul(3)
}

fn too_large(field: String, message: String) -> ApiError {
    ApiError::TooLarge {
        field: Some(field),
        message,
    }
}

/// `files` of a request item (`prefix` names the item in a batch): absent or `null` is
/// none; else an object of path → text or `{"base64": "…"}`, answered in path order.
pub(super) fn parse_files(
    value: Option<Value>,
    limits: &FileLimits,
    prefix: &str,
) -> Result<Vec<InputFile>, ApiError> {
    let at = path(prefix, "files");
    let map: Map<String, Value> = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::invalid(
                at,
                format!(
                    "expected a JSON object of path → content, got {}",
                    kind(&other)
                ),
            ));
        }
    };
    if map.len() > limits.max_files {
        return Err(ApiError::invalid(
            at,
            format!(
                "holds at most {} files by policy, got {}",
                limits.max_files,
                map.len()
            ),
        ));
    }
    let mut tree = Tree::default();
    let mut total: u64 = 0;
    let mut out = Vec::with_capacity(map.len());
    for (key, v) in map {
        let field = file_field(&at, &key);
        let norm = normalize(&key, limits).map_err(|m| ApiError::invalid(&field, m))?;
        tree.add(&norm)
            .map_err(|m| ApiError::invalid(&field, format!("{m} (as `{norm}`)")))?;
        let room = limits.max_bytes.saturating_sub(total);
        let data = match v {
            Value::String(s) => s.into_bytes(),
            Value::Object(mut o) if o.len() == 1 && o.contains_key("base64") => {
                let b64_field = format!("{field}.base64");
                let Some(Value::String(b64)) = o.remove("base64") else {
                    return Err(ApiError::invalid(b64_field, "must be a string"));
                };
                // Refused by its size before it is decoded: the policy's bytes, not the
                // body's, bound what a request may make the scheduler hold.
                let compact: String;
                let text = if b64.bytes().any(|b| b.is_ascii_whitespace()) {
                    compact = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
                    &compact
                } else {
                    &b64
                };
                if decoded_len_at_most(text) > room.saturating_add(2) {
                    return Err(too_large(
                        b64_field,
                        format!(
                            "decodes to more than the {} bytes the files of one request \
                             may hold by policy",
                            limits.max_bytes
                        ),
                    ));
                }
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| {
                        ApiError::invalid(b64_field, format!("is not valid base64: {e}"))
                    })?
            }
            other => {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "expected a string or {{\"base64\": \"…\"}}, got {}",
                        kind(&other)
                    ),
                ));
            }
        };
        let size = u64::try_from(data.len()).unwrap_or(u64::MAX);
        if size > room {
            let message = format!(
                "the files of one request hold at most {} bytes by policy",
                limits.max_bytes
            );
            // One file over the limit on its own is named; else the files together are.
            let blame = if size > limits.max_bytes { field } else { at };
            return Err(too_large(blame, message));
        }
        total = total.saturating_add(size);
        out.push(InputFile { path: norm, data });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    const L: FileLimits = FileLimits {
        max_files: 3,
        max_bytes: 10,
        max_path_bytes: 32,
        max_path_depth: 4,
    };

    fn refused(v: Value) -> (u16, String) {
        let e = parse_files(Some(v), &L, "[2]").unwrap_err();
        (e.status().as_u16(), e.field().unwrap_or("").to_string())
    }

    #[test]
    fn text_and_base64_files_decode_in_order() {
        let f = parse_files(
            Some(json!({"b/./c.txt": "hi", "a.bin": {"base64": "AAEC\n/w=="}})),
            &L,
            "",
        )
        .unwrap();
        let got: Vec<(&str, &[u8])> = f.iter().map(|f| (f.path.as_str(), &f.data[..])).collect();
        assert!(got.contains(&("b/c.txt", b"hi")), "{got:?}");
        assert!(got.contains(&("a.bin", &[0, 1, 2, 255][..])), "{got:?}");
        assert!(parse_files(None, &L, "").unwrap().is_empty());
        assert!(parse_files(Some(Value::Null), &L, "").unwrap().is_empty());
    }

    #[test]
    fn every_refusal_names_the_file() {
        let f = |s: &str| s.to_string();
        assert_eq!(refused(json!([])), (422, f("[2].files")));
        assert_eq!(
            refused(json!({"../x": "a"})),
            (422, f(r#"[2].files["../x"]"#))
        );
        assert_eq!(
            refused(json!({"/etc/passwd": "a"})),
            (422, f(r#"[2].files["/etc/passwd"]"#))
        );
        assert_eq!(
            refused(json!({"a\u{1}": "a"})),
            (422, f(r#"[2].files["a\u0001"]"#))
        );
        assert_eq!(
            refused(json!({".git/config": "a"})),
            (422, f(r#"[2].files[".git/config"]"#))
        );
        assert_eq!(refused(json!({"a": 1})), (422, f(r#"[2].files["a"]"#)));
        assert_eq!(
            refused(json!({"a": {"b64": "AA=="}})),
            (422, f(r#"[2].files["a"]"#))
        );
        assert_eq!(
            refused(json!({"a": {"base64": 7}})),
            (422, f(r#"[2].files["a"].base64"#))
        );
        assert_eq!(
            refused(json!({"a": {"base64": "***"}})),
            (422, f(r#"[2].files["a"].base64"#))
        );
        // Twins and a file that is also a directory, in either order.
        assert_eq!(
            refused(json!({"a/./b": "x", "a/b": "y"})),
            (422, f(r#"[2].files["a/b"]"#))
        );
        let (s, field) = refused(json!({"a": "x", "a/b": "y"}));
        assert_eq!(s, 422);
        assert!(
            field == r#"[2].files["a/b"]"# || field == r#"[2].files["a"]"#,
            "{field}"
        );
        // Bounds of the policy: count, bytes (of one file, and of all), length, depth.
        assert_eq!(
            refused(json!({"a": "", "b": "", "c": "", "d": ""})),
            (422, f("[2].files"))
        );
        assert_eq!(
            refused(json!({"a": "x".repeat(11)})),
            (413, f(r#"[2].files["a"]"#))
        );
        assert_eq!(
            refused(json!({"a": "x".repeat(6), "b": "x".repeat(6)})),
            (413, f("[2].files"))
        );
        assert_eq!(
            refused(json!({"a": {"base64": "A".repeat(1_000_000)}})),
            (413, f(r#"[2].files["a"].base64"#))
        );
        let long = "p".repeat(100 * 1024);
        let (s, field) = refused(json!({long.clone(): "x"}));
        assert_eq!(s, 422);
        assert_eq!(field, format!("[2].files[\"{}\"]", "p".repeat(64)));
        assert_eq!(
            refused(json!({"a/b/c/d/e": "x"})),
            (422, f(r#"[2].files["a/b/c/d/e"]"#))
        );
        // Exactly at the bounds.
        parse_files(
            Some(json!({"a": "x".repeat(5), "b/c/d/e": "x".repeat(5)})),
            &L,
            "",
        )
        .unwrap();
    }
}
