//! The rules of the settings, each error naming the setting with its variable and flag.

use super::{budget, env_of, invalid_with};
use crate::config::*;
use agentq_agent::provider::transport::{HttpVersion, MAX_STREAMS_PER_CONNECTION, Transport};

#[test]
fn validation_names_the_setting_its_variable_and_its_flag() {
    // The heartbeat must be shorter than the lease, or a running session is taken over.
    let e = invalid_with(|s| s.worker.heartbeat_secs = Secs(6.0));
    for name in [
        "worker.heartbeat_secs",
        "AGENTQ_HEARTBEAT_SECS",
        "--heartbeat-secs",
        "lease_ttl_secs",
    ] {
        assert!(e.contains(name), "{name} not in {e}");
    }
    let e = invalid_with(|s| s.worker.reclaim_min_idle_secs = Secs(0.25));
    assert!(e.contains("worker.reclaim_min_idle_secs"), "{e}");
    for (key, tweak) in [
        (
            "worker.lease_ttl_secs",
            (|s: &mut Settings| s.worker.lease_ttl_secs = Secs(0.0)) as fn(&mut Settings),
        ),
        ("worker.lease_ttl_secs", |s| {
            s.worker.lease_ttl_secs = Secs(f64::NAN)
        }),
        ("worker.drain_timeout_secs", |s| {
            s.worker.drain_timeout_secs = Secs(-1.0)
        }),
        ("worker.drain_timeout_secs", |s| {
            s.worker.drain_timeout_secs = Secs(1e30)
        }),
        ("worker.reclaim_interval_secs", |s| {
            s.worker.reclaim_interval_secs = Secs(0.0)
        }),
        ("worker.concurrency", |s| s.worker.concurrency = 0),
        ("worker.max_attempts", |s| s.worker.max_attempts = 0),
        ("worker.checkpoint_batch_max", |s| {
            s.worker.checkpoint_batch_max = 0
        }),
        ("worker.checkpoint_writers", |s| {
            s.worker.checkpoint_writers = 65
        }),
        ("worker.write_ahead_grace_ms", |s| {
            s.worker.write_ahead_grace_ms = 60_001
        }),
        ("worker.read_block_ms", |s| s.worker.read_block_ms = 0),
        ("worker.max_llm_retries", |s| s.worker.max_llm_retries = 101),
        ("worker.rate_limit_suspend_secs", |s| {
            s.worker.rate_limit_suspend_secs = Secs(-1.0)
        }),
        ("worker.rate_limit_suspend_secs", |s| {
            s.worker.rate_limit_suspend_secs = Secs(f64::NAN)
        }),
        ("worker.max_file_bytes", |s| s.worker.max_file_bytes = 0),
        ("worker.max_file_bytes", |s| {
            s.worker.max_file_bytes = s.worker.workspace_quota_bytes + 1
        }),
        ("worker.workspace_quota_bytes", |s| {
            s.worker.workspace_quota_bytes = u64::MAX
        }),
        ("worker.event_ttl_secs", |s| {
            s.worker.event_ttl_secs = Secs(0.0)
        }),
        ("worker.queues", |s| s.worker.queues.clear()),
        ("worker.default_provider", |s| {
            s.worker.default_provider = Some("gpt".into())
        }),
        ("scheduler.sweep_interval_secs", |s| {
            s.scheduler.sweep_interval_secs = 0
        }),
        ("scheduler.queues", |s| {
            s.scheduler.queues = vec![" ".into()]
        }),
    ] {
        let e = invalid_with(tweak);
        assert!(e.contains(&format!("`{key}`")), "{key} not in {e}");
    }
    let e = invalid_with(|s| s.worker.concurrency = 0);
    assert!(
        e.contains("AGENTQ_WORKER_CONCURRENCY") && e.contains("--concurrency"),
        "{e}"
    );
}

