//! The worker's runtime configuration: what a [`crate::Worker`] runs with, built from the
//! process's settings tree ([`agentq_core::config::Settings`]) — whose defaults and rules
//! are the only ones — plus what only a program embedding the worker can give (its own
//! tools, a consumer name).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentq_agent::provider::factory::ProviderSettings;
use agentq_agent::tools::ToolSettings;
use agentq_agent::tools::skills::{LoadSkill, SkillLibrary};
use agentq_core::config::Settings;
use agentq_core::hooks::OperatorGuards;
use agentq_core::policy::Policy;

use crate::error::Result;

/// Everything a worker process is configured with.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Consumer name in the group; unique per process.
    pub consumer: String,
    pub queues: Vec<String>,
    /// Sessions run at once.
    pub concurrency: usize,
    pub lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    /// Entries idle this long belong to a dead worker. A few heartbeats.
    pub reclaim_min_idle: Duration,
    pub reclaim_interval: Duration,
    /// Claims without finishing before the entry is dead-lettered.
    pub max_attempts: u32,
    /// How long running sessions get to reach a checkpoint on shutdown.
    pub drain_timeout: Duration,
    /// How long one XREADGROUP blocks.
    pub read_block: Duration,
    /// Per-tree workspaces live under here.
    pub workspace_root: PathBuf,
    /// Provider of sessions that name none (see
    /// [`Settings::default_provider`]); `None`: no model is configured, and such sessions
    /// fail saying how to configure one ([`agentq_core::config::NO_MODEL`]).
    pub default_provider: Option<String>,
    pub default_model: Option<String>,
    /// Tools a session gets when it names none.
    pub default_tools: Vec<String>,
    /// The provider endpoints and keys sessions use, unless their tenant has its own.
    pub providers: ProviderSettings,
    /// Tenants with provider settings of their own (`[providers.tenants.<name>]`): their
    /// sessions use these, never the shared keys.
    pub tenant_providers: BTreeMap<String, ProviderSettings>,
    pub tool_settings: ToolSettings,
    pub sensitive_tools: Vec<String>,
    /// How long a finished session's event stream is kept.
    pub event_ttl: Duration,
    /// Deepest sub-agent nesting (a root session is depth 0).
    pub max_depth: u32,
    /// Most sub-agents one session may start.
    pub max_children: usize,
    /// Longest prompt a sub-agent may be given, in bytes: the scheduler's bound on a
    /// request's prompt (`scheduler.max_prompt_bytes`), so a model cannot store through
    /// `spawn_agent` what a caller could not submit.
    pub max_prompt_bytes: usize,
    /// Group commit: most checkpoints in one commit.
    pub checkpoint_batch_max: usize,
    /// Group commit: commits in flight at once, each on its own store connection.
    pub checkpoint_writers: usize,
    /// See [`agentq_agent::driver::Agent::write_ahead_grace`].
    pub write_ahead_grace: Duration,
    /// See [`agentq_agent::driver::Agent::max_llm_retries`].
    pub max_llm_retries: u32,
    /// See [`agentq_agent::driver::Agent::suspend_after`].
    pub rate_limit_suspend_after: Duration,
    /// The fleet's rate limiter (connected by the host; disabled by default).
    pub limiter: Arc<agentq_core::admission::Limiter>,
    /// The embedding program's own tools, offered beside the built-in ones: a session
    /// names them in its `tools` like any other, and one with a built-in's name replaces
    /// the built-in. Declare each one's [`agentq_agent::tools::SideEffect`] truthfully:
    /// resumes and the write-ahead rule depend on it.
    pub tools: agentq_agent::tools::ToolRegistry,
    /// The MCP servers this worker starts (`[mcp]`): sessions call their tools as
    /// `mcp__<server>__<tool>`.
    pub mcp_servers: Vec<agentq_core::config::McpServerSettings>,
    /// The operator's policy (`[policy]`): every session is admitted under its tenant's
    /// rules before it runs, and its sub-agents too.
    pub policy: Arc<Policy>,
    /// The operator's hooks and guardian, built once and shared by every session.
    pub operator: OperatorGuards,
    /// Prices per model (`[[prices]]`): the cost of each call, for tenant spend.
    pub prices: Arc<agentq_core::budget::Prices>,
    /// Tenant budgets as configured (`[[budgets]]`); a budget stored through the admin
    /// API replaces a tenant's configured ones.
    pub budgets: Vec<agentq_core::budget::TenantBudget>,
}

