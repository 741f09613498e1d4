//! Configuration of every process: an optional `agentq.toml` overlaid by the environment.
//!
//! This module owns the file format (sections `[worker]`, `[scheduler]`, `[providers]`),
//! every default, and which environment variables override what:
//! `AGENTQ_DATABASE_URL`, `AGENTQ_REDIS_URL`, `AGENTQ_API_ADDR`, `AGENTQ_METRICS_ADDR`,
//! `AGENTQ_API_URL`, `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, and the provider keys
//! `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`. Keys are read only from the environment: a
//! config file is often committed or mounted from a ConfigMap, so one that names a key is
//! refused rather than silently used.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use agentq_agent::provider::factory::ProviderSettings;

use crate::error::{Error, Result};

/// The file looked for in the working directory when no path is given.
pub const DEFAULT_FILE: &str = "agentq.toml";
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7700";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:7700";

/// Everything a process may be configured with. Every field has a default, so an empty
/// file (or none) is a valid configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Postgres; `None` means the embedded store.
    pub database_url: Option<String>,
    /// Redis; `None` means the in-process queue.
    pub redis_url: Option<String>,
    /// Where the scheduler's HTTP API listens.
    pub api_addr: String,
    /// Where `/metrics` is served by processes without the HTTP API.
    pub metrics_addr: String,
    /// Where the CLI client commands find the HTTP API.
    pub api_url: String,
    pub worker: WorkerConfig,
    pub scheduler: SchedulerConfig,
    pub providers: ProvidersConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database_url: None,
            redis_url: None,
            api_addr: DEFAULT_API_ADDR.to_string(),
            metrics_addr: DEFAULT_METRICS_ADDR.to_string(),
            api_url: DEFAULT_API_URL.to_string(),
            worker: WorkerConfig::default(),
            scheduler: SchedulerConfig::default(),
            providers: ProvidersConfig::default(),
        }
    }
}

/// `[worker]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    /// Sessions run at once by one worker process.
    pub concurrency: usize,
    pub queues: Vec<String>,
    pub lease_ttl_secs: u64,
    pub heartbeat_secs: u64,
    /// Entries idle this long in another consumer's pending list are taken over.
    pub reclaim_min_idle_secs: u64,
    pub reclaim_interval_secs: u64,
    /// Deliveries of one entry before it is dead-lettered.
    pub max_attempts: u32,
    /// How long a SIGTERM'd worker lets running iterations reach a checkpoint.
    pub drain_timeout_secs: u64,
    pub workspace_root: PathBuf,
    /// Provider of sessions that name none.
    pub default_provider: String,
    pub default_model: Option<String>,
    /// Tools of sessions that name none; `None` means the agent's default set.
    pub default_tools: Option<Vec<String>>,
    pub shell_enabled: bool,
    /// Let http tools reach private and loopback addresses.
    pub allow_private_network: bool,
    pub allowed_hosts: Vec<String>,
    /// Tools that need approval in every session, on top of each session's own list.
    pub sensitive_tools: Vec<String>,
    /// Group commit: most checkpoints committed together.
    pub checkpoint_batch_max: usize,
    /// Group commit: commits in flight at once.
    pub checkpoint_writers: usize,
    /// How long the checkpoint of a response whose calls have no effect anywhere may wait
    /// to be committed together with their results; 0 commits every response first.
    pub write_ahead_grace_ms: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 256,
            queues: vec!["default".to_string()],
            lease_ttl_secs: 6,
            heartbeat_secs: 2,
            reclaim_min_idle_secs: 6,
            reclaim_interval_secs: 2,
            max_attempts: 5,
            drain_timeout_secs: 30,
            workspace_root: PathBuf::from("./agentq-workspaces"),
            default_provider: "scripted".to_string(),
            default_model: None,
            default_tools: None,
            shell_enabled: false,
            allow_private_network: false,
            allowed_hosts: Vec::new(),
            sensitive_tools: Vec::new(),
            checkpoint_batch_max: 256,
            checkpoint_writers: 2,
            write_ahead_grace_ms: agentq_agent::driver::DEFAULT_WRITE_AHEAD_GRACE.as_millis()
                as u64,
        }
    }
}

/// `[scheduler]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// How often the sweeper looks for queued sessions without a stream entry.
    pub sweep_interval_secs: u64,
    /// Only sessions older than this are swept (younger ones may be between the insert
    /// and the `XADD` of a live request).
    pub sweep_age_secs: u64,
    pub max_prompt_bytes: usize,
    /// Items of one `POST /v1/sessions/batch`.
    pub max_batch: usize,
    /// Queues whose consumer group is created at start.
    pub queues: Vec<String>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            sweep_interval_secs: 5,
            sweep_age_secs: 10,
            max_prompt_bytes: 1_000_000,
            max_batch: 10_000,
            queues: vec!["default".to_string()],
        }
    }
}

