#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};

use super::*;
use agentq_agent::guard::{Behavior, HookPoint, OnTruncated};

fn no_env(_: &str) -> Option<String> {
    None
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn defaults() {
    let c = Settings::default();
    assert_eq!(c.api_addr, "127.0.0.1:7700");
    assert_eq!(c.metrics_addr, "127.0.0.1:9464");
    assert_eq!(c.api_url, "http://127.0.0.1:7700");
    assert_eq!(c.sqlite_path, PathBuf::from("./agentq.db"));
    assert_eq!(c.database_url, None);
    assert_eq!(c.redis_url, None);
    assert_eq!(c.worker.concurrency, 256);
    assert_eq!(c.worker.queues, vec!["default"]);
    assert_eq!(c.worker.lease_ttl_secs, Secs(6.0));
    assert_eq!(c.worker.heartbeat_secs, Secs(2.0));
    assert_eq!(c.worker.reclaim_min_idle_secs, Secs(6.0));
    assert_eq!(c.worker.reclaim_interval_secs, Secs(2.0));
    assert_eq!(c.worker.max_attempts, 5);
    assert_eq!(c.worker.drain_timeout_secs, Secs(30.0));
    assert_eq!(c.worker.read_block_ms, 2000);
    assert_eq!(
        c.worker.workspace_root,
        PathBuf::from("./agentq-workspaces")
    );
    assert_eq!(c.worker.default_provider, "scripted");
    assert_eq!(c.worker.default_model, None);
    assert_eq!(c.worker.default_tools, None);
    assert!(!c.worker.shell_enabled);
    assert!(!c.worker.allow_private_network);
    assert!(c.worker.allowed_hosts.is_empty());
    assert!(c.worker.sensitive_tools.is_empty());
    assert_eq!(c.worker.event_ttl_secs, Secs(86_400.0));
    assert_eq!(c.worker.max_depth, 3);
    assert_eq!(c.worker.max_children, 16);
    assert_eq!(c.worker.checkpoint_batch_max, 256);
    assert_eq!(c.worker.checkpoint_writers, 2);
    assert_eq!(c.worker.write_ahead_grace_ms, 250);
    assert_eq!(c.scheduler.sweep_interval_secs, 5);
    assert_eq!(c.scheduler.sweep_age_secs, 10);
    assert_eq!(c.scheduler.max_prompt_bytes, 1_000_000);
    assert_eq!(c.scheduler.max_batch, 10_000);
    assert_eq!(c.scheduler.queues, vec!["default"]);
    assert_eq!(c.providers.script, None);
    assert_eq!(c.policy.providers, vec!["openai", "anthropic", "scripted"]);
    assert_eq!(c.policy.models, vec!["*"]);
    assert!(c.policy.base_urls.is_empty());
    assert_eq!(
        c.policy.tools,
        vec!["read_file", "list_dir", "glob", "grep", "spawn_agent"]
    );
    assert_eq!(c.policy.max_iterations, None);
    assert_eq!(c.policy.token_budget, None);
    assert!(c.policy.tenants.is_empty());
    // An empty file is the defaults, and the defaults are valid.
    assert_eq!(Settings::from_toml("").unwrap(), c);
    c.validate().unwrap();
}

#[test]
fn file_sections() {
    let c = Settings::from_toml(
        r#"
        database_url = "postgres://db/agentq"
        api_addr = "0.0.0.0:8080"

        [worker]
        concurrency = 8
        queues = ["default", "batch"]
        default_provider = "openai"
        default_model = "gpt-4o"
        default_tools = ["read_file"]
        shell_enabled = true
        heartbeat_secs = 0.5

        [scheduler]
        sweep_interval_secs = 1
        max_batch = 50

        [providers]
        openai_base_url = "http://llm:8000/v1"
        "#,
    )
    .unwrap();
    assert_eq!(c.database_url.as_deref(), Some("postgres://db/agentq"));
    assert_eq!(c.api_addr, "0.0.0.0:8080");
    // Unset fields keep their defaults.
    assert_eq!(c.metrics_addr, DEFAULT_METRICS_ADDR);
    assert_eq!(c.worker.concurrency, 8);
    assert_eq!(c.worker.queues, vec!["default", "batch"]);
    assert_eq!(c.worker.default_provider, "openai");
    assert_eq!(c.worker.default_model.as_deref(), Some("gpt-4o"));
    assert_eq!(c.worker.default_tools, Some(vec!["read_file".to_string()]));
    assert!(c.worker.shell_enabled);
    assert_eq!(c.worker.heartbeat_secs, Secs(0.5));
    assert_eq!(c.worker.lease_ttl_secs, Secs(6.0));
    assert_eq!(c.scheduler.sweep_interval_secs, 1);
    assert_eq!(c.scheduler.max_batch, 50);
    assert_eq!(c.scheduler.max_prompt_bytes, 1_000_000);
    assert_eq!(
        c.providers.openai_base_url.as_deref(),
        Some("http://llm:8000/v1")
    );
}

#[test]
fn file_errors() {
    let e = Settings::from_toml("[worker]\nconcurency = 3\n").unwrap_err();
    assert!(e.to_string().contains("concurency"), "{e}");
    let e = Settings::from_toml("[worker]\nconcurrency = \"many\"\n").unwrap_err();
    assert!(e.to_string().contains("concurrency"), "{e}");
    let e = Settings::from_toml("[providers]\nopenai_api_key = \"sk-1\"\n").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("providers.openai_api_key"), "{msg}");
    assert!(msg.contains("OPENAI_API_KEY"), "{msg}");
    assert!(!msg.contains("sk-1"), "{msg}");
    let e = Settings::load_with(Some(Path::new("/nonexistent/agentq.toml")), no_env).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/agentq.toml"), "{e}");
}

