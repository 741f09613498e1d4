//! The answer a webhook, a command hook or the guardian gives about a call:
//! `{"behavior":"allow"|"deny","reason":"…"}`, and nothing else. Anything that is not
//! exactly one such object is not a verdict, and the caller falls back to its configured
//! behaviour.

use serde::Deserialize;

use super::hook::HookDecision;

/// The longest reason passed on to the model; a longer one is cut.
pub const MAX_REASON_CHARS: usize = 1_000;

#[derive(Deserialize)]
struct Answer {
    behavior: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Parse a verdict. The whole text must be one JSON object (surrounding whitespace, and
/// for an LLM's sake one Markdown code fence around it, are tolerated); a verdict found
/// somewhere inside other text is refused, so a reviewer quoting the call's arguments
/// back cannot be made to "answer" with them. Unknown fields are ignored.
pub fn parse_verdict(text: &str) -> Result<HookDecision, String> {
    let body = strip_fence(text.trim());
    let answer: Answer =
        serde_json::from_str(body).map_err(|e| format!("not a verdict object: {e}"))?;
    let reason = answer
        .reason
        .map(|r| r.trim().chars().take(MAX_REASON_CHARS).collect::<String>())
        .filter(|r| !r.is_empty());
    match answer.behavior.trim().to_ascii_lowercase().as_str() {
        "allow" => Ok(HookDecision::Allow),
        "deny" => Ok(HookDecision::Deny(
            reason.unwrap_or_else(|| "no reason given".to_string()),
        )),
        other => Err(format!(
            "`behavior` must be \"allow\" or \"deny\", not {other:?}"
        )),
    }
}

/// The inside of a single ```` ``` ```` or ```` ```json ```` fence, or the text itself.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(inner) = rest.strip_suffix("```") else {
        return text;
    };
    let inner = inner.strip_prefix("json").unwrap_or(inner);
    inner.trim()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn allow_and_deny() {
        assert_eq!(
            parse_verdict(r#"{"behavior":"allow"}"#),
            Ok(HookDecision::Allow)
        );
        assert_eq!(
            parse_verdict(r#" {"behavior":"deny","reason":"writes outside src/"} "#),
            Ok(HookDecision::Deny("writes outside src/".into()))
        );
        assert_eq!(
            parse_verdict(r#"{"behavior":"DENY","reason":"  ","extra":1}"#),
            Ok(HookDecision::Deny("no reason given".into()))
        );
        assert_eq!(
            parse_verdict("```json\n{\"behavior\":\"deny\",\"reason\":\"no\"}\n```"),
            Ok(HookDecision::Deny("no".into()))
        );
        assert_eq!(
            parse_verdict("```\n{\"behavior\":\"allow\"}\n```"),
            Ok(HookDecision::Allow)
        );
    }

    #[test]
    fn anything_else_is_not_a_verdict() {
        for bad in [
            "",
            "allow",
            "null",
            "[]",
            r#"{"reason":"no behavior"}"#,
            r#"{"behavior":"maybe"}"#,
            r#"{"behavior":true}"#,
            r#"{"behavior":"deny","reason":7}"#,
            // A verdict inside prose (e.g. quoted from the arguments) is not an answer.
            r#"Sure. {"behavior":"allow"}"#,
            r#"{"behavior":"allow"} {"behavior":"deny"}"#,
            "```json\n{\"behavior\":\"allow\"}",
        ] {
            assert!(parse_verdict(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn long_reasons_are_cut() {
        let long = "é".repeat(MAX_REASON_CHARS + 50);
        let text = serde_json::json!({"behavior": "deny", "reason": long}).to_string();
        let HookDecision::Deny(r) = parse_verdict(&text).unwrap() else {
            panic!("not a denial")
        };
        assert_eq!(r.chars().count(), MAX_REASON_CHARS);
    }
}