#[test]
fn policy_section_with_tenants() {
    let c = Settings::from_toml(
        r#"
        [worker]
        default_tools = ["read_file", "write_file"]

        [policy]
        tools = ["read_file", "write_file", "spawn_agent"]
        base_urls = ["http://127.0.0.1:8000/v1"]
        max_iterations = 20
        timeout_secs = 600

        [policy.tenants.acme]
        tools = ["read_file"]
        max_iterations = 5
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.policy.max_iterations, Some(20));
    let acme = c.policy.tenant("acme");
    // Replaced, not merged; unset fields are the global ones.
    assert_eq!(acme.tools, vec!["read_file"]);
    assert_eq!(acme.max_iterations, Some(5));
    assert_eq!(acme.timeout_secs, Some(600));
    assert_eq!(acme.base_urls, vec!["http://127.0.0.1:8000/v1"]);
    assert_eq!(c.policy.tenant("other").tools, c.policy.tools);

    let e = Settings::from_toml("[policy.tenants.acme]\ntool = [\"x\"]\n").unwrap_err();
    assert!(e.to_string().contains("tool"), "{e}");

    let env = env_of(&[
        ("AGENTQ_POLICY_TOOLS", "read_file, write_file"),
        ("AGENTQ_POLICY_BASE_URLS", "http://a/v1,http://b"),
    ]);
    let c = Settings::load_with(None, env).unwrap();
    assert_eq!(c.policy.tools, vec!["read_file", "write_file"]);
    assert_eq!(c.policy.base_urls, vec!["http://a/v1", "http://b"]);
}