#[test]
fn load_file_then_env() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentq.toml");
    std::fs::write(
        &path,
        "redis_url = \"redis://file:6379\"\napi_addr = \"0.0.0.0:1\"\n\
         [worker]\nconcurrency = 7\ndefault_provider = \"anthropic\"\n\
         [providers]\nanthropic_base_url = \"http://file\"\n",
    )
    .unwrap();

    let c = Settings::load_with(Some(&path), no_env).unwrap();
    assert_eq!(c.redis_url.as_deref(), Some("redis://file:6379"));
    assert_eq!(c.api_addr, "0.0.0.0:1");
    assert_eq!(c.worker.concurrency, 7);
    assert_eq!(c.providers.openai_api_key, None);

    let env = env_of(&[
        ("AGENTQ_DATABASE_URL", "postgres://env/db"),
        ("AGENTQ_REDIS_URL", "redis://env:6379"),
        ("AGENTQ_API_ADDR", "127.0.0.1:9999"),
        ("AGENTQ_METRICS_ADDR", "127.0.0.1:9998"),
        ("AGENTQ_API_URL", "http://api:1"),
        ("ANTHROPIC_BASE_URL", "http://env"),
        ("OPENAI_API_KEY", "sk-env"),
        ("ANTHROPIC_API_KEY", ""),
        // The environment beats the file.
        ("AGENTQ_WORKER_CONCURRENCY", "9"),
        ("AGENTQ_DEFAULT_PROVIDER", "openai"),
    ]);
    let c = Settings::load_with(Some(&path), env).unwrap();
    assert_eq!(c.database_url.as_deref(), Some("postgres://env/db"));
    assert_eq!(c.redis_url.as_deref(), Some("redis://env:6379"));
    assert_eq!(c.api_addr, "127.0.0.1:9999");
    assert_eq!(c.metrics_addr, "127.0.0.1:9998");
    assert_eq!(c.api_url, "http://api:1");
    assert_eq!(c.worker.concurrency, 9);
    assert_eq!(c.worker.default_provider, "openai");
    assert_eq!(
        c.providers.anthropic_base_url.as_deref(),
        Some("http://env")
    );
    assert_eq!(
        c.providers.openai_api_key.as_ref().map(Secret::expose),
        Some("sk-env")
    );
    // Empty means unset.
    assert_eq!(c.providers.anthropic_api_key, None);
    // Keys never show in Debug output and are never serialised.
    assert!(!format!("{c:?}").contains("sk-env"));
    assert!(format!("{c:?}").contains("<redacted>"));
    assert!(!serde_json::to_string(&c).unwrap().contains("sk-env"));
    let s = c.provider_settings();
    assert_eq!(s.openai_api_key.as_deref(), Some("sk-env"));
    assert_eq!(s.anthropic_base_url.as_deref(), Some("http://env"));
}