/// `[providers]`: endpoints from the file or the environment; keys from the environment
/// only (never serialised, never read from the file).
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProvidersConfig {
    pub openai_base_url: Option<String>,
    pub anthropic_base_url: Option<String>,
    #[serde(skip)]
    pub openai_api_key: Option<String>,
    #[serde(skip)]
    pub anthropic_api_key: Option<String>,
}

// Hand-written so a logged config never shows a key.
impl std::fmt::Debug for ProvidersConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redact = |k: &Option<String>| k.as_ref().map(|_| "<redacted>");
        f.debug_struct("ProvidersConfig")
            .field("openai_base_url", &self.openai_base_url)
            .field("anthropic_base_url", &self.anthropic_base_url)
            .field("openai_api_key", &redact(&self.openai_api_key))
            .field("anthropic_api_key", &redact(&self.anthropic_api_key))
            .finish()
    }
}

impl Config {
    /// Load `path` (an error if it does not exist), or `./agentq.toml` when present, then
    /// apply the environment.
    pub fn load(path: Option<&Path>) -> Result<Config> {
        Self::load_with(path, |k| std::env::var(k).ok())
    }

    /// [`Config::load`] with the environment given as a lookup function (tests cannot
    /// safely mutate the process environment).
    pub fn load_with(path: Option<&Path>, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut cfg = match path {
            Some(p) => Self::from_file(p)?,
            None => {
                let p = Path::new(DEFAULT_FILE);
                if p.is_file() {
                    Self::from_file(p)?
                } else {
                    Config::default()
                }
            }
        };
        cfg.apply_env(env);
        Ok(cfg)
    }

    /// Parse a TOML file (no environment applied).
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parse TOML text (no environment applied).
    pub fn from_toml(text: &str) -> Result<Config> {
        // Checked before parsing so the message says why, not just "unknown field".
        let raw: toml::Table =
            toml::from_str(text).map_err(|e| Error::Config(e.to_string().trim().to_string()))?;
        if let Some(field) = credential_key(&raw, "") {
            return Err(Error::Config(format!(
                "`{field}` is not allowed in the config file: provider keys are read only \
                 from the environment (OPENAI_API_KEY, ANTHROPIC_API_KEY)"
            )));
        }
        toml::from_str(text).map_err(|e| Error::Config(e.to_string().trim().to_string()))
    }

    fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) {
        // An empty variable counts as unset (a common result of `FOO= cmd` or templating).
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        if let Some(v) = var("AGENTQ_DATABASE_URL") {
            self.database_url = Some(v);
        }
        if let Some(v) = var("AGENTQ_REDIS_URL") {
            self.redis_url = Some(v);
        }
        if let Some(v) = var("AGENTQ_API_ADDR") {
            self.api_addr = v;
        }
        if let Some(v) = var("AGENTQ_METRICS_ADDR") {
            self.metrics_addr = v;
        }
        if let Some(v) = var("AGENTQ_API_URL") {
            self.api_url = v;
        }
        if let Some(v) = var("OPENAI_BASE_URL") {
            self.providers.openai_base_url = Some(v);
        }
        if let Some(v) = var("ANTHROPIC_BASE_URL") {
            self.providers.anthropic_base_url = Some(v);
        }
        self.providers.openai_api_key = var("OPENAI_API_KEY");
        self.providers.anthropic_api_key = var("ANTHROPIC_API_KEY");
    }

    /// What the agent's provider factory needs.
    pub fn provider_settings(&self) -> ProviderSettings {
        ProviderSettings {
            openai_base_url: self.providers.openai_base_url.clone(),
            openai_api_key: self.providers.openai_api_key.clone(),
            anthropic_base_url: self.providers.anthropic_base_url.clone(),
            anthropic_api_key: self.providers.anthropic_api_key.clone(),
            script: None,
        }
    }
}

/// The dotted name of the first key anywhere in `table` that looks like a credential.
fn credential_key(table: &toml::Table, prefix: &str) -> Option<String> {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if is_credential_name(k) {
            return Some(name);
        }
        if let toml::Value::Table(t) = v
            && let Some(found) = credential_key(t, &name)
        {
            return Some(found);
        }
    }
    None
}

