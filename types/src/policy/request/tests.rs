#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;

fn field(spec: &SessionSpec) -> Option<String> {
    check_bounds(spec).err().map(|v| v.field)
}

#[test]
fn defaults_are_within_the_bounds() {
    assert_eq!(check_bounds(&SessionSpec::new("p")), Ok(()));
    assert_eq!(check_spec(&SessionSpec::new("p")), Ok(()));
}

#[test]
fn each_number_has_an_upper_bound_naming_its_field() {
    type Set = fn(&mut SessionSpec, bool);
    // Each case sets its field at the bound (`true`) or one past it (`false`).
    let cases: &[(&str, Set)] = &[
        ("max_iterations", |s, at| {
            s.max_iterations = MAX_ITERATIONS + u32::from(!at)
        }),
        ("max_tokens", |s, at| {
            s.max_tokens = MAX_OUTPUT_TOKENS + u32::from(!at)
        }),
        ("tool_timeout_secs", |s, at| {
            s.tool_timeout_secs = MAX_TIMEOUT_SECS + u64::from(!at)
        }),
        ("approval_timeout_secs", |s, at| {
            s.approval_timeout_secs = MAX_TIMEOUT_SECS + u64::from(!at)
        }),
        ("timeout_secs", |s, at| {
            s.timeout_secs = Some(MAX_TIMEOUT_SECS + u64::from(!at))
        }),
        ("token_budget", |s, at| {
            s.token_budget = Some(MAX_TOKEN_BUDGET + u64::from(!at))
        }),
        ("history_window", |s, at| {
            s.history_window = 100_000 + usize::from(!at)
        }),
        ("context_budget_chars", |s, at| {
            s.context_budget_chars = Some(1_000_000_000 + usize::from(!at))
        }),
        ("max_llm_retries", |s, at| {
            s.max_llm_retries = Some(MAX_LLM_RETRIES + u32::from(!at))
        }),
        ("retry_delay_ms", |s, at| {
            s.retry_delay_ms = MAX_RETRY_DELAY_MS + u64::from(!at)
        }),
        ("max_background_drain_rounds", |s, at| {
            s.max_background_drain_rounds = MAX_DRAIN_ROUNDS + u32::from(!at)
        }),
        ("tool_output_max_chars", |s, at| {
            s.tool_output_max_chars = 10_000_000 + usize::from(!at)
        }),
        ("max_repeated_calls", |s, at| {
            s.max_repeated_calls = MAX_REPEATED_CALLS + u32::from(!at)
        }),
        ("warn_repeated_calls", |s, at| {
            s.warn_repeated_calls = MAX_REPEATED_CALLS + u32::from(!at)
        }),
        ("temperature", |s, at| {
            s.temperature = if at { MAX_TEMPERATURE } else { 2.01 }
        }),
    ];
    for (name, set) in cases {
        let mut s = SessionSpec::new("p");
        set(&mut s, true);
        assert_eq!(field(&s), None, "{name} at its bound");
        set(&mut s, false);
        assert_eq!(field(&s).as_deref(), Some(*name), "{name} past its bound");
    }
    // The values of the reports: far beyond any bound, and nothing wraps.
    let mut s = SessionSpec::new("p");
    s.timeout_secs = Some(9_000_000_000_000_000);
    let v = check_bounds(&s).unwrap_err();
    assert_eq!(v.field, "timeout_secs");
    assert!(v.message.contains("2592000"), "{}", v.message);
    let mut s = SessionSpec::new("p");
    s.approval_timeout_secs = u64::MAX;
    assert_eq!(field(&s).as_deref(), Some("approval_timeout_secs"));
    let mut s = SessionSpec::new("p");
    s.temperature = f32::NAN;
    assert_eq!(field(&s).as_deref(), Some("temperature"));
    let mut s = SessionSpec::new("p");
    s.timeout_secs = Some(0);
    assert_eq!(field(&s).as_deref(), Some("timeout_secs"));
}