/// Every variable that `agentq worker` and `agentq dev` used to read through their flags
/// sets its setting in the environment layer.
#[test]
fn every_worker_variable_sets_its_setting() {
    let c = Settings::load_with(
        None,
        env_of(&[
            ("AGENTQ_DB", "/data/a.db"),
            ("AGENTQ_WORKER_CONCURRENCY", "12"),
            ("AGENTQ_LEASE_TTL_SECS", "2"),
            ("AGENTQ_HEARTBEAT_SECS", "0.5"),
            ("AGENTQ_RECLAIM_MIN_IDLE_SECS", "3"),
            ("AGENTQ_RECLAIM_INTERVAL_SECS", "0.25"),
            ("AGENTQ_MAX_ATTEMPTS", "2"),
            ("AGENTQ_DRAIN_TIMEOUT_SECS", "15"),
            ("AGENTQ_CHECKPOINT_BATCH_MAX", "64"),
            ("AGENTQ_CHECKPOINT_WRITERS", "4"),
            ("AGENTQ_WRITE_AHEAD_GRACE_MS", "0"),
            ("AGENTQ_WORKSPACE_ROOT", "/ws"),
            ("AGENTQ_DEFAULT_PROVIDER", "anthropic"),
            ("AGENTQ_DEFAULT_MODEL", "claude-x"),
            ("AGENTQ_SCRIPT", "/s.json"),
            ("AGENTQ_ALLOWED_HOSTS", "localhost:8080, 10.0.0.1"),
            ("AGENTQ_SHELL_ENABLED", "true"),
            ("OPENAI_BASE_URL", "http://o/v1"),
        ]),
    )
    .unwrap();
    let w = &c.worker;
    assert_eq!(c.sqlite_path, PathBuf::from("/data/a.db"));
    assert_eq!(w.concurrency, 12);
    assert_eq!(w.lease_ttl_secs, Secs(2.0));
    assert_eq!(w.heartbeat_secs, Secs(0.5));
    assert_eq!(w.reclaim_min_idle_secs, Secs(3.0));
    assert_eq!(w.reclaim_interval_secs, Secs(0.25));
    assert_eq!(w.max_attempts, 2);
    assert_eq!(w.drain_timeout_secs, Secs(15.0));
    assert_eq!(w.checkpoint_batch_max, 64);
    assert_eq!(w.checkpoint_writers, 4);
    assert_eq!(w.write_ahead_grace_ms, 0);
    assert_eq!(w.workspace_root, PathBuf::from("/ws"));
    assert_eq!(w.default_provider, "anthropic");
    assert_eq!(w.default_model.as_deref(), Some("claude-x"));
    assert_eq!(c.providers.script, Some(PathBuf::from("/s.json")));
    assert_eq!(w.allowed_hosts, vec!["localhost:8080", "10.0.0.1"]);
    assert!(w.shell_enabled);
    assert_eq!(c.providers.openai_base_url.as_deref(), Some("http://o/v1"));
    c.validate().unwrap();

    // A variable that is not a value of its setting is an error naming the variable.
    let e = Settings::load_with(None, env_of(&[("AGENTQ_WORKER_CONCURRENCY", "many")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("AGENTQ_WORKER_CONCURRENCY"), "{e}");
    let e = Settings::load_with(None, env_of(&[("AGENTQ_SHELL_ENABLED", "maybe")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("AGENTQ_SHELL_ENABLED"), "{e}");
    let off = Settings::load_with(None, env_of(&[("AGENTQ_SHELL_ENABLED", "false")])).unwrap();
    assert!(!off.worker.shell_enabled);
}

fn invalid_with(tweak: impl FnOnce(&mut Settings)) -> String {
    let mut s = Settings::default();
    tweak(&mut s);
    s.validate().unwrap_err().to_string()
}

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
    let e = invalid_with(|s| s.worker.reclaim_min_idle_secs = Secs(1.0));
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
            s.worker.default_provider = "gpt".into()
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
fn resolve_applies_flags_last_and_validates() {
    let env = env_of(&[("AGENTQ_WORKER_CONCURRENCY", "9")]);
    let s = Settings::resolve(None, &env, |s| s.worker.concurrency = 3).unwrap();
    assert_eq!(s.worker.concurrency, 3);
    let e = Settings::resolve(None, &env, |s| s.worker.heartbeat_secs = Secs(7.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--heartbeat-secs"), "{e}");
}

#[test]
fn secs_convert_and_compare_with_whole_seconds() {
    assert_eq!(Secs(0.5).duration(), Duration::from_millis(500));
    assert_eq!(Secs(-1.0).duration(), Duration::ZERO);
    assert_eq!(Secs(f64::INFINITY).duration(), Duration::MAX);
    assert!(31u64 > Secs(30.0));
    assert!(30u64 == Secs(30.0));
    assert_eq!(Secs(30.0).to_string(), "30");
    assert_eq!("0.25".parse::<Secs>().unwrap(), Secs(0.25));
}

#[test]
fn credential_names() {
    for n in [
        "api_key",
        "apiKey",
        "openai_api_key",
        "x-api-key",
        "client_secret",
        "password",
        "access_token",
        "Authorization",
        "token",
    ] {
        assert!(is_credential_name(n), "{n}");
    }
    for n in ["token_budget", "max_tokens", "prompt", "keywords", "monkey"] {
        assert!(!is_credential_name(n), "{n}");
    }
}

/// The dotted keys of every field of the settings (secrets are never serialised).
fn keys(v: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    let serde_json::Value::Object(map) = v else {
        return;
    };
    for (k, v) in map {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if v.is_object() {
            keys(v, &key, out);
        } else {
            out.insert(key);
        }
    }
}

const EXAMPLE: &str = include_str!("../../../agentq.example.toml");

/// `agentq.example.toml` at the repository root lists every setting (the ones whose
/// default is "unset" as a commented line), and what it sets is exactly the defaults.
#[test]
fn the_example_file_is_every_setting_at_its_default() {
    let example = Settings::from_toml(EXAMPLE).unwrap();
    assert_eq!(example, Settings::default());

    let mut fields = BTreeSet::new();
    keys(
        &serde_json::to_value(Settings::default()).unwrap(),
        "",
        &mut fields,
    );
    let registry: BTreeSet<String> = SETTINGS.iter().map(|s| s.key.to_string()).collect();
    assert_eq!(fields, registry, "SETTINGS must name every field");

    // Uncomment the `# key = value` lines: that file must still parse (no misspelt key)
    // and then hold every setting.
    let mut section = String::new();
    let mut listed = BTreeSet::new();
    let mut uncommented = String::new();
    for line in EXAMPLE.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            section = name.to_string();
            uncommented.push_str(line);
        } else if let Some((k, _)) = t.trim_start_matches("# ").split_once(" = ")
            && !k.contains(' ')
        {
            listed.insert(if section.is_empty() {
                k.to_string()
            } else {
                format!("{section}.{k}")
            });
            uncommented.push_str(t.trim_start_matches("# "));
        }
        uncommented.push('\n');
    }
    assert_eq!(
        listed, registry,
        "agentq.example.toml must list every setting"
    );
    let all = Settings::from_toml(&uncommented).unwrap();
    let mut set = BTreeSet::new();
    keys(&serde_json::to_value(&all).unwrap(), "", &mut set);
    assert_eq!(set, registry);
    all.validate().unwrap();
}

#[test]
fn load_only_reads_just_the_named_settings() {
    // A client command needs the API URL: a variable meant for a worker, even one it
    // could not parse, must not stop it.
    let env = env_of(&[
        ("AGENTQ_API_URL", "http://api.example:7700"),
        ("AGENTQ_WORKER_CONCURRENCY", "auto"),
        ("AGENTQ_REDIS_URL", "redis://r:6379"),
        ("OPENAI_API_KEY", "sk-canary"),
    ]);
    assert!(Settings::load_with(None, &env).is_err());
    let s = Settings::load_only(None, &env, &["api_url"]).unwrap();
    assert_eq!(s.api_url, "http://api.example:7700");
    assert_eq!(s.redis_url, None);
    assert_eq!(s.worker.concurrency, Settings::default().worker.concurrency);
    assert!(s.providers.openai_api_key.is_none());
    let s = Settings::load_only(None, &env, &["redis_url"]).unwrap();
    assert_eq!(s.redis_url.as_deref(), Some("redis://r:6379"));
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

#[test]
fn policy_validation_names_the_setting() {
    for (key, tweak) in [
        (
            "worker.default_tools",
            (|s: &mut Settings| s.worker.default_tools = Some(vec!["shell".into()]))
                as fn(&mut Settings),
        ),
        // The implicit default (the read-only set) must be allowed too.
        ("worker.default_tools", |s| {
            s.policy.tools = vec!["read_file".into()]
        }),
        ("worker.default_provider", |s| {
            s.policy.providers = vec!["openai".into()]
        }),
        ("worker.default_model", |s| {
            s.policy.models = vec!["gpt-*".into()];
            s.worker.default_model = Some("claude-x".into());
        }),
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
        ("policy.max_tree_sessions", |s| {
            s.policy.max_tree_sessions = Some(0)
        }),
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
    ] {
        let e = invalid_with(tweak);
        assert!(e.contains(&format!("`{key}")), "{key} not in {e}");
    }
}

#[test]
fn hooks_and_the_guardian_from_the_file() {
    let file = r#"
        [[hooks]]
        on = "pre_tool_use"
        url = "https://hooks.example/check"
        timeout_ms = 2000
        on_timeout = "allow"
        tools = ["write_*", "shell"]
        header = "Authorization"
        header_env = "HOOK_TOKEN"

        [[hooks]]
        on = "session_end"
        command = ["/usr/local/bin/notify", "--json"]

        [guardian]
        provider = "anthropic"
        prompt = "Deny deletions."
        tools = ["shell"]
    "#;
    let path = std::env::temp_dir().join(format!("agentq-hooks-{}.toml", std::process::id()));
    std::fs::write(&path, file).unwrap();
    let s = Settings::load_with(Some(&path), env_of(&[("HOOK_TOKEN", "Bearer t0k")])).unwrap();
    std::fs::remove_file(&path).unwrap();
    s.validate().unwrap();
    let [pre, end] = s.hooks.as_slice() else {
        panic!("{:?}", s.hooks)
    };
    assert_eq!(pre.on, HookPoint::PreToolUse);
    assert_eq!(pre.url.as_deref(), Some("https://hooks.example/check"));
    assert_eq!(pre.timeout_ms, 2000);
    assert_eq!(pre.timeout_behavior(), Behavior::Allow);
    // Unset: a pre_tool_use hook that fails blocks the call.
    assert_eq!(pre.error_behavior(), Behavior::Deny);
    assert_eq!(
        pre.header_value.as_ref().map(Secret::expose),
        Some("Bearer t0k")
    );
    // The secret never serialises, never prints.
    assert!(!serde_json::to_string(&s).unwrap().contains("t0k"));
    assert!(!format!("{s:?}").contains("t0k"));
    assert_eq!(end.on, HookPoint::SessionEnd);
    assert_eq!(end.timeout_ms, DEFAULT_HOOK_TIMEOUT_MS);
    assert_eq!(end.command.as_ref().unwrap()[0], "/usr/local/bin/notify");
    assert_eq!(s.guardian.provider.as_deref(), Some("anthropic"));
    assert_eq!(s.guardian.on_error, Behavior::Deny);
    // Unset: a call the guardian cannot see whole is denied unasked.
    assert_eq!(s.guardian.on_truncated, OnTruncated::Deny);
    assert_eq!(s.guardian.timeout_ms, DEFAULT_GUARDIAN_TIMEOUT_MS);
    let review =
        Settings::from_toml("[guardian]\nprovider = \"openai\"\non_truncated = \"review\"\n")
            .unwrap();
    review.validate().unwrap();
    assert_eq!(review.guardian.on_truncated, OnTruncated::Review);

    // Only the full environment layer reads header secrets.
    let path = std::env::temp_dir().join(format!("agentq-hooks-o-{}.toml", std::process::id()));
    std::fs::write(&path, file).unwrap();
    let only =
        Settings::load_only(Some(&path), env_of(&[("HOOK_TOKEN", "x")]), &["api_url"]).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(only.hooks[0].header_value.is_none());
}

#[test]
fn hook_and_guardian_rules_name_the_field() {
    let parse_err = |text: &str| Settings::from_toml(text).unwrap_err().to_string();
    let e = parse_err("[[hooks]]\non = \"pre_tool\"\nurl = \"http://h/\"\n");
    assert!(e.contains("pre_tool"), "{e}");
    let e = parse_err("[[hooks]]\non = \"pre_tool_use\"\nurl = \"http://h/\"\nheaders = {}\n");
    assert!(e.contains("headers"), "{e}");
    let e =
        parse_err("[[hooks]]\non = \"pre_tool_use\"\nurl = \"http://h/\"\non_error = \"maybe\"\n");
    assert!(e.contains("maybe"), "{e}");
    let e = parse_err("[guardian]\nprovider = \"openai\"\non_truncated = \"cut\"\n");
    assert!(e.contains("cut") && e.contains("on_truncated"), "{e}");

    let invalid = |text: &str| {
        Settings::from_toml(text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    };
    let hook = |body: &str| format!("[[hooks]]\non = \"pre_tool_use\"\n{body}\n");
    for (body, field) in [
        ("", "`hooks[0]`"),
        ("url = \"http://h/\"\ncommand = [\"x\"]", "`hooks[0].url`"),
        ("url = \"ftp://h/\"", "`hooks[0].url`"),
        ("url = \"http:///path\"", "`hooks[0].url`"),
        ("url = \"https://user:pw@h/\"", "`hooks[0].url`"),
        ("command = []", "`hooks[0].command`"),
        ("command = [\" \"]", "`hooks[0].command`"),
        (
            "url = \"http://h/\"\ntimeout_ms = 0",
            "`hooks[0].timeout_ms`",
        ),
        (
            "url = \"http://h/\"\ntimeout_ms = 60001",
            "`hooks[0].timeout_ms`",
        ),
        ("url = \"http://h/\"\ntools = []", "`hooks[0].tools`"),
        (
            "url = \"http://h/\"\nheader = \"X-Token\"",
            "`hooks[0].header_env`",
        ),
        (
            "url = \"http://h/\"\nheader_env = \"TOKEN\"",
            "`hooks[0].header`",
        ),
        (
            "url = \"http://h/\"\nheader = \"Bad Header\"\nheader_env = \"T\"",
            "`hooks[0].header`",
        ),
        (
            "url = \"http://h/\"\nheader = \"X-T\"\nheader_env = \"NOT-A-VAR\"",
            "`hooks[0].header_env`",
        ),
        (
            "command = [\"x\"]\nheader = \"X-T\"\nheader_env = \"T\"",
            "`hooks[0].header`",
        ),
    ] {
        let e = invalid(&hook(body));
        assert!(e.contains(field), "{body:?}: {field} not in {e}");
    }
    // Observing points do not decide.
    let e =
        invalid("[[hooks]]\non = \"post_tool_use\"\nurl = \"http://h/\"\non_error = \"allow\"\n");
    assert!(e.contains("`hooks[0].on_error`"), "{e}");
    let e = invalid("[[hooks]]\non = \"session_start\"\nurl = \"http://h/\"\ntools = [\"x\"]\n");
    assert!(e.contains("`hooks[0].tools`"), "{e}");
    // The second hook is named as the second.
    let e = invalid(
        "[[hooks]]\non = \"pre_tool_use\"\nurl = \"http://h/\"\n\n[[hooks]]\non = \"session_end\"\nurl = \"nope\"\n",
    );
    assert!(e.contains("`hooks[1].url`"), "{e}");

    for (body, field) in [
        ("provider = \"gpt\"", "`guardian.provider`"),
        ("provider = \"openai\"\nmodel = \" \"", "`guardian.model`"),
        ("provider = \"openai\"\nprompt = \"\"", "`guardian.prompt`"),
        (
            "provider = \"openai\"\ntimeout_ms = 0",
            "`guardian.timeout_ms`",
        ),
        (
            "provider = \"openai\"\ntimeout_ms = 300001",
            "`guardian.timeout_ms`",
        ),
        ("provider = \"openai\"\ntools = []", "`guardian.tools`"),
    ] {
        let e = invalid(&format!("[guardian]\n{body}\n"));
        assert!(e.contains(field), "{body:?}: {field} not in {e}");
    }
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

/// A tenant's table names the variables holding its keys; the keys are read from the
/// environment into secrets, and the tenant's settings hold only its own keys (with the
/// shared endpoints where it names none).
#[test]
fn tenant_keys_come_from_the_variables_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentq.toml");
    std::fs::write(
        &path,
        "[providers]\nanthropic_base_url = \"http://shared-anthropic\"\n\
         [providers.tenants.acme]\nopenai_base_url = \"http://acme-llm/v1\"\n\
         openai_key_env = \"ACME_OPENAI\"\n",
    )
    .unwrap();
    let s = Settings::load_with(
        Some(&path),
        env_of(&[
            ("ACME_OPENAI", "sk-acme"),
            ("OPENAI_API_KEY", "sk-shared"),
            ("ANTHROPIC_API_KEY", "sk-ant-shared"),
        ]),
    )
    .unwrap();
    s.validate().unwrap();
    let acme = &s.providers.tenants["acme"];
    assert_eq!(
        acme.openai_api_key.as_ref().map(Secret::expose),
        Some("sk-acme")
    );
    assert!(acme.missing_keys().is_empty());
    assert!(!format!("{s:?}").contains("sk-acme"));
    assert!(!serde_json::to_string(&s).unwrap().contains("sk-acme"));
    let own = &s.tenant_provider_settings()["acme"];
    assert_eq!(own.openai_api_key.as_deref(), Some("sk-acme"));
    assert_eq!(own.openai_base_url.as_deref(), Some("http://acme-llm/v1"));
    assert_eq!(own.anthropic_api_key, None);
    assert_eq!(
        own.anthropic_base_url.as_deref(),
        Some("http://shared-anthropic")
    );

    // A variable named but unset is reported, for the worker to refuse to start.
    let s = Settings::load_with(Some(&path), no_env).unwrap();
    assert_eq!(
        s.providers.tenants["acme"].missing_keys(),
        vec![("openai_key_env", "ACME_OPENAI")]
    );
    // The table holds variable names, never keys.
    let e = Settings::from_toml("[providers.tenants.acme]\nopenai_api_key = \"sk\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("providers.tenants.acme.openai_api_key"), "{e}");
}

fn budget(tokens: Option<u64>, usd: Option<f64>) -> super::BudgetSettings {
    super::BudgetSettings {
        tenant: "acme".into(),
        period: crate::budget::Period::Day,
        tokens,
        usd,
        on_budget: crate::budget::OnBudget::Park,
    }
}

#[test]
fn prices_and_budgets_from_the_file() {
    let file = r#"
        [[prices]]
        model = "gpt-4o-mini*"
        input = 0.15
        output = 0.60
        cache_read = 0.075

        [[budgets]]
        tenant = "acme"
        period = "month"
        usd = 20.0
        on_budget = "park"

        [policy]
        max_tree_sessions = 50
    "#;
    let s: Settings = toml::from_str(file).unwrap();
    s.validate().unwrap();
    assert_eq!(s.prices[0].cache_write, 0.0);
    assert_eq!(s.policy.max_tree_sessions, Some(50));
    let b = s.budgets[0].budget();
    assert_eq!(b.usd_nanos, Some(20_000_000_000));
    assert_eq!(b.tokens, None);
    assert_eq!(b.on_budget, crate::budget::OnBudget::Park);
    // on_budget defaults to fail; an unknown period or field is refused.
    let s: Settings =
        toml::from_str("[[budgets]]\ntenant = \"a\"\nperiod = \"day\"\ntokens = 5\n").unwrap();
    assert_eq!(s.budgets[0].on_budget, crate::budget::OnBudget::Fail);
    assert!(
        toml::from_str::<Settings>("[[budgets]]\ntenant = \"a\"\nperiod = \"week\"\ntokens = 5\n")
            .is_err()
    );
    assert!(toml::from_str::<Settings>("[[prices]]\nmodel = \"a\"\nprice = 5\n").is_err());
}

#[test]
fn limit_rules_parse_and_name_the_field() {
    let s = Settings::from_toml(
        "[[limits]]\nprovider = \"openai\"\nmodel = \"gpt-4o*\"\nrpm = 500\ntpm = 200000\n\
         [[limits]]\nprovider = \"anthropic\"\ntenant = \"acme\"\nconcurrency = 4\n",
    )
    .unwrap();
    s.validate().unwrap();
    assert_eq!(s.limits.len(), 2);
    assert_eq!(s.limits[0].rpm, Some(500));
    assert_eq!(s.limits[0].window_secs, 60);
    assert_eq!(s.limits[1].model, "*");
    assert_eq!(s.limits[1].tenant.as_deref(), Some("acme"));
    assert_eq!(s.limits[1].reservation_ttl_secs, 300);
    let e = Settings::from_toml("[[limits]]\nprovider = \"openai\"\nrmp = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("rmp"), "{e}");
    let invalid = |body: &str| {
        Settings::from_toml(&format!("[[limits]]\n{body}\n"))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    };
    for (body, field) in [
        ("provider = \"openai\"", "`limits[0].rpm`"),
        ("provider = \"azure\"\nrpm = 1", "`limits[0].provider`"),
        (
            "provider = \"openai\"\nmodel = \"gpt-[\"\nrpm = 1",
            "`limits[0].model`",
        ),
        (
            "provider = \"openai\"\ntenant = \" \"\nrpm = 1",
            "`limits[0].tenant`",
        ),
        ("provider = \"openai\"\nrpm = 0", "`limits[0].rpm`"),
        ("provider = \"openai\"\ntpm = 0", "`limits[0].tpm`"),
        (
            "provider = \"openai\"\nconcurrency = 0",
            "`limits[0].concurrency`",
        ),
        (
            "provider = \"openai\"\nrpm = 1\nwindow_secs = 61",
            "`limits[0].window_secs`",
        ),
        (
            "provider = \"openai\"\nrpm = 1\nreservation_ttl_secs = 0",
            "`limits[0].reservation_ttl_secs`",
        ),
    ] {
        let e = invalid(body);
        assert!(e.contains(field), "{body}: {e}");
    }
}

#[test]
fn s3_blob_store_settings() {
    let base = "[workspace]\nblob_store = \"s3\"\n[workspace.s3]\n";
    let ok = format!(
        "{base}bucket = \"agentq-ws\"\nendpoint = \"http://127.0.0.1:9000\"\n\
         access_key_env = \"MY_KEY\"\nsecret_key_env = \"MY_SECRET\"\n"
    );
    let s = Settings::from_toml(&ok).unwrap();
    s.validate().unwrap();
    assert_eq!(s.workspace.blob_store, BlobStoreKind::S3);
    assert_eq!(s.workspace.s3.secret_key_env, "MY_SECRET");
    assert_eq!(
        Settings::default().workspace.s3.access_key_env,
        "AWS_ACCESS_KEY_ID"
    );
    for (text, key) in [
        (
            format!("{base}bucket = \"Bad/Name\"\nendpoint = \"http://h\"\n"),
            "workspace.s3.bucket",
        ),
        (
            format!("{base}bucket = \"ok-name\"\nendpoint = \"ftp://h\"\n"),
            "workspace.s3.endpoint",
        ),
        (
            format!("{base}bucket = \"ok-name\"\nendpoint = \"http://h\"\nprefix = \"/abs\"\n"),
            "workspace.s3.prefix",
        ),
        (
            format!("{base}bucket = \"ok-name\"\nendpoint = \"http://h\"\nregion = \"a b\"\n"),
            "workspace.s3.region",
        ),
    ] {
        let e = Settings::from_toml(&text).unwrap().validate().unwrap_err();
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    // A secret typed where the variable's name belongs is refused, and not echoed.
    let e = Settings::from_toml(&format!(
        "{base}bucket = \"ok-name\"\nendpoint = \"http://h\"\nsecret_key_env = \"wJalr/K7MDENG\"\n"
    ))
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("workspace.s3.secret_key_env"), "{msg}");
    assert!(!msg.contains("wJalr"), "{msg}");
    // Without `blob_store = "s3"` the section is not checked.
    Settings::from_toml("[workspace.s3]\nbucket = \"x\"\n")
        .unwrap()
        .validate()
        .unwrap();
}
