#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use super::*;
use crate::config::{PolicySection, TenantPolicySection};

fn sent(fields: &[&str]) -> BTreeSet<String> {
    fields.iter().map(|s| s.to_string()).collect()
}

fn bounded() -> PolicySection {
    PolicySection {
        providers: vec!["openai".into(), "scripted".into()],
        models: vec!["gpt-4o*".into(), "scripted".into()],
        base_urls: vec!["https://LLM.example:443/v1/".into()],
        tools: vec!["read_file".into(), "list_dir".into(), "spawn_agent".into()],
        queues: vec!["default".into()],
        max_iterations: Some(10),
        max_tokens: Some(1000),
        token_budget: Some(50_000),
        tool_timeout_secs: Some(30),
        approval_timeout_secs: Some(60),
        timeout_secs: Some(600),
        max_children: Some(2),
        max_depth: Some(1),
        max_tree_sessions: None,
        max_web_search_uses: None,
        max_input_files: 5,
        max_input_bytes: 100,
        max_path_bytes: 20,
        max_path_depth: 3,
        tenants: Default::default(),
    }
}

fn apply_sent(
    p: &TenantPolicy,
    tweak: impl FnOnce(&mut SessionSpec),
    fields: &[&str],
) -> std::result::Result<SessionSpec, PolicyViolation> {
    let mut spec = SessionSpec::new("hi");
    tweak(&mut spec);
    let f = sent(fields);
    p.apply(&mut spec, Sent::Fields(&f), SpawnContext::default())
        .map(|()| spec)
}

#[test]
fn the_default_policy_allows_read_only_tools_and_spawning_and_no_base_url() {
    let policy = Policy::default();
    let p = policy.for_tenant(DEFAULT_TENANT);
    for t in agentq_agent::tools::READ_ONLY_TOOLS {
        assert!(p.allows_tool(t), "{t}");
    }
    assert!(p.allows_tool("spawn_agent"));
    for t in ["write_file", "edit_file", "shell", "http_fetch"] {
        assert!(!p.allows_tool(t), "{t}");
    }
    for prov in PROVIDERS {
        assert!(p.allows_provider(prov));
    }
    assert!(p.allows_model("anything-at-all"));
    // The default section compiles (Policy::default relies on it).
    Policy::from_section(&PolicySection::default()).unwrap();

    let e = apply_sent(
        p,
        |s| s.base_url = Some("http://127.0.0.1:7852/v1".into()),
        &["base_url"],
    )
    .unwrap_err();
    assert_eq!(e.field, "base_url");
    assert!(e.message.contains("none"), "{e}");
    let e = apply_sent(
        p,
        |s| s.tools = Some(vec!["read_file".into(), "shell".into()]),
        &["tools"],
    )
    .unwrap_err();
    assert_eq!(e.field, "tools[1]");
    assert!(e.message.contains("`shell`"), "{e}");
    // Nothing bounded by default: a request within the API's limits passes unchanged.
    let spec = apply_sent(p, |s| s.max_iterations = 10_000, &["max_iterations"]).unwrap();
    assert_eq!(spec.max_iterations, 10_000);
    assert_eq!(spec.token_budget, None);
    assert_eq!(spec.timeout_secs, None);
}