#[test]
fn a_repeat_limit_is_off_or_counts_a_repeat() {
    for (max, ok) in [(0, true), (1, false), (2, true), (MAX_REPEATED_CALLS, true)] {
        let mut s = SessionSpec::new("p");
        s.max_repeated_calls = max;
        let got = check_bounds(&s);
        assert_eq!(got.is_ok(), ok, "{max}: {got:?}");
        if let Err(v) = got {
            assert_eq!(v.field, "max_repeated_calls");
            assert!(v.message.contains("0 (never)"), "{}", v.message);
        }
    }
    let mut s = SessionSpec::new("p");
    s.warn_repeated_calls = 0;
    assert_eq!(check_bounds(&s), Ok(()));
}

#[test]
fn lists_and_metadata_are_bounded() {
    let mut s = SessionSpec::new("p");
    s.tools = Some(vec!["t".into(); MAX_TOOLS]);
    assert_eq!(field(&s), None);
    s.tools = Some(vec!["t".into(); MAX_TOOLS + 1]);
    assert_eq!(field(&s).as_deref(), Some("tools"));
    let mut s = SessionSpec::new("p");
    s.sensitive_tools = vec!["t".into(); 10_000];
    assert_eq!(field(&s).as_deref(), Some("sensitive_tools"));

    let entries = |n: usize| {
        Value::Object(
            (0..n)
                .map(|i| (format!("k{i}"), json!(i)))
                .collect::<serde_json::Map<_, _>>(),
        )
    };
    let mut s = SessionSpec::new("p");
    s.metadata = entries(MAX_METADATA_ENTRIES);
    assert_eq!(field(&s), None);
    s.metadata = entries(MAX_METADATA_ENTRIES + 1);
    assert_eq!(field(&s).as_deref(), Some("metadata"));
    s.metadata = json!({"a": {"b": entries(MAX_OBJECT_ENTRIES + 1)}});
    assert_eq!(field(&s).as_deref(), Some("metadata.a.b"));
    s.metadata = json!({"a": [1, vec![0; MAX_OBJECT_ENTRIES + 1]]});
    assert_eq!(field(&s).as_deref(), Some("metadata.a[1]"));
    s.metadata = json!({"a": {"x".repeat(MAX_METADATA_KEY_LEN + 1): 1}});
    assert_eq!(field(&s), Some(format!("metadata.a.{}", "x".repeat(32))));
    s.metadata = json!({"a": {"x".repeat(MAX_METADATA_KEY_LEN): 1}});
    assert_eq!(field(&s), None);
}

#[test]
fn the_shape_check_runs_validate_then_names_then_bounds() {
    let check = |tweak: fn(&mut SessionSpec)| {
        let mut s = SessionSpec::new("p");
        tweak(&mut s);
        check_spec(&s).err().map(|v| v.field)
    };
    assert_eq!(check(|s| s.prompt = " ".into()).as_deref(), Some("prompt"));
    assert_eq!(
        check(|s| s.provider = Some("gemini".into())).as_deref(),
        Some("provider")
    );
    assert_eq!(
        check(|s| s.model = Some("a b".into())).as_deref(),
        Some("model")
    );
    assert_eq!(
        check(|s| s.base_url = Some("ftp://llm.test/v1".into())).as_deref(),
        Some("base_url")
    );
    assert_eq!(
        check(|s| s.tools = Some(vec!["a".into(), "b c".into()])).as_deref(),
        Some("tools[1]")
    );
    assert_eq!(
        check(|s| s.sensitive_tools = vec!["".into()]).as_deref(),
        Some("sensitive_tools[0]")
    );
    // A spec wrong twice is named by the earlier check.
    assert_eq!(
        check(|s| {
            s.prompt = String::new();
            s.timeout_secs = Some(0);
        })
        .as_deref(),
        Some("prompt")
    );
    assert_eq!(
        check(|s| {
            s.model = Some(String::new());
            s.timeout_secs = Some(0);
        })
        .as_deref(),
        Some("model")
    );
}