/// A setting's key, and a change to the defaults that breaks one of its rules.
type Case = (&'static str, fn(&mut Settings));

/// Each case breaks one rule; the error names the setting it breaks.
fn assert_each_names_its_setting(cases: &[Case]) {
    for (key, tweak) in cases {
        let e = invalid_with(tweak);
        assert!(e.contains(&format!("`{key}")), "{key} not in {e}");
    }
}

/// The worker's own defaults must be within the global policy.
#[test]
fn policy_validation_names_the_worker_default_it_forbids() {
    assert_each_names_its_setting(&[
        ("worker.default_tools", |s| {
            s.worker.default_tools = Some(vec!["shell".into()])
        }),
        // The implicit default (the read-only set) must be allowed too.
        ("worker.default_tools", |s| {
            s.policy.tools = vec!["read_file".into()]
        }),
        ("worker.default_provider", |s| {
            s.worker.default_provider = Some("scripted".into());
            s.policy.providers = vec!["openai".into()]
        }),
        // The provider the environment implies is the default, and held to the policy.
        ("worker.default_provider", |s| {
            s.providers.anthropic_api_key = Some(Secret::new("sk-ant"));
            s.policy.providers = vec!["openai".into()]
        }),
        ("worker.default_model", |s| {
            s.policy.models = vec!["gpt-*".into()];
            s.worker.default_model = Some("claude-x".into());
        }),
        // The search is the default provider's own, and this one has none.
        ("worker.default_tools", |s| {
            s.policy.tools.push("web_search".into());
            s.worker.default_tools = Some(vec!["read_file".into(), "web_search".into()]);
            s.worker.default_provider = Some("openai".into());
        }),
    ]);
}

#[test]
fn policy_validation_names_the_global_setting() {
    assert_each_names_its_setting(&[
        ("policy.providers", |s| {
            s.policy.providers.push("gemini".into())
        }),
        ("policy.models", |s| s.policy.models = vec!["a[".into()]),
        ("policy.base_urls", |s| {
            s.policy.base_urls = vec!["http://h/?q=1".into()]
        }),
        ("policy.max_iterations", |s| {
            s.policy.max_iterations = Some(0)
        }),
        ("policy.max_tokens", |s| {
            s.policy.max_tokens = Some(2_000_000)
        }),
        ("policy.token_budget", |s| s.policy.token_budget = Some(0)),
        ("policy.timeout_secs", |s| s.policy.timeout_secs = Some(0)),
        ("policy.timeout_secs", |s| {
            s.policy.timeout_secs = Some(9_000_000_000_000_000)
        }),
        ("policy.approval_timeout_secs", |s| {
            s.policy.approval_timeout_secs = Some(30 * 24 * 3600 + 1)
        }),
        ("policy.token_budget", |s| {
            s.policy.token_budget = Some(1_000_000_001)
        }),
        ("policy.max_depth", |s| s.policy.max_depth = Some(65)),
        ("policy.max_input_files", |s| {
            s.policy.max_input_files = 10_001
        }),
        ("policy.max_input_bytes", |s| {
            s.policy.max_input_bytes = 16 * 1024 * 1024 + 1
        }),
        ("policy.max_path_bytes", |s| s.policy.max_path_bytes = 0),
        ("policy.max_path_depth", |s| s.policy.max_path_depth = 129),
        ("policy.max_tree_sessions", |s| {
            s.policy.max_tree_sessions = Some(0)
        }),
        ("policy.max_web_search_uses", |s| {
            s.policy.max_web_search_uses = Some(51)
        }),
    ]);
}

#[test]
fn policy_validation_names_the_tenant_setting() {
    assert_each_names_its_setting(&[
        ("policy.tenants.acme.max_input_bytes", |s| {
            s.policy.tenants.insert(
                "acme".into(),
                TenantPolicySection {
                    max_input_bytes: Some(u64::MAX),
                    ..Default::default()
                },
            );
        }),
        ("policy.tenants.acme.max_iterations", |s| {
            s.policy.tenants.insert(
                "acme".into(),
                TenantPolicySection {
                    max_iterations: Some(0),
                    ..Default::default()
                },
            );
        }),
        ("policy.tenants.acme.tools", |s| {
            s.policy.tenants.insert(
                "acme".into(),
                TenantPolicySection {
                    tools: Some(vec!["{".into()]),
                    ..Default::default()
                },
            );
        }),
        ("policy.tenants", |s| {
            s.policy
                .tenants
                .insert("a b".into(), TenantPolicySection::default());
        }),
    ]);
}

#[test]
fn price_validation_names_the_entry() {
    assert_each_names_its_setting(&[
        ("prices[0].model", |s| {
            s.prices = vec![crate::budget::PriceEntry {
                model: "gpt[".into(),
                ..Default::default()
            }]
        }),
        ("prices[0].output", |s| {
            s.prices = vec![crate::budget::PriceEntry {
                model: "gpt-4o".into(),
                output: f64::NAN,
                ..Default::default()
            }]
        }),
        ("prices[0].input", |s| {
            s.prices = vec![crate::budget::PriceEntry {
                model: "gpt-4o".into(),
                input: -1.0,
                ..Default::default()
            }]
        }),
        ("prices[0].web_search", |s| {
            s.prices = vec![crate::budget::PriceEntry {
                model: "claude-*".into(),
                web_search: Some(f64::INFINITY),
                ..Default::default()
            }]
        }),
    ]);
}

#[test]
fn budget_validation_names_the_entry() {
    assert_each_names_its_setting(&[
        ("budgets[0].tokens", |s| {
            s.budgets = vec![budget(None, None)]
        }),
        ("budgets[0].tokens", |s| {
            s.budgets = vec![budget(Some(0), None)]
        }),
        ("budgets[0].usd", |s| {
            s.budgets = vec![budget(None, Some(-2.0))]
        }),
        ("budgets[0].usd", |s| {
            s.budgets = vec![budget(None, Some(f64::INFINITY))]
        }),
        ("budgets[1].tenant", |s| {
            s.budgets = vec![budget(Some(5), None), budget(Some(6), None)]
        }),
        ("budgets[0].tenant", |s| {
            let mut b = budget(Some(5), None);
            b.tenant = "a b".into();
            s.budgets = vec![b]
        }),
    ]);
}

/// A configured endpoint receives the key, so it must be plain http(s): each malformed
/// one is refused at start, naming the setting and its variable.
#[test]
fn provider_base_urls_are_checked_at_start() {
    for bad in [
        "ftp://llm/v1",
        "http://user:pw@llm/v1",
        "http://llm/v1?x=",
        "http://llm/v1#f",
    ] {
        let e = invalid_with(|s| s.providers.openai_base_url = Some(bad.into()));
        assert!(
            e.contains("`providers.openai_base_url` (OPENAI_BASE_URL)"),
            "{bad}: {e}"
        );
        let e = invalid_with(|s| s.providers.anthropic_base_url = Some(bad.into()));
        assert!(e.contains("`providers.anthropic_base_url`"), "{bad}: {e}");
        let e = Settings::from_toml(&format!(
            "[providers.tenants.acme]\nopenai_base_url = {bad:?}\n"
        ))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("providers.tenants.acme.openai_base_url"),
            "{bad}: {e}"
        );
    }
    let e = Settings::from_toml("[providers.tenants.acme]\nopenai_key_env = \"A B\"\n")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("providers.tenants.acme.openai_key_env"), "{e}");
}

