#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use agentq_agent::spec::SessionSpec;
use agentq_api::CreateSession;
use agentq_core::workspace_path::FileLimits;

use super::envelope::Source;
use super::*;
use crate::ApiError;
use crate::http::body::take_fields;

const LIMITS: Limits = Limits {
    max_prompt_bytes: 100,
    max_batch: 3,
    files: FileLimits::DEFAULT,
};

fn err(v: Value) -> (u16, String, Option<String>) {
    let e = parse_session(v, &LIMITS, "").unwrap_err();
    (
        e.status().as_u16(),
        e.code().to_string(),
        e.field().map(str::to_string),
    )
}

#[test]
fn every_spec_field_is_accepted() {
    // A spec with every optional field set serialises every field name: the API
    // type's list of spec fields must be exactly those, and each must parse back.
    let mut spec = SessionSpec::new("hi");
    spec.system = Some("s".into());
    spec.provider = Some("openai".into());
    spec.model = Some("m".into());
    spec.base_url = Some("http://x".into());
    spec.tools = Some(vec!["read_file".into()]);
    spec.context_budget_chars = Some(1);
    spec.token_budget = Some(1);
    spec.timeout_secs = Some(1);
    spec.max_llm_retries = Some(1);
    spec.sensitive_tools = vec!["shell".into()];
    spec.web_search = Some(agentq_agent::spec::WebSearch {
        max_uses: Some(2),
        allowed_domains: vec!["docs.rs".into()],
        blocked_domains: Vec::new(),
    });
    spec.metadata = json!({"k": 1});
    let Value::Object(m) = serde_json::to_value(&spec).unwrap() else {
        panic!()
    };
    let mut names: Vec<&str> = m.keys().map(String::as_str).collect();
    names.sort_unstable();
    let mut known = CreateSession::spec_fields().to_vec();
    known.sort_unstable();
    assert_eq!(names, known);
    let req = parse_session(Value::Object(m), &LIMITS, "").unwrap();
    assert_eq!(req.spec, spec);
    assert_eq!(req.queue, "default");
}

#[test]
fn good_request() {
    let r = parse_session(
        json!({"prompt": "p", "mode": "plan-act", "queue": "batch.v2", "idempotency_key": "k1",
               "max_iterations": 3, "temperature": 0.5, "metadata": {"user": "u"}}),
        &LIMITS,
        "",
    )
    .unwrap();
    assert_eq!(r.queue, "batch.v2");
    assert_eq!(r.idempotency_key.as_deref(), Some("k1"));
    assert_eq!(r.spec.max_iterations, 3);
    assert_eq!(r.spec.mode, agentq_agent::spec::Mode::PlanAct);
}

#[test]
fn bad_requests_name_the_field() {
    let f = |s: &str| Some(s.to_string());
    assert_eq!(err(json!([])), (422, "invalid_body".into(), None));
    assert_eq!(err(json!({})), (422, "invalid_field".into(), f("prompt")));
    assert_eq!(
        err(json!({"prompt": 3})),
        (422, "invalid_field".into(), f("prompt"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "mode": "fast"})),
        (422, "invalid_field".into(), f("mode"))
    );
    let e = parse_session(json!({"prompt": "p", "mode": "fast"}), &LIMITS, "").unwrap_err();
    assert!(e.to_string().contains("plan-act"), "{e}");
    assert_eq!(
        err(json!({"prompt": "p", "max_iterations": -1})),
        (422, "invalid_field".into(), f("max_iterations"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "temperature": 5})),
        (422, "invalid_field".into(), f("temperature"))
    );
    assert_eq!(
        err(json!({"prompt": "x".repeat(101)})),
        (413, "too_large".into(), f("prompt"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "queue": "a b"})),
        (422, "invalid_field".into(), f("queue"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "queue": "x".repeat(65)})),
        (422, "invalid_field".into(), f("queue"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "api_key": "sk"})),
        (422, "credential_not_allowed".into(), f("api_key"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "metadata": {"a": [{"openai_api_key": "sk"}]}})),
        (
            422,
            "credential_not_allowed".into(),
            f("metadata.a[0].openai_api_key")
        )
    );
    assert_eq!(
        err(json!({"prompt": "p", "max_iteration": 3})),
        (422, "unknown_field".into(), f("max_iteration"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "provider": "gemini"})),
        (422, "invalid_field".into(), f("provider"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "tools": ["a", 3]})),
        (422, "invalid_field".into(), f("tools[1]"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "base_url": "file:///etc/passwd"})),
        (422, "invalid_field".into(), f("base_url"))
    );
    // Each of these would let the host's key reach a place nobody configured.
    for bad in [
        "http://user:pw@llm.test/v1",
        "http://llm.test/v1?x=/",
        "http://llm.test/v1#f",
        "ftp://llm.test/v1",
    ] {
        assert_eq!(
            err(json!({"prompt": "p", "base_url": bad})),
            (422, "invalid_field".into(), f("base_url")),
            "{bad}"
        );
    }
    assert_eq!(
        err(json!({"prompt": "p", "metadata": [1]})),
        (422, "invalid_field".into(), f("metadata"))
    );
    assert_eq!(
        err(json!({"prompt": "p", "idempotency_key": ""})),
        (422, "invalid_field".into(), f("idempotency_key"))
    );
}