#[test]
fn every_refusal_names_its_field() {
    let policy = Policy::from_section(&bounded()).unwrap();
    let p = policy.global();
    type Tweak = fn(&mut SessionSpec);
    let cases: &[(&str, Tweak)] = &[
        ("provider", |s| s.provider = Some("anthropic".into())),
        ("model", |s| s.model = Some("gpt-5".into())),
        ("base_url", |s| {
            s.base_url = Some("https://llm.example/v2".into())
        }),
        ("base_url", |s| {
            s.base_url = Some("https://llm.example/v1?x=1".into())
        }),
        ("base_url", |s| {
            s.base_url = Some("https://user@llm.example/v1".into())
        }),
        ("base_url", |s| {
            s.base_url = Some("http://llm.example/v1".into())
        }),
        ("base_url", |s| {
            s.base_url = Some("https://llm.example:8443/v1".into())
        }),
        ("tools", |s| s.tools = Some(vec!["write_file".into()])),
        ("max_iterations", |s| s.max_iterations = 11),
        ("max_tokens", |s| s.max_tokens = 1001),
        ("tool_timeout_secs", |s| s.tool_timeout_secs = 31),
        ("approval_timeout_secs", |s| s.approval_timeout_secs = 61),
        ("token_budget", |s| s.token_budget = Some(50_001)),
        ("timeout_secs", |s| s.timeout_secs = Some(601)),
    ];
    // A refused tool is named by its place in the list.
    let named = |field: &str| match field {
        "tools" => "tools[0]".to_string(),
        other => other.to_string(),
    };
    for (field, tweak) in cases {
        let e = apply_sent(p, tweak, &[field]).unwrap_err();
        assert_eq!(e.field, named(field), "{e}");
        assert!(!e.message.is_empty());
    }
    // The same values stored in a row are refused as well (a stored row cannot tell a
    // default from a request).
    let within = apply_sent(p, |_| {}, &[]).unwrap();
    for (field, tweak) in cases {
        let mut spec = within.clone();
        tweak(&mut spec);
        let e = p
            .apply(&mut spec, Sent::Stored, SpawnContext::default())
            .unwrap_err();
        assert_eq!(e.field, named(field), "{e}");
    }
    // A default above a bound in a stored row is refused too: only a request can tell.
    let e = p
        .apply(
            &mut SessionSpec::new("hi"),
            Sent::Stored,
            SpawnContext::default(),
        )
        .unwrap_err();
    assert_eq!(e.field, "max_iterations");
    let mut spec = within.clone();
    let e = p
        .apply(&mut spec, Sent::Stored, SpawnContext { depth: 2 })
        .unwrap_err();
    assert_eq!(e.field, "depth");
    p.apply(&mut spec, Sent::Stored, SpawnContext { depth: 1 })
        .unwrap();
}

#[test]
fn defaults_above_a_bound_become_the_bound() {
    let policy = Policy::from_section(&bounded()).unwrap();
    let p = policy.global();
    // Nothing sent: every default above a bound is lowered, unset budgets get the bound.
    let spec = apply_sent(p, |_| {}, &["prompt"]).unwrap();
    assert_eq!(spec.max_iterations, 10);
    assert_eq!(spec.max_tokens, 1000);
    assert_eq!(spec.tool_timeout_secs, 30);
    assert_eq!(spec.approval_timeout_secs, 60);
    assert_eq!(spec.token_budget, Some(50_000));
    assert_eq!(spec.timeout_secs, Some(600));
    // Values within the bounds stay as sent.
    let spec = apply_sent(
        p,
        |s| {
            s.max_iterations = 3;
            s.token_budget = Some(10);
            s.timeout_secs = Some(5);
            s.provider = Some("openai".into());
            s.model = Some("gpt-4o-mini".into());
            s.base_url = Some("https://llm.example/v1".into());
            s.tools = Some(vec!["read_file".into(), "spawn_agent".into()]);
        },
        &[
            "max_iterations",
            "token_budget",
            "timeout_secs",
            "provider",
            "model",
            "base_url",
            "tools",
        ],
    )
    .unwrap();
    assert_eq!(spec.max_iterations, 3);
    assert_eq!(spec.token_budget, Some(10));
    assert_eq!(spec.timeout_secs, Some(5));
    // Applying the policy twice changes nothing and passes as a stored row.
    let mut again = spec.clone();
    p.apply(&mut again, Sent::Stored, SpawnContext::default())
        .unwrap();
    assert_eq!(again, spec);
}

#[test]
fn base_urls_compare_normalised() {
    assert_eq!(
        normalize_base_url("HTTPS://LLM.Example:443/v1/").unwrap(),
        "https://llm.example/v1"
    );
    assert_eq!(
        normalize_base_url("http://127.0.0.1:8080").unwrap(),
        "http://127.0.0.1:8080"
    );
    assert_eq!(
        normalize_base_url("http://h:80/a/b//").unwrap(),
        "http://h/a/b"
    );
    for bad in [
        "file:///etc/passwd",
        "http://u:p@h/",
        "http://h/?q",
        "http://h/#f",
        "not a url",
        "http:///",
    ] {
        assert!(normalize_base_url(bad).is_err(), "{bad}");
    }
    let p = Policy::from_section(&bounded()).unwrap();
    let p = p.global();
    assert!(p.allows_base_url("https://llm.example/v1"));
    assert!(p.allows_base_url("https://llm.example/v1/"));
    assert!(p.allows_base_url("https://LLM.EXAMPLE:443/v1"));
    assert!(!p.allows_base_url("https://llm.example/v1/chat"));
    assert!(!p.allows_base_url("https://llm.example"));
    assert!(!p.allows_base_url("https://llm.example.evil/v1"));
}

