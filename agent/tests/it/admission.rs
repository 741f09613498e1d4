//! The admission estimate's JSON length: counted as it is written, it must equal the
//! length of the encoded text, whatever the value holds.

use agentq_agent::admission::json_len;
use serde_json::json;

#[test]
fn a_values_counted_length_is_its_encoded_length() {
    let values = [
        json!(true),
        json!(0),
        json!(-12.5e-7),
        json!(u64::MAX),
        json!([]),
        json!({}),
        json!({"type": "object", "properties": {"path": {"type": "string",
               "description": "quote \" backslash \\ tab \t newline \n"}}}),
        json!(["é", "日本語", "\u{0001}", "\u{2028}", "🦀"]),
        json!({"nested": [[[{"a": null, "b": [1, 2.5, "x"]}]]]}),
    ];
    for v in &values {
        assert_eq!(json_len(v), v.to_string().len(), "{v}");
    }
    // A string counts its text alone (what the provider sees of it), null nothing.
    assert_eq!(json_len(&json!("日本")), "日本".len());
    assert_eq!(json_len(&json!(null)), 0);
}