/// Whether a field name looks like it holds a secret (`api_key`, `openai_api_key`,
/// `apiKey`, `secret`, `password`, `access_token`…). Shared with the HTTP API, which
/// refuses such fields in a session request.
pub fn is_credential_name(name: &str) -> bool {
    let n: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    n.contains("apikey")
        || n.contains("secret")
        || n.contains("password")
        || n.contains("accesstoken")
        || n.contains("authtoken")
        || n.contains("bearertoken")
        || n == "authorization"
        || n == "token"
        || n == "key"
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn defaults() {
        let c = Config::default();
        assert_eq!(c.api_addr, "127.0.0.1:7700");
        assert_eq!(c.metrics_addr, "127.0.0.1:9464");
        assert_eq!(c.api_url, "http://127.0.0.1:7700");
        assert_eq!(c.database_url, None);
        assert_eq!(c.redis_url, None);
        assert_eq!(c.worker.concurrency, 256);
        assert_eq!(c.worker.queues, vec!["default"]);
        assert_eq!(c.worker.lease_ttl_secs, 6);
        assert_eq!(c.worker.heartbeat_secs, 2);
        assert_eq!(c.worker.reclaim_min_idle_secs, 6);
        assert_eq!(c.worker.reclaim_interval_secs, 2);
        assert_eq!(c.worker.max_attempts, 5);
        assert_eq!(c.worker.drain_timeout_secs, 30);
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
        assert_eq!(c.worker.checkpoint_batch_max, 256);
        assert_eq!(c.worker.checkpoint_writers, 2);
        assert_eq!(c.worker.write_ahead_grace_ms, 250);
        assert_eq!(c.scheduler.sweep_interval_secs, 5);
        assert_eq!(c.scheduler.sweep_age_secs, 10);
        assert_eq!(c.scheduler.max_prompt_bytes, 1_000_000);
        assert_eq!(c.scheduler.max_batch, 10_000);
        assert_eq!(c.scheduler.queues, vec!["default"]);
        // An empty file is the defaults.
        assert_eq!(Config::from_toml("").unwrap(), c);
    }

    #[test]
    fn file_sections() {
        let c = Config::from_toml(
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
        assert_eq!(c.worker.lease_ttl_secs, 6);
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
        let e = Config::from_toml("[worker]\nconcurency = 3\n").unwrap_err();
        assert!(e.to_string().contains("concurency"), "{e}");
        let e = Config::from_toml("[worker]\nconcurrency = \"many\"\n").unwrap_err();
        assert!(e.to_string().contains("concurrency"), "{e}");
        let e = Config::from_toml("[providers]\nopenai_api_key = \"sk-1\"\n").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("providers.openai_api_key"), "{msg}");
        assert!(msg.contains("OPENAI_API_KEY"), "{msg}");
        assert!(!msg.contains("sk-1"), "{msg}");
        let e = Config::load_with(Some(Path::new("/nonexistent/agentq.toml")), no_env).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/agentq.toml"), "{e}");
    }

    #[test]
    fn load_file_then_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentq.toml");
        std::fs::write(
            &path,
            "redis_url = \"redis://file:6379\"\napi_addr = \"0.0.0.0:1\"\n\
             [providers]\nanthropic_base_url = \"http://file\"\n",
        )
        .unwrap();

        let c = Config::load_with(Some(&path), no_env).unwrap();
        assert_eq!(c.redis_url.as_deref(), Some("redis://file:6379"));
        assert_eq!(c.api_addr, "0.0.0.0:1");
        assert_eq!(c.providers.openai_api_key, None);

        let env: HashMap<&str, &str> = [
            ("AGENTQ_DATABASE_URL", "postgres://env/db"),
            ("AGENTQ_REDIS_URL", "redis://env:6379"),
            ("AGENTQ_API_ADDR", "127.0.0.1:9999"),
            ("AGENTQ_METRICS_ADDR", "127.0.0.1:9998"),
            ("AGENTQ_API_URL", "http://api:1"),
            ("ANTHROPIC_BASE_URL", "http://env"),
            ("OPENAI_API_KEY", "sk-env"),
            ("ANTHROPIC_API_KEY", ""),
        ]
        .into_iter()
        .collect();
        let c = Config::load_with(Some(&path), |k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(c.database_url.as_deref(), Some("postgres://env/db"));
        assert_eq!(c.redis_url.as_deref(), Some("redis://env:6379"));
        assert_eq!(c.api_addr, "127.0.0.1:9999");
        assert_eq!(c.metrics_addr, "127.0.0.1:9998");
        assert_eq!(c.api_url, "http://api:1");
        assert_eq!(
            c.providers.anthropic_base_url.as_deref(),
            Some("http://env")
        );
        assert_eq!(c.providers.openai_api_key.as_deref(), Some("sk-env"));
        // Empty means unset.
        assert_eq!(c.providers.anthropic_api_key, None);
        // Keys never show in Debug output and are never serialised.
        assert!(!format!("{c:?}").contains("sk-env"));
        assert!(!serde_json::to_string(&c).unwrap().contains("sk-env"));
        let s = c.provider_settings();
        assert_eq!(s.openai_api_key.as_deref(), Some("sk-env"));
        assert_eq!(s.anthropic_base_url.as_deref(), Some("http://env"));
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
}