#[test]
fn tenants_replace_the_fields_they_set() {
    let mut section = bounded();
    section.tenants.insert(
        "builders".into(),
        TenantPolicySection {
            tools: Some(vec!["write_file".into()]),
            max_iterations: Some(100),
            ..Default::default()
        },
    );
    section.tenants.insert(
        "open".into(),
        TenantPolicySection {
            tools: Some(vec!["*".into()]),
            base_urls: Some(vec![]),
            ..Default::default()
        },
    );
    let policy = Policy::from_section(&section).unwrap();
    let b = policy.for_tenant("builders");
    // Replaced, not merged: the global read_file is not in the tenant's list.
    assert!(b.allows_tool("write_file"));
    assert!(!b.allows_tool("read_file"));
    assert_eq!(b.bounds.max_iterations, Some(100));
    // What it does not set is the global rule.
    assert_eq!(b.bounds.max_tokens, Some(1000));
    assert!(!b.allows_provider("anthropic"));
    assert!(b.allows_base_url("https://llm.example/v1"));
    let spec = apply_sent(b, |s| s.max_iterations = 50, &["max_iterations"]).unwrap();
    assert_eq!(spec.max_iterations, 50);

    let o = policy.for_tenant("open");
    assert!(o.allows_tool("shell") && o.allows_tool("write_file"));
    assert!(!o.allows_base_url("https://llm.example/v1"));

    // Another tenant, or the default one, gets the global policy.
    for t in ["default", "nobody"] {
        let g = policy.for_tenant(t);
        assert!(g.allows_tool("read_file") && !g.allows_tool("write_file"));
        let e = apply_sent(g, |s| s.max_iterations = 50, &["max_iterations"]).unwrap_err();
        assert_eq!(e.field, "max_iterations");
    }
}

#[test]
fn sub_agent_limits_are_the_lower_of_host_and_policy() {
    let policy = Policy::from_section(&bounded()).unwrap();
    let p = policy.global();
    assert_eq!(p.max_depth(3), 1);
    assert_eq!(p.max_depth(0), 0);
    assert_eq!(p.max_children(16), 2);
    assert_eq!(p.max_children(1), 1);
    let open = Policy::default();
    assert_eq!(open.global().max_depth(3), 3);
    assert_eq!(open.global().max_children(16), 16);
}

