//! The admission estimate: its JSON length, counted as it is written, must equal the
//! length of the encoded text, whatever the value holds; and a run's tools, counted once,
//! must weigh what counting them on every call did.

use std::borrow::Cow;

use agentq_agent::admission::{estimate_input_tokens, estimate_with_tools, json_len, tools_len};
use agentq_agent::provider::{LlmRequest, ViewMessage};
use agentq_agent::schema::{Message, ToolSpec};
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

fn request<'a>(tools: &'a [ToolSpec], messages: &'a [Message]) -> LlmRequest<'a> {
    LlmRequest {
        model: "m".into(),
        system: Some("be brief".into()),
        messages: messages.iter().map(ViewMessage::from).collect(),
        tools: Cow::Borrowed(tools),
        temperature: 0.0,
        max_tokens: 100,
        session_id: String::new(),
        web_search: None,
    }
}

#[test]
fn tools_counted_once_weigh_what_they_weighed_on_every_call() {
    let tools = vec![
        ToolSpec {
            name: "read_file".into(),
            description: "Read a file of the workspace, \"quoted\" and 日本".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        },
        ToolSpec {
            name: "shell".into(),
            description: String::new(),
            parameters: json!({"type": "object", "required": ["command"]}),
        },
    ];
    let messages = vec![Message::user("hello"), Message::assistant("hi there")];
    let with = request(&tools, &messages);
    let counted = tools_len(&tools);
    assert!(counted > 100, "{counted}");
    assert_eq!(
        estimate_with_tools(&with, counted),
        estimate_input_tokens(&with)
    );
    // A request that offers no tools (the last iteration's) counts none of them.
    let without = request(&[], &messages);
    assert_eq!(
        estimate_with_tools(&without, counted),
        estimate_input_tokens(&without)
    );
    assert!(estimate_input_tokens(&without) < estimate_input_tokens(&with));
}