impl WorkerSettings {
    /// The configuration of a worker process: `settings` validated (every command calls
    /// this, so every one refuses what [`Settings::validate`] refuses), the scripted
    /// provider's script read, and a consumer name unique to this process.
    pub fn from_settings(settings: &Settings) -> Result<WorkerSettings> {
        settings.validate()?;
        // Only a worker needs the keys: the scheduler reads the same file without them.
        for (name, t) in &settings.providers.tenants {
            if let Some((field, var)) = t.missing_keys().first() {
                return Err(crate::error::Error::Config(format!(
                    "`providers.tenants.{name}.{field}`: the environment variable {var} is \
                     unset or empty"
                )));
            }
        }
        let mut cfg = Self::build(settings);
        cfg.policy = Arc::new(Policy::from_section(&settings.policy)?);
        cfg.providers.script = settings.providers.read_script()?;
        cfg.operator = OperatorGuards::from_settings(settings, agentq_core::metrics::global())?;
        for own in cfg.tenant_providers.values_mut() {
            own.script.clone_from(&cfg.providers.script);
        }
        if !settings.worker.skills_dirs.is_empty() {
            let library = SkillLibrary::load(&settings.worker.skills_dirs)
                .map_err(|e| crate::error::Error::Config(format!("`worker.skills_dirs`: {e}")))?;
            cfg.tools
                .register(Arc::new(LoadSkill::new(Arc::new(library))));
        }
        cfg.consumer = default_consumer_name();
        Ok(cfg)
    }

    /// The settings as they are, without validating them or reading any file.
    fn build(settings: &Settings) -> WorkerSettings {
        let w = &settings.worker;
        WorkerSettings {
            consumer: unique_name("worker"),
            queues: w.queues.clone(),
            concurrency: w.concurrency,
            lease_ttl: w.lease_ttl_secs.duration(),
            heartbeat_interval: w.heartbeat_secs.duration(),
            reclaim_min_idle: w.reclaim_min_idle_secs.duration(),
            reclaim_interval: w.reclaim_interval_secs.duration(),
            max_attempts: w.max_attempts,
            drain_timeout: w.drain_timeout_secs.duration(),
            read_block: Duration::from_millis(w.read_block_ms),
            workspace_root: w.workspace_root.clone(),
            default_provider: settings.default_provider().map(str::to_string),
            default_model: w.default_model.clone(),
            default_tools: match &w.default_tools {
                Some(tools) => tools.clone(),
                None => agentq_agent::tools::READ_ONLY_TOOLS
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            },
            providers: settings.provider_settings(),
            tenant_providers: settings.tenant_provider_settings(),
            tool_settings: ToolSettings {
                shell_enabled: w.shell_enabled,
                allow_private_network: w.allow_private_network,
                allowed_hosts: w.allowed_hosts.clone(),
                max_file_bytes: w.max_file_bytes,
                workspace_quota_bytes: w.workspace_quota_bytes,
                ..ToolSettings::default()
            },
            sensitive_tools: w.sensitive_tools.clone(),
            event_ttl: w.event_ttl_secs.duration(),
            max_depth: w.max_depth,
            max_children: w.max_children,
            max_prompt_bytes: settings.scheduler.max_prompt_bytes,
            checkpoint_batch_max: w.checkpoint_batch_max,
            checkpoint_writers: w.checkpoint_writers,
            write_ahead_grace: Duration::from_millis(w.write_ahead_grace_ms),
            max_llm_retries: w.max_llm_retries,
            rate_limit_suspend_after: w.rate_limit_suspend_secs.duration(),
            limiter: agentq_core::admission::Limiter::disabled(),
            tools: agentq_agent::tools::ToolRegistry::new(),
            mcp_servers: settings.mcp.servers.clone(),
            // Unvalidated settings whose policy does not compile allow nothing.
            policy: Arc::new(
                Policy::from_section(&settings.policy).unwrap_or_else(|_| Policy::deny_all()),
            ),
            operator: OperatorGuards::default(),
            // Unvalidated prices that do not compile price nothing.
            prices: Arc::new(
                agentq_core::budget::Prices::new(&settings.prices).unwrap_or_default(),
            ),
            budgets: settings.budgets.iter().map(|b| b.budget()).collect(),
        }
    }