#[test]
fn batch_items_are_prefixed() {
    let e = parse_batch(
        json!([{"prompt": "a"}, {"prompt": "b", "mode": "x"}]),
        &LIMITS,
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("[1].mode"));
    let e = parse_batch(json!([{"prompt": "a"}, {}]), &LIMITS).unwrap_err();
    assert_eq!(e.field(), Some("[1].prompt"));
    let e = parse_batch(json!([{"prompt": "a"}, 7]), &LIMITS).unwrap_err();
    assert_eq!(e.field(), Some("[1]"));
    assert_eq!(
        parse_batch(json!([]), &LIMITS).unwrap_err().code(),
        "invalid_batch"
    );
    let four = json!([{"prompt": "a"}, {"prompt": "a"}, {"prompt": "a"}, {"prompt": "a"}]);
    assert_eq!(
        parse_batch(four, &LIMITS).unwrap_err().code(),
        "invalid_batch"
    );
    assert_eq!(
        parse_batch(json!({"prompt": "a"}), &LIMITS)
            .unwrap_err()
            .code(),
        "invalid_body"
    );
    assert_eq!(
        parse_batch(json!([{"prompt": "a"}]), &LIMITS)
            .unwrap()
            .len(),
        1
    );
}

/// `workspace_from` of an item holding `v` (absent for `None`), as the decoding reads it.
fn workspace_from(v: Option<Value>, prefix: &str) -> Result<Option<String>, ApiError> {
    let mut obj = serde_json::Map::new();
    if let Some(v) = v {
        obj.insert("workspace_from".into(), v);
    }
    take_fields::<Source>(&mut obj, prefix).map(|s| s.workspace_from)
}

#[test]
fn workspace_from_is_an_id() {
    assert_eq!(workspace_from(None, "").unwrap(), None);
    assert_eq!(
        workspace_from(Some(json!("s1")), "").unwrap().as_deref(),
        Some("s1")
    );
    for bad in [json!(""), json!(3), json!("x".repeat(129))] {
        let e = workspace_from(Some(bad), "[1]").unwrap_err();
        assert_eq!(e.field(), Some("[1].workspace_from"));
    }
}

#[test]
fn the_scheduler_and_the_worker_refuse_a_spec_beyond_policy_alike() {
    use agentq_core::config::PolicySection;
    use agentq_core::policy::{Policy, Sent, SpawnContext};

    let policy = Policy::from_section(&PolicySection {
        providers: vec!["openai".into()],
        models: vec!["gpt-4o*".into()],
        tools: vec!["read_file".into()],
        queues: vec!["default".into()],
        max_iterations: Some(10),
        ..PolicySection::default()
    })
    .unwrap();
    let p = policy.global();
    for body in [
        json!({"prompt": "p", "provider": "anthropic"}),
        json!({"prompt": "p", "model": "other"}),
        json!({"prompt": "p", "tools": ["shell"]}),
        json!({"prompt": "p", "max_iterations": 11}),
        json!({"prompt": "p", "queue": "bulk"}),
        json!({"prompt": "p", "queue": "bulk", "max_iterations": 11}),
    ] {
        // The scheduler: the request as sent.
        let mut req = parse_session(body.clone(), &LIMITS, "").unwrap();
        let stored = req.spec.clone();
        let e = check_policy(&mut req, p, "").unwrap_err();
        // The worker: the stored row, every value counting as sent.
        let mut spec = stored;
        let v = p
            .check_request(&req.queue, &mut spec, Sent::Stored, SpawnContext::default())
            .unwrap_err();
        assert_eq!(e.code(), "invalid_field", "{body}");
        assert_eq!(e.field(), Some(v.field.as_str()), "{body}");
        assert_eq!(e.to_string(), v.message, "{body}");
    }
    // Within the policy, both pass.
    let mut req = parse_session(json!({"prompt": "p", "max_iterations": 10}), &LIMITS, "").unwrap();
    let mut spec = req.spec.clone();
    check_policy(&mut req, p, "").unwrap();
    p.check_request(&req.queue, &mut spec, Sent::Stored, SpawnContext::default())
        .unwrap();
}

#[test]
fn a_batch_names_the_item_beyond_policy() {
    use agentq_core::config::PolicySection;
    use agentq_core::policy::Policy;

    let policy = Policy::from_section(&PolicySection {
        queues: vec!["default".into()],
        ..PolicySection::default()
    })
    .unwrap();
    let mut reqs = parse_batch(
        json!([{"prompt": "a"}, {"prompt": "b", "queue": "bulk"}]),
        &LIMITS,
    )
    .unwrap();
    let e = check_policy_batch(&mut reqs, policy.global()).unwrap_err();
    assert_eq!(e.field(), Some("[1].queue"));
}
