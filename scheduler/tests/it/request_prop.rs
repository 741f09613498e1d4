//! The request decoding under arbitrary input: bytes and JSON-ish trees (known and
//! unknown field names, repeated keys, NUL characters, numbers at and past every bound,
//! any nesting) into every body the API decodes. It never panics; each answer is a
//! request that holds no NUL and is within the API's bounds, or a 4xx whose field is
//! named whenever a field is to blame. A batch decoded item by item from its bytes is
//! the batch decoded from a whole `Value`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use serde_json::Value;

use agentq_api::{ApprovalRequest, PostMessage, bounds};
use agentq_scheduler::ApiError;
use agentq_scheduler::request::{
    Limits, SessionRequest, decode_json, decode_object, parse_batch, parse_batch_bytes,
    parse_session,
};

const LIMITS: Limits = Limits {
    max_prompt_bytes: 64,
    max_batch: 4,
    files: agentq_core::workspace_path::FileLimits::DEFAULT,
};

/// A JSON text as a tree, written by hand so that an object may repeat a key.
#[derive(Debug, Clone)]
enum J {
    Leaf(Value),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn write(&self, out: &mut String) {
        match self {
            J::Leaf(v) => out.push_str(&v.to_string()),
            J::Arr(items) => {
                out.push('[');
                for (i, j) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    j.write(out);
                }
                out.push(']');
            }
            J::Obj(entries) => {
                out.push('{');
                for (i, (k, j)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    j.write(out);
                }
                out.push('}');
            }
        }
    }

    fn text(&self) -> Vec<u8> {
        let mut s = String::new();
        self.write(&mut s);
        s.into_bytes()
    }
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "prompt", "system", "mode", "tools", "sensitive_tools", "metadata", "queue",
            "idempotency_key", "model", "provider", "base_url", "max_iterations", "temperature",
            "max_tokens", "timeout_secs", "approval_timeout_secs", "tool_timeout_secs",
            "token_budget", "history_window", "context_budget_chars", "tool_output_max_chars",
            "max_background_drain_rounds", "max_llm_retries", "retry_delay_ms", "content",
            "max_repeated_calls", "warn_repeated_calls",
            "strategy", "tool_call_id", "approve", "reason", "api_key",
        ])
        .prop_map(str::to_string),
        1 => "[a-z_\u{0}]{0,6}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..3_000_000).prop_map(Value::from),
        prop::sample::select(vec![
            0u64,
            1,
            2_592_000,
            2_592_001,
            1_000_000_000,
            1_000_000_001,
            9_000_000_000_000_000,
        ])
        .prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(vec![
            "act",
            "plan-act",
            "inject",
            "reject",
            "read_file",
            "default",
            "http://x",
            "openai",
        ])
        .prop_map(Value::from),
        "[ -~\u{0}\u{1}é🦀]{0,12}".prop_map(Value::from),
        "x{60,70}".prop_map(Value::from),
    ]
}

fn tree() -> impl Strategy<Value = J> {
    leaf().prop_map(J::Leaf).prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(J::Arr),
            prop::collection::vec((key(), inner), 0..8).prop_map(J::Obj),
        ]
    })
}

/// A body shaped like a request: an object of (mostly) known fields, or an array of them.
fn request_like() -> impl Strategy<Value = J> {
    let obj = || prop::collection::vec((key(), tree()), 0..8).prop_map(J::Obj);
    prop_oneof![
        3 => obj(),
        1 => prop::collection::vec(obj(), 0..6).prop_map(J::Arr),
        1 => tree(),
    ]
}

#[track_caller]
fn check_error(e: &ApiError) {
    let status = e.status().as_u16();
    assert!((400..500).contains(&status), "{status}: {e}");
    assert!(!e.to_string().is_empty());
    if matches!(
        e.code(),
        "invalid_field" | "unknown_field" | "credential_not_allowed"
    ) {
        assert!(e.field().is_some_and(|f| !f.is_empty()), "{e:?}");
    }
}

#[track_caller]
fn check_request(r: &SessionRequest) {
    assert_eq!(bounds::check_spec(&r.spec), Ok(()));
    let stored = serde_json::to_string(&(&r.spec, &r.queue, &r.idempotency_key)).unwrap();
    assert!(!stored.contains("\\u0000"), "{stored}");
}

fn outcome(r: &Result<Vec<SessionRequest>, ApiError>) -> Result<Vec<SessionRequest>, String> {
    match r {
        Ok(v) => Ok(v.clone()),
        Err(e) => Err(format!("{} {} {:?}", e.status(), e.code(), e.field())),
    }
}

/// Every decoding of the API over one body.
fn decode_everything(bytes: &[u8]) {
    match decode_json(bytes).and_then(|v| parse_session(v, &LIMITS, "")) {
        Ok(r) => check_request(&r),
        Err(e) => check_error(&e),
    }
    let streamed = parse_batch_bytes(bytes, &LIMITS);
    match &streamed {
        Ok(reqs) => reqs.iter().for_each(check_request),
        Err(e) => check_error(e),
    }
    let whole = decode_json(bytes).and_then(|v| parse_batch(v, &LIMITS));
    assert_eq!(outcome(&streamed), outcome(&whole));
    match decode_json(bytes).and_then(decode_object::<PostMessage>) {
        Ok(m) => assert!(!m.content.contains('\0')),
        Err(e) => check_error(&e),
    }
    match decode_json(bytes).and_then(decode_object::<ApprovalRequest>) {
        Ok(a) => assert!(!a.tool_call_id.contains('\0')),
        Err(e) => check_error(&e),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        decode_everything(&bytes);
    }

    #[test]
    fn json_ish_trees(body in request_like()) {
        decode_everything(&body.text());
    }

    #[test]
    fn cut_and_spliced_json(body in request_like(), at in any::<prop::sample::Index>(), junk in prop::collection::vec(any::<u8>(), 0..4)) {
        let mut bytes = body.text();
        let i = at.index(bytes.len() + 1);
        bytes.truncate(i);
        decode_everything(&bytes);
        bytes.extend_from_slice(&junk);
        bytes.extend_from_slice(&body.text()[i..]);
        decode_everything(&bytes);
    }
}