    /// The tenants the metrics label by name (every other tenant is `other`): those the
    /// configuration names (policy, provider settings, budgets).
    pub fn labelled_tenants(&self) -> Vec<String> {
        let mut t: Vec<String> = self.budgets.iter().map(|b| b.tenant.clone()).collect();
        t.extend(self.tenant_providers.keys().cloned());
        t.extend(self.policy.tenant_names());
        t
    }

    /// The models the metrics label by name (every other model is `other`): the default
    /// model (configured, or the default provider's own), each provider's own default, the
    /// guardian's, and the models the policy names literally. A session names its model, so taking the
    /// label from it would let callers add series at will.
    pub fn labelled_models(&self) -> Vec<String> {
        let mut models = self.policy.named_models();
        models.extend(self.default_model().map(str::to_string));
        models.extend(
            agentq_core::config::PROVIDERS
                .iter()
                .map(|p| agentq_agent::provider::factory::default_model(p).to_string()),
        );
        models.extend(self.operator.guardian_model.clone());
        models
    }

    /// The model of sessions that name none: the configured one, else the default
    /// provider's own; `None` when no provider is configured.
    pub fn default_model(&self) -> Option<&str> {
        match (&self.default_model, &self.default_provider) {
            (Some(m), _) => Some(m),
            (None, Some(p)) => Some(agentq_agent::provider::factory::default_model(p)),
            (None, None) => None,
        }
    }

    /// Store connections for everything but checkpoints and heartbeats: a quarter of the
    /// sessions run at once (claims, reads and inbox writes are short), 4 to 64.
    pub fn pool_connections(&self) -> u32 {
        pool_connections(self.concurrency)
    }

    /// Store connections the worker's checkpoints and heartbeats need to themselves: the
    /// group commit's commits in flight, and one for the heartbeat.
    pub fn writer_connections(&self) -> u32 {
        u32::try_from(self.checkpoint_writers.max(1))
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }
}

/// The settings' defaults, with no provider key and no script: this never reads the
/// environment (use [`WorkerSettings::from_settings`] on loaded settings for that).
impl Default for WorkerSettings {
    fn default() -> Self {
        Self::build(&Settings::default())
    }
}

/// [`WorkerSettings::pool_connections`] for a worker running `concurrency` sessions at once.
pub fn pool_connections(concurrency: usize) -> u32 {
    u32::try_from(concurrency / 4)
        .unwrap_or(u32::MAX)
        .clamp(4, 64)
}

/// `host-pid-random`: distinct for every process, so a restarted worker never inherits
/// the pending entries of its previous life (the reclaimer hands those out).
pub fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    unique_name(&host)
}