/// `[retention]`: no retention of 0 days (nor of a century and more), per tenant and per
/// queue too, and an export that names a target; the variable sets and names it.
#[test]
fn retention_validation_names_the_setting() {
    assert_each_names_its_setting(&[
        ("retention.days", |s| s.retention.days = Some(0)),
        ("retention.days", |s| s.retention.days = Some(36_501)),
        ("retention.export", |s| {
            s.retention.export = Some("/tmp/x".into())
        }),
        ("retention.export", |s| {
            s.retention.export = Some("s3".into())
        }),
        ("retention.batch", |s| s.retention.batch = 0),
        ("retention.interval_secs", |s| s.retention.interval_secs = 0),
    ]);
    let e = Settings::from_toml("[retention.tenants.acme]\ndays = 0\n")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("retention.tenants.acme.days"), "{e}");
    let e = Settings::from_toml("[retention.queues.q]\ndays = 0\n")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("retention.queues.q.days"), "{e}");
    let e = Settings::resolve(None, env_of(&[("AGENTQ_RETENTION_DAYS", "0")]), |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("retention.days") && e.contains("AGENTQ_RETENTION_DAYS"),
        "{e}"
    );
    let s = Settings::resolve(None, env_of(&[("AGENTQ_RETENTION_DAYS", "30")]), |_| {}).unwrap();
    assert_eq!(s.retention.days, Some(30));
    assert_eq!(s.retention.rules().len(), 1);
    assert!(Settings::default().retention.rules().is_empty());
    let e = Settings::from_toml("[retention]\nkeep = \"transcript\"\n").unwrap_err();
    assert!(e.to_string().contains("keep"), "{e}");
}

/// `[schedules]`: a poll or lease of zero, of more than a day, or a lease not longer than
/// the poll is refused naming the key and its variable; a negative one from the
/// environment too.
#[test]
fn schedules_validation_names_the_setting() {
    assert_each_names_its_setting(&[
        ("schedules.poll_secs", |s| s.schedules.poll_secs = 0),
        ("schedules.poll_secs", |s| s.schedules.poll_secs = 86_401),
        ("schedules.lease_secs", |s| s.schedules.lease_secs = 0),
        ("schedules.lease_secs", |s| s.schedules.lease_secs = 86_401),
        ("schedules.lease_secs", |s| {
            s.schedules.poll_secs = 5;
            s.schedules.lease_secs = 5;
        }),
    ]);
    for (var, value, key) in [
        ("AGENTQ_SCHEDULES_POLL_SECS", "0", "schedules.poll_secs"),
        ("AGENTQ_SCHEDULES_POLL_SECS", "-1", "schedules.poll_secs"),
        ("AGENTQ_SCHEDULES_LEASE_SECS", "-5", "schedules.lease_secs"),
        ("AGENTQ_SCHEDULES_LEASE_SECS", "1", "schedules.lease_secs"),
        ("AGENTQ_SCHEDULES_LEASE_SECS", "1e9", "schedules.lease_secs"),
    ] {
        let e = Settings::resolve(None, env_of(&[(var, value)]), |_| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains(var), "{var}={value}: {e}");
    }
    let s = Settings::resolve(
        None,
        env_of(&[
            ("AGENTQ_SCHEDULES_POLL_SECS", "1"),
            ("AGENTQ_SCHEDULES_LEASE_SECS", "3"),
        ]),
        |_| {},
    )
    .unwrap();
    assert_eq!((s.schedules.poll_secs, s.schedules.lease_secs), (1, 3));
}