#[test]
fn defaults_of_the_host_are_filtered_and_checked() {
    let policy = Policy::from_section(&bounded()).unwrap();
    let p = policy.global();
    let defaults: Vec<String> = ["read_file", "grep", "list_dir"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(p.allowed_tools(&defaults), vec!["read_file", "list_dir"]);
    assert_eq!(p.check_provider("anthropic").unwrap_err().field, "provider");
    assert_eq!(p.check_model("claude-x").unwrap_err().field, "model");
    p.check_model("gpt-4o-mini").unwrap();
    assert_eq!(
        p.check_tools(&defaults).unwrap_err().field,
        "tools[1]",
        "grep is not allowed"
    );
}

#[test]
fn bad_sections_name_their_setting() {
    let mut s = bounded();
    s.models = vec!["gpt-[".into()];
    let e = Policy::from_section(&s).unwrap_err().to_string();
    assert!(e.contains("policy.models"), "{e}");
    let mut s = bounded();
    s.providers = vec!["gemini".into()];
    let e = Policy::from_section(&s).unwrap_err().to_string();
    assert!(e.contains("policy.providers"), "{e}");
    let mut s = bounded();
    s.tenants.insert(
        "acme".into(),
        TenantPolicySection {
            base_urls: Some(vec!["ftp://x".into()]),
            ..Default::default()
        },
    );
    let e = Policy::from_section(&s).unwrap_err().to_string();
    assert!(e.contains("policy.tenants.acme.base_urls"), "{e}");
}

#[test]
fn queues_are_checked_by_glob_and_the_default_allows_any() {
    let strict = Policy::from_section(&bounded()).unwrap();
    let p = strict.global();
    assert!(p.check_queue("default").is_ok());
    let v = p.check_queue("internal").unwrap_err();
    assert_eq!(v.field, "queue");
    assert!(v.message.contains("internal"), "{v}");
    let open = Policy::default();
    assert!(open.global().check_queue("any.queue-name").is_ok());
    let mut section = bounded();
    section.tenants.insert(
        "ops".into(),
        TenantPolicySection {
            queues: Some(vec!["ops-*".into()]),
            ..Default::default()
        },
    );
    let p = Policy::from_section(&section).unwrap();
    assert!(p.for_tenant("ops").check_queue("ops-private").is_ok());
    assert!(p.for_tenant("ops").check_queue("default").is_err());
    assert!(p.for_tenant("other").check_queue("ops-private").is_err());
}

#[test]
fn file_limits_come_from_the_section_and_a_tenant_replaces_them() {
    let d = Policy::default();
    assert_eq!(d.for_tenant(DEFAULT_TENANT).files, FileLimits::DEFAULT);
    let mut section = bounded();
    section.tenants.insert(
        "big".into(),
        TenantPolicySection {
            max_input_bytes: Some(5000),
            max_path_depth: Some(8),
            ..Default::default()
        },
    );
    let p = Policy::from_section(&section).unwrap();
    assert_eq!(
        p.global().files,
        FileLimits {
            max_files: 5,
            max_bytes: 100,
            max_path_bytes: 20,
            max_path_depth: 3
        }
    );
    assert_eq!(
        p.for_tenant("big").files,
        FileLimits {
            max_files: 5,
            max_bytes: 5000,
            max_path_bytes: 20,
            max_path_depth: 8
        }
    );
    assert_eq!(p.max_input_bytes(), 5000);
    assert_eq!(Policy::deny_all().global().files.max_files, 0);
}

#[test]
fn the_web_search_is_a_tool_the_policy_allows_with_its_uses_bounded() {
    use agentq_agent::spec::{WEB_SEARCH_TOOL, WebSearch};
    let search = |s: &mut SessionSpec| s.tools = Some(vec![WEB_SEARCH_TOOL.into()]);
    // Off unless allowed: the default policy refuses it like any tool it does not list.
    let policy = Policy::default();
    let e = apply_sent(policy.for_tenant(DEFAULT_TENANT), search, &["tools"]).unwrap_err();
    assert_eq!(e.field, "tools[0]");
    assert!(e.message.contains("`web_search`"), "{e}");

    let mut section = PolicySection::default();
    section.tools.push(WEB_SEARCH_TOOL.into());
    section.max_web_search_uses = Some(3);
    section.tenants.insert(
        "acme".into(),
        TenantPolicySection {
            max_web_search_uses: Some(1),
            ..Default::default()
        },
    );
    let policy = Policy::from_section(&section).unwrap();
    let p = policy.global();
    let uses = |w: Option<u32>| {
        move |s: &mut SessionSpec| {
            s.tools = Some(vec![WEB_SEARCH_TOOL.into()]);
            s.web_search = w.map(|n| WebSearch {
                max_uses: Some(n),
                ..WebSearch::default()
            });
        }
    };
    let e = apply_sent(p, uses(Some(4)), &["tools", "web_search"]).unwrap_err();
    assert_eq!(e.field, "web_search.max_uses");
    assert!(e.message.contains("at most 3"), "{e}");
    let ok = apply_sent(p, uses(Some(2)), &["tools", "web_search"]).unwrap();
    assert_eq!(ok.web_search.unwrap().max_uses, Some(2));
    // The default (5) is above the bound: a session that may search gets the bound.
    let lowered = apply_sent(p, uses(None), &["tools"]).unwrap();
    assert_eq!(lowered.web_search.unwrap().max_uses, Some(3));
    let host_tools = apply_sent(p, |_| {}, &[]).unwrap();
    assert_eq!(host_tools.web_search.unwrap().max_uses, Some(3));
    let not_searching = apply_sent(p, |s| s.tools = Some(vec!["read_file".into()]), &["tools"]);
    assert_eq!(not_searching.unwrap().web_search, None);
    // A stored row is held to the same bound.
    let mut stored = SessionSpec::new("hi");
    uses(Some(4))(&mut stored);
    let e = p
        .apply(&mut stored, Sent::Stored, SpawnContext::default())
        .unwrap_err();
    assert_eq!(e.field, "web_search.max_uses");
    // A tenant's bound replaces the global one.
    let e = apply_sent(policy.for_tenant("acme"), uses(Some(2)), &["web_search"]).unwrap_err();
    assert!(e.message.contains("at most 1"), "{e}");
}
