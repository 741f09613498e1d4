//! Loading: defaults, the file, the environment layer, flags, and the secrets.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{env_of, no_env};
use crate::config::*;

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
    assert_eq!(c.worker.lease_ttl_secs, Secs(1.5));
    assert_eq!(c.worker.heartbeat_secs, Secs(0.5));
    assert_eq!(c.worker.reclaim_min_idle_secs, Secs(6.0));
    assert_eq!(c.worker.reclaim_interval_secs, Secs(0.5));
    assert_eq!(c.worker.max_attempts, 5);
    assert_eq!(c.worker.drain_timeout_secs, Secs(30.0));
    assert_eq!(c.worker.read_block_ms, 2000);
    assert_eq!(
        c.worker.workspace_root,
        PathBuf::from("./agentq-workspaces")
    );
    assert_eq!(c.worker.default_provider, None);
    // No fake model unless asked for: nothing configures one here.
    assert_eq!(c.default_provider(), None);
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
    assert_eq!(c.worker.default_provider.as_deref(), Some("openai"));
    assert_eq!(c.worker.default_model.as_deref(), Some("gpt-4o"));
    assert_eq!(c.worker.default_tools, Some(vec!["read_file".to_string()]));
    assert!(c.worker.shell_enabled);
    assert_eq!(c.worker.heartbeat_secs, Secs(0.5));
    assert_eq!(c.worker.lease_ttl_secs, Secs(1.5));
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
    assert_eq!(c.worker.default_provider.as_deref(), Some("openai"));
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
    assert_eq!(w.default_provider.as_deref(), Some("anthropic"));
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

/// The scripted model once answered for anyone who had not configured a real one: the
/// default is now what the environment configures, the script only when one is given,
/// else none.
#[test]
fn the_default_provider_is_the_one_configured() {
    let resolved = |pairs: &[(&str, &str)]| {
        let c = Settings::load_with(None, env_of(pairs)).unwrap();
        c.default_provider().map(str::to_string)
    };
    assert_eq!(resolved(&[]), None);
    assert_eq!(
        resolved(&[("OPENAI_API_KEY", "sk")]).as_deref(),
        Some("openai")
    );
    // A local OpenAI-compatible server needs no key.
    assert_eq!(
        resolved(&[("OPENAI_BASE_URL", "http://llm/v1")]).as_deref(),
        Some("openai")
    );
    assert_eq!(
        resolved(&[("ANTHROPIC_API_KEY", "sk-ant")]).as_deref(),
        Some("anthropic")
    );
    assert_eq!(
        resolved(&[("ANTHROPIC_API_KEY", "sk-ant"), ("OPENAI_API_KEY", "sk")]).as_deref(),
        Some("openai")
    );
    assert_eq!(
        resolved(&[("OPENAI_API_KEY", "sk"), ("AGENTQ_SCRIPT", "/s.json")]).as_deref(),
        Some("scripted")
    );
    assert_eq!(
        resolved(&[
            ("OPENAI_API_KEY", "sk"),
            ("AGENTQ_DEFAULT_PROVIDER", "anthropic")
        ])
        .as_deref(),
        Some("anthropic")
    );
}