/// `prefix-pid-random`.
fn unique_name(prefix: &str) -> String {
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}-{}", std::process::id(), &rand[..8])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use agentq_core::config::Secs;

    #[test]
    fn defaults_are_the_settings_defaults() {
        let c = WorkerSettings::default();
        assert_eq!(c.concurrency, 256);
        assert_eq!(c.queues, vec!["default"]);
        assert_eq!(c.lease_ttl, Duration::from_millis(1500));
        assert_eq!(c.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(c.reclaim_min_idle, Duration::from_secs(6));
        assert_eq!(c.reclaim_interval, Duration::from_millis(500));
        assert_eq!(c.max_attempts, 5);
        assert_eq!(c.drain_timeout, Duration::from_secs(30));
        assert_eq!(c.read_block, Duration::from_secs(2));
        // No fake model unless asked for.
        assert_eq!(c.default_provider, None);
        assert_eq!(c.default_tools, agentq_agent::tools::READ_ONLY_TOOLS);
        assert_eq!(c.event_ttl, Duration::from_secs(24 * 3600));
        assert_eq!(c.max_depth, 3);
        assert_eq!(c.max_children, 16);
        assert_eq!(c.checkpoint_batch_max, 256);
        assert_eq!(c.checkpoint_writers, 2);
        assert_eq!(
            c.write_ahead_grace,
            agentq_agent::driver::DEFAULT_WRITE_AHEAD_GRACE
        );
        assert_eq!(
            c.max_llm_retries,
            agentq_agent::spec::DEFAULT_MAX_LLM_RETRIES
        );
        assert_eq!(
            c.rate_limit_suspend_after,
            agentq_agent::driver::DEFAULT_SUSPEND_AFTER
        );
        // Nothing from the environment.
        assert_eq!(c.providers.openai_api_key, None);
        assert_eq!(c.providers.anthropic_api_key, None);
        assert!(!c.tool_settings.shell_enabled);
    }

    #[test]
    fn from_settings_validates_and_carries_every_setting() {
        let mut s = Settings::default();
        s.worker.heartbeat_secs = Secs(0.5);
        s.worker.lease_ttl_secs = Secs(2.0);
        s.worker.default_tools = Some(vec!["grep".into()]);
        s.worker.shell_enabled = true;
        s.worker.allowed_hosts = vec!["localhost".into()];
        s.worker.default_provider = Some("openai".into());
        s.providers.openai_base_url = Some("http://llm/v1".into());
        let c = WorkerSettings::from_settings(&s).unwrap();
        assert_eq!(c.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(c.lease_ttl, Duration::from_secs(2));
        assert_eq!(c.default_tools, vec!["grep"]);
        assert!(c.tool_settings.shell_enabled);
        assert_eq!(c.tool_settings.allowed_hosts, vec!["localhost"]);
        assert_eq!(c.default_provider.as_deref(), Some("openai"));
        assert_eq!(
            c.providers.openai_base_url.as_deref(),
            Some("http://llm/v1")
        );

        s.worker.heartbeat_secs = Secs(2.0);
        let e = WorkerSettings::from_settings(&s).unwrap_err().to_string();
        assert!(e.contains("worker.heartbeat_secs"), "{e}");

        let mut s = Settings::default();
        s.providers.script = Some("/nonexistent/script.json".into());
        let e = WorkerSettings::from_settings(&s).unwrap_err().to_string();
        assert!(
            e.contains("AGENTQ_SCRIPT") && e.contains("/nonexistent/script.json"),
            "{e}"
        );
    }

    /// A tenant's keys are this worker's only if their variables are set: a worker that
    /// would run the tenant's sessions keyless (or with someone else's key) refuses to
    /// start, naming the setting; the scheduler, which reads the same file, needs no keys.
    #[test]
    fn a_tenant_key_variable_that_is_unset_stops_the_worker() {
        let mut s = Settings::default();
        s.providers.tenants.insert(
            "acme".into(),
            agentq_core::config::TenantProviders {
                anthropic_key_env: Some("ACME_ANTHROPIC".into()),
                ..Default::default()
            },
        );
        s.validate().unwrap();
        let e = WorkerSettings::from_settings(&s).unwrap_err().to_string();
        assert!(
            e.contains("providers.tenants.acme.anthropic_key_env") && e.contains("ACME_ANTHROPIC"),
            "{e}"
        );
        if let Some(t) = s.providers.tenants.get_mut("acme") {
            t.anthropic_api_key = Some(agentq_core::config::Secret::new("sk-acme"));
        }
        let c = WorkerSettings::from_settings(&s).unwrap();
        assert_eq!(
            c.tenant_providers["acme"].anthropic_api_key.as_deref(),
            Some("sk-acme")
        );
        assert_eq!(c.tenant_providers["acme"].openai_api_key, None);
    }
}