#[test]
fn the_request_check_holds_the_queue_then_the_spec() {
    use crate::config::PolicySection;
    use crate::policy::Policy;

    let policy = Policy::from_section(&PolicySection {
        queues: vec!["default".into()],
        max_iterations: Some(5),
        ..PolicySection::default()
    })
    .unwrap();
    let p = policy.global();
    let mut spec = SessionSpec::new("p");
    spec.max_iterations = 6;
    let v = p
        .check_request("bulk", &mut spec, Sent::Stored, SpawnContext::default())
        .unwrap_err();
    assert_eq!(v.field, "queue");
    let v = p
        .check_request("default", &mut spec, Sent::Stored, SpawnContext::default())
        .unwrap_err();
    assert_eq!(v.field, "max_iterations");
    // The same as the two checks one after the other.
    assert_eq!(
        Err(v),
        p.check_queue("default").and_then(|()| p.apply(
            &mut spec,
            Sent::Stored,
            SpawnContext::default()
        ))
    );
}

#[test]
fn the_web_search_is_bounded_and_asked_only_of_a_provider_that_runs_it() {
    use agentq_agent::spec::{MAX_WEB_SEARCH_MAX_USES, WEB_SEARCH_TOOL, WebSearch};
    let check = |tweak: &dyn Fn(&mut SessionSpec)| {
        let mut s = SessionSpec::new("p");
        tweak(&mut s);
        check_spec(&s).err()
    };
    let searching = |s: &mut SessionSpec| {
        s.tools = Some(vec!["read_file".into(), WEB_SEARCH_TOOL.into()]);
    };
    // The provider is known from the request: refused naming the tool, never sent.
    for provider in ["openai", "scripted"] {
        let v = check(&|s| {
            searching(s);
            s.provider = Some(provider.into());
        })
        .unwrap();
        assert_eq!(v.field, "tools[1]");
        assert!(
            v.message.contains("`web_search`") && v.message.contains(provider),
            "{}",
            v.message
        );
    }
    assert_eq!(
        check(&|s| {
            searching(s);
            s.provider = Some("anthropic".into());
        }),
        None
    );
    // Left to the host's provider: the worker, which knows it, checks.
    assert_eq!(check(&searching), None);
    let with = |w: WebSearch| {
        move |s: &mut SessionSpec| {
            searching(s);
            s.web_search = Some(w.clone());
        }
    };
    let field = |w: WebSearch| check(&with(w)).map(|v| v.field);
    for n in [0, MAX_WEB_SEARCH_MAX_USES + 1] {
        assert_eq!(
            field(WebSearch {
                max_uses: Some(n),
                ..WebSearch::default()
            })
            .as_deref(),
            Some("web_search.max_uses"),
            "{n}"
        );
    }
    assert_eq!(
        field(WebSearch {
            max_uses: Some(MAX_WEB_SEARCH_MAX_USES),
            allowed_domains: vec!["docs.rs".into(), "example.com/guide".into()],
            ..WebSearch::default()
        }),
        None
    );
    assert_eq!(
        field(WebSearch {
            allowed_domains: vec!["a.example".into()],
            blocked_domains: vec!["b.example".into()],
            ..WebSearch::default()
        })
        .as_deref(),
        Some("web_search.blocked_domains")
    );
    for bad in ["https://a.example", "", "a example", "a.example\n"] {
        assert_eq!(
            field(WebSearch {
                blocked_domains: vec!["ok.example".into(), bad.into()],
                ..WebSearch::default()
            })
            .as_deref(),
            Some("web_search.blocked_domains[1]"),
            "{bad:?}"
        );
    }
    assert_eq!(
        field(WebSearch {
            allowed_domains: vec!["a.example".into(); 101],
            ..WebSearch::default()
        })
        .as_deref(),
        Some("web_search.allowed_domains")
    );
}