/// `[redis]`: a cluster from the environment, with its seed nodes and the partitions
/// it defaults to; a partition count out of range and several servers without `cluster`
/// refused, naming the setting.
#[test]
fn redis_cluster_settings() {
    let env = env_of(&[
        ("AGENTQ_REDIS_URL", "redis://a:6379,redis://b:6379"),
        ("AGENTQ_REDIS_CLUSTER", "true"),
    ]);
    let s = Settings::load_with(None, env).unwrap();
    assert!(s.redis.cluster);
    assert_eq!(s.redis.partitions(), CLUSTER_PARTITIONS);
    assert_eq!(Settings::default().redis.partitions(), 1);
    assert_eq!(s.limiter.on_unavailable, OnUnavailable::Closed);
    let env = env_of(&[("AGENTQ_REDIS_PARTITIONS", "16")]);
    assert_eq!(
        Settings::load_with(None, env).unwrap().redis.partitions(),
        16
    );

    for p in [0, MAX_PARTITIONS + 1] {
        let e = invalid_with(|s| s.redis.partitions = Some(p));
        assert!(e.contains("redis.partitions"), "{e}");
    }
    let e = invalid_with(|s| s.redis_url = Some("redis://a:6379,redis://b:6379".into()));
    assert!(e.contains("redis_url") && e.contains("cluster"), "{e}");
    let open: Settings = Settings::from_toml("[limiter]\non_unavailable = \"open\"\n").unwrap();
    assert_eq!(open.limiter.on_unavailable, OnUnavailable::Open);
    assert!(Settings::from_toml("[limiter]\non_unavailable = \"maybe\"\n").is_err());
}

#[test]
fn several_database_urls_are_shards_and_a_bad_one_is_named_by_its_position() {
    let s = Settings {
        database_url: Some("postgres://a/x, postgresql://b/y".into()),
        ..Settings::default()
    };
    s.validate().unwrap();
    assert_eq!(
        s.database_urls(),
        ["postgres://a/x", "postgresql://b/y"].map(String::from)
    );
    let e = invalid_with(|s| {
        s.database_url = Some("postgres://u:secret@a/x,mysql://u:secret@b/y".into())
    });
    for name in ["database_url", "AGENTQ_DATABASE_URL", "URL 2 of 2"] {
        assert!(e.contains(name), "{name} not in {e}");
    }
    assert!(!e.contains("secret"), "{e}");
    let e = invalid_with(|s| s.database_url = Some("postgres://a/x,".into()));
    assert!(e.contains("URL 2 of 2"), "{e}");
    assert!(Settings::default().database_urls().is_empty());
}

#[test]
fn provider_transport_is_read_and_checked() {
    let c = Settings::load_with(
        None,
        env_of(&[
            ("AGENTQ_PROVIDERS_HTTP", "http2"),
            ("AGENTQ_PROVIDERS_STREAMS_PER_CONNECTION", "250"),
        ]),
    )
    .unwrap();
    let t = c.provider_settings().transport;
    assert_eq!(t.http, HttpVersion::Http2);
    assert_eq!(t.streams_per_connection, 250);
    // Each tenant's providers travel the same way.
    let c = Settings::from_toml(
        "[providers]\nhttp = \"http1\"\n[providers.tenants.acme]\nopenai_key_env = \"A\"\n",
    )
    .unwrap();
    assert_eq!(
        c.tenant_provider_settings()["acme"].transport.http,
        HttpVersion::Http1
    );
    assert_eq!(
        Settings::default().providers.transport(),
        Transport::default()
    );

    let e = Settings::load_with(None, env_of(&[("AGENTQ_PROVIDERS_HTTP", "h3")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("AGENTQ_PROVIDERS_HTTP") && e.contains("auto, http1 or http2"),
        "{e}"
    );
    let e = Settings::from_toml("[providers]\nhttp = \"spdy\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("http"), "{e}");
    for bad in [0, MAX_STREAMS_PER_CONNECTION + 1] {
        let e = invalid_with(|s| s.providers.streams_per_connection = bad);
        assert!(
            e.contains(
                "`providers.streams_per_connection` (AGENTQ_PROVIDERS_STREAMS_PER_CONNECTION)"
            ),
            "{e}"
        );
    }
}
