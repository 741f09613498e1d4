//! The settings of every agentq process, as one typed tree ([`Settings`]) built in one
//! order: defaults, then a TOML file (`agentq.toml`, or the path given with `--config`),
//! then the environment, then the command's flags; then [`Settings::validate`].
//!
//! This module owns the file format (the top level and the sections `[worker]`,
//! `[scheduler]`, `[providers]`, `[policy]`, `[[hooks]]`, `[guardian]`), every default
//! ([`Default`] of each section, and nowhere
//! else), the environment variables that override settings ([`SETTINGS`]), and every rule
//! a setting must follow. `Default` never reads the environment: reading it is the
//! explicit [`Settings::load_with`] step, with the lookup given as a function so tests can
//! inject one.
//!
//! Provider keys (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) are read only from the
//! environment, into [`Secret`]s that never print and never serialise: a config file is
//! often committed or mounted from a ConfigMap, so one that names a key is refused rather
//! than silently used.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use agentq_agent::guard::{Behavior, HookPoint, OnTruncated};
use agentq_agent::provider::factory::ProviderSettings;

use crate::error::{Error, Result};

/// The file looked for in the working directory when no path is given.
pub const DEFAULT_FILE: &str = "agentq.toml";
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7700";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:7700";
pub const DEFAULT_SQLITE_PATH: &str = "./agentq.db";

/// The providers a session (or `default_provider`) may name.
pub const PROVIDERS: &[&str] = &["openai", "anthropic", "scripted"];

/// The former name of [`Settings`].
pub type Config = Settings;
/// The former name of [`SchedulerSection`].
pub type SchedulerConfig = SchedulerSection;
/// The former name of [`ProvidersSection`].
pub type ProvidersConfig = ProvidersSection;

/// Everything a process may be configured with. Every field has a default, so an empty
/// file (or none) is a valid configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Postgres; `None` means the embedded store.
    pub database_url: Option<String>,
    /// Redis; `None` means the in-process queue.
    pub redis_url: Option<String>,
    /// The embedded store's SQLite file (`agentq dev` without Postgres and Redis).
    pub sqlite_path: PathBuf,
    /// Where the scheduler's HTTP API listens.
    pub api_addr: String,
    /// Where `/metrics` is served by processes without the HTTP API.
    pub metrics_addr: String,
    /// Where the CLI client commands find the HTTP API.
    pub api_url: String,
    /// The operator's hooks (`[[hooks]]`), each at one point, run by workers and
    /// `agentq run` in the order given.
    pub hooks: Vec<HookSettings>,
    /// The fleet's rate limits (`[[limits]]`), per provider endpoint and key.
    pub limits: Vec<LimitSettings>,
    pub worker: WorkerSection,
    pub scheduler: SchedulerSection,
    pub scheduling: SchedulingSection,
    pub providers: ProvidersSection,
    pub policy: PolicySection,
    pub guardian: GuardianSection,
    /// `[[prices]]`: dollars per million tokens per model (glob; the first match wins).
    pub prices: Vec<crate::budget::PriceEntry>,
    /// `[[budgets]]`: tenant budgets per day or month (the admin API may override them).
    pub budgets: Vec<BudgetSettings>,
    pub workspace: WorkspaceSection,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            database_url: None,
            redis_url: None,
            sqlite_path: PathBuf::from(DEFAULT_SQLITE_PATH),
            api_addr: DEFAULT_API_ADDR.to_string(),
            metrics_addr: DEFAULT_METRICS_ADDR.to_string(),
            api_url: DEFAULT_API_URL.to_string(),
            hooks: Vec::new(),
            limits: Vec::new(),
            worker: WorkerSection::default(),
            scheduler: SchedulerSection::default(),
            scheduling: SchedulingSection::default(),
            providers: ProvidersSection::default(),
            policy: PolicySection::default(),
            guardian: GuardianSection::default(),
            prices: Vec::new(),
            budgets: Vec::new(),
            workspace: WorkspaceSection::default(),
        }
    }
}

/// A timing setting in seconds, fractions allowed (`0.5`), written as a plain number in
/// the file, the environment and flags.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secs(pub f64);

impl Secs {
    /// As a `Duration`; a value [`Settings::validate`] would refuse saturates instead of
    /// panicking (zero below, the largest duration above).
    pub fn duration(self) -> Duration {
        Duration::try_from_secs_f64(self.0).unwrap_or(if self.0 > 0.0 {
            Duration::MAX
        } else {
            Duration::ZERO
        })
    }
}

impl From<u64> for Secs {
    fn from(s: u64) -> Self {
        Secs(s as f64)
    }
}

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Secs {
    type Err = std::num::ParseFloatError;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        s.trim().parse().map(Secs)
    }
}

// Whole seconds from elsewhere (a pod's termination grace period) compare with a timing
// setting directly.
impl PartialEq<Secs> for u64 {
    fn eq(&self, other: &Secs) -> bool {
        (*self as f64) == other.0
    }
}

impl PartialOrd<Secs> for u64 {
    fn partial_cmp(&self, other: &Secs) -> Option<std::cmp::Ordering> {
        (*self as f64).partial_cmp(&other.0)
    }
}

/// `[worker]`: how a worker process runs sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSection {
    /// Sessions run at once by one worker process.
    pub concurrency: usize,
    pub queues: Vec<String>,
    pub lease_ttl_secs: Secs,
    pub heartbeat_secs: Secs,
    /// Entries idle this long in another consumer's pending list are taken over.
    pub reclaim_min_idle_secs: Secs,
    pub reclaim_interval_secs: Secs,
    /// Deliveries of one entry before it is dead-lettered.
    pub max_attempts: u32,
    /// How long a SIGTERM'd worker lets running iterations reach a checkpoint.
    pub drain_timeout_secs: Secs,
    /// How long one read of the queue waits for entries.
    pub read_block_ms: u64,
    pub workspace_root: PathBuf,
    /// Provider of sessions that name none.
    pub default_provider: String,
    pub default_model: Option<String>,
    /// Tools of sessions that name none; `None` means the agent's read-only set.
    pub default_tools: Option<Vec<String>>,
    pub shell_enabled: bool,
    /// Let http tools reach private and loopback addresses.
    pub allow_private_network: bool,
    pub allowed_hosts: Vec<String>,
    /// Largest file a tool may write (`write_file`, the result of `edit_file`), in bytes.
    pub max_file_bytes: u64,
    /// Most bytes the files of one workspace (a session tree's directory) may hold,
    /// checked before every write of a file tool.
    pub workspace_quota_bytes: u64,
    /// Tools that need approval in every session, on top of each session's own list.
    pub sensitive_tools: Vec<String>,
    /// How long a finished session's event stream is kept.
    pub event_ttl_secs: Secs,
    /// Deepest sub-agent nesting (a root session is depth 0).
    pub max_depth: u32,
    /// Most sub-agents one session may start.
    pub max_children: usize,
    /// Group commit: most checkpoints committed together.
    pub checkpoint_batch_max: usize,
    /// Group commit: commits in flight at once.
    pub checkpoint_writers: usize,
    /// How long the checkpoint of a response whose calls have no effect anywhere may wait
    /// to be committed together with their results; 0 commits every response first.
    pub write_ahead_grace_ms: u64,
    /// Retries of an LLM call after real failures (5xx, transport, undecodable answers)
    /// for sessions whose spec sets none. Rate-limit waits never count.
    pub max_llm_retries: u32,
    /// A session whose next LLM call would wait longer than this for a rate limit gives
    /// up its slot and waits suspended; 0 never suspends.
    pub rate_limit_suspend_secs: Secs,
}

impl Default for WorkerSection {
    fn default() -> Self {
        WorkerSection {
            concurrency: 256,
            queues: vec!["default".to_string()],
            lease_ttl_secs: Secs(6.0),
            heartbeat_secs: Secs(2.0),
            reclaim_min_idle_secs: Secs(6.0),
            reclaim_interval_secs: Secs(2.0),
            max_attempts: 5,
            drain_timeout_secs: Secs(30.0),
            read_block_ms: 2_000,
            workspace_root: PathBuf::from("./agentq-workspaces"),
            default_provider: "scripted".to_string(),
            default_model: None,
            default_tools: None,
            shell_enabled: false,
            allow_private_network: false,
            allowed_hosts: Vec::new(),
            max_file_bytes: agentq_agent::tools::DEFAULT_MAX_FILE_BYTES,
            workspace_quota_bytes: agentq_agent::tools::DEFAULT_WORKSPACE_QUOTA_BYTES,
            sensitive_tools: Vec::new(),
            event_ttl_secs: Secs(86_400.0),
            max_depth: 3,
            max_children: 16,
            checkpoint_batch_max: 256,
            checkpoint_writers: 2,
            write_ahead_grace_ms: u64::try_from(
                agentq_agent::driver::DEFAULT_WRITE_AHEAD_GRACE.as_millis(),
            )
            .unwrap_or(u64::MAX),
            max_llm_retries: agentq_agent::spec::DEFAULT_MAX_LLM_RETRIES,
            rate_limit_suspend_secs: Secs(
                agentq_agent::driver::DEFAULT_SUSPEND_AFTER.as_secs_f64(),
            ),
        }
    }
}

/// `[scheduler]`: the HTTP API and the sweeper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerSection {
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
    /// Most queues there may be, the configured ones and those an admin creates: each is
    /// a Redis stream and a label value of the metrics.
    pub max_queues: usize,
    /// A queue stream longer than this has its acked history trimmed by the sweeper
    /// (entries pending or not yet delivered are kept whatever the length).
    pub stream_max_len: u64,
    /// How long a verified API key is trusted without asking the database again: a
    /// revoked key is refused at most this long after `agentq keys revoke`, and its
    /// open event streams (and other answers still being sent) are cut as soon.
    pub key_cache_secs: u64,
    /// Open client connections at most; past it a new one is answered 503 and closed.
    pub max_connections: usize,
    /// Open connections at most that carried a request of one API key; past it a
    /// request with that key is answered 503 and its connection closed.
    pub max_connections_per_key: usize,
    /// Open connections at most from one peer (an IPv4 address, an IPv6 /64). A new
    /// connection past it (or past `max_connections`) closes the oldest connection that
    /// has not authenticated a request yet (the peer's own, past this cap); only when
    /// every connection authenticated is the new one answered 503.
    pub max_connections_per_peer: usize,
    /// Bytes of `POST /v1/sessions/batch` bodies read and decoded at once, across all
    /// requests (a batch takes about four times its body while it is created), one
    /// tenant's at most half of them; a batch whose body would go past either is
    /// answered 503 with `Retry-After`, one larger than half of it 413.
    pub batch_decode_bytes: usize,
    /// Open event streams (`GET /v1/sessions/{id}/events`) at most, in all.
    pub max_event_streams: usize,
    /// Open event streams at most per tenant.
    pub max_event_streams_per_tenant: usize,
    /// Open event streams at most per API key.
    pub max_event_streams_per_key: usize,
    /// Seconds a client has to send a request's headers; also how long an idle
    /// keep-alive connection stays open.
    pub header_read_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body.
    pub body_read_timeout_secs: u64,
    /// Seconds a write to a client may wait for it to take bytes; a client that reads
    /// nothing for as long (a stalled event stream, pipelined requests never read) is
    /// disconnected, so it cannot hold a connection forever.
    pub write_timeout_secs: u64,
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection {
            sweep_interval_secs: 5,
            sweep_age_secs: 10,
            max_prompt_bytes: 1_000_000,
            max_batch: 10_000,
            queues: vec!["default".to_string()],
            max_queues: 64,
            stream_max_len: 1_000_000,
            key_cache_secs: 30,
            max_connections: 4096,
            max_connections_per_key: 256,
            max_connections_per_peer: 256,
            batch_decode_bytes: 64 * 1024 * 1024,
            max_event_streams: 2048,
            max_event_streams_per_tenant: 512,
            max_event_streams_per_key: 128,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 60,
            write_timeout_secs: 60,
        }
    }
}

/// `[scheduling]`: how the scheduler's dispatcher shares each queue among tenants and
/// batches. A queue's stream is a short delivery buffer: past `buffer` sessions in it,
/// new sessions wait in the store, and the dispatcher moves them in as it drains, by
/// priority, then by weighted fair share across tenants and across each tenant's batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulingSection {
    /// Sessions of one queue in its stream and not yet claimed, at most, before new ones
    /// wait in the store for their turn.
    pub buffer: u32,
    /// How often the dispatcher refills the buffers.
    pub dispatch_interval_ms: u64,
    /// Sessions of one tenant running or in a buffer at most, for a tenant without its
    /// own `max_running`. Unset: no cap.
    pub tenant_max_running: Option<u32>,
    /// `[scheduling.tenants.<name>]`: a tenant's weight and cap.
    pub tenants: BTreeMap<String, TenantScheduling>,
}

impl Default for SchedulingSection {
    fn default() -> Self {
        SchedulingSection {
            buffer: 1000,
            dispatch_interval_ms: 100,
            tenant_max_running: None,
            tenants: BTreeMap::new(),
        }
    }
}

impl SchedulingSection {
    /// How `tenant` is scheduled.
    pub fn share(&self, tenant: &str) -> crate::scheduling::TenantShare {
        let t = self.tenants.get(tenant);
        crate::scheduling::TenantShare {
            weight: t.map_or(1, |t| t.weight.max(1)),
            max_running: t.and_then(|t| t.max_running).or(self.tenant_max_running),
        }
    }
}

/// One tenant's share of the queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantScheduling {
    /// Its share relative to other tenants' (each has 1 unless set).
    pub weight: u32,
    /// Its sessions running or in a buffer at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
}

impl Default for TenantScheduling {
    fn default() -> Self {
        TenantScheduling {
            weight: 1,
            max_running: None,
        }
    }
}

/// A credential: its `Debug` shows `<redacted>`, it has no `Display` and never
/// serialises, so a logged or dumped configuration cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `[providers]`: endpoints and the scripted provider's script from the file or the
/// environment; keys from the environment only (never serialised, never read from the
/// file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProvidersSection {
    pub openai_base_url: Option<String>,
    pub anthropic_base_url: Option<String>,
    /// A JSON script file for the scripted provider; `None` plays its built-in demo.
    pub script: Option<PathBuf>,
    #[serde(skip)]
    pub openai_api_key: Option<Secret>,
    #[serde(skip)]
    pub anthropic_api_key: Option<Secret>,
    /// Tenants with keys of their own (`[providers.tenants.<name>]`): their sessions use
    /// these endpoints and keys, never the shared ones above.
    pub tenants: BTreeMap<String, TenantProviders>,
}

/// `[providers.tenants.<name>]`: one tenant's provider endpoints and the environment
/// variables holding its keys. A key this table names no variable for is no key: the
/// tenant's sessions never fall back to the shared keys. An endpoint left unset is the
/// shared one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantProviders {
    pub openai_base_url: Option<String>,
    pub anthropic_base_url: Option<String>,
    /// The environment variable that holds this tenant's OpenAI key.
    pub openai_key_env: Option<String>,
    /// The environment variable that holds this tenant's Anthropic key.
    pub anthropic_key_env: Option<String>,
    #[serde(skip)]
    pub openai_api_key: Option<Secret>,
    #[serde(skip)]
    pub anthropic_api_key: Option<Secret>,
}

impl TenantProviders {
    /// Each named variable that is unset or empty, with the setting naming it.
    pub fn missing_keys(&self) -> Vec<(&'static str, &str)> {
        [
            ("openai_key_env", &self.openai_key_env, &self.openai_api_key),
            (
                "anthropic_key_env",
                &self.anthropic_key_env,
                &self.anthropic_api_key,
            ),
        ]
        .into_iter()
        .filter_map(|(field, var, key)| match (var, key) {
            (Some(var), None) => Some((field, var.as_str())),
            _ => None,
        })
        .collect()
    }
}

impl ProvidersSection {
    /// The scripted provider's script, read from [`ProvidersSection::script`].
    pub fn read_script(&self) -> Result<Option<String>> {
        let Some(path) = &self.script else {
            return Ok(None);
        };
        std::fs::read_to_string(path).map(Some).map_err(|e| {
            Error::Config(format!(
                "{}: cannot read {}: {e}",
                describe("providers.script"),
                path.display()
            ))
        })
    }
}

/// `[policy]`: what sessions may ask for — providers, models, endpoints, tools — and the
/// upper bounds of their limits, for every tenant; `[policy.tenants.<name>]` replaces
/// the fields it sets for that tenant's sessions (lists are replaced, never merged). The
/// rules themselves live in [`crate::policy`]. An unset bound means no bound beyond the
/// API's own limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicySection {
    /// Providers a session may name (or run with, by default).
    pub providers: Vec<String>,
    /// Models a session may use, as globs (`gpt-4o*`, `claude-*`, `*`).
    pub models: Vec<String>,
    /// Endpoints a session may name as `base_url`, compared as scheme, host, port and
    /// path without a trailing slash. Empty: a session may name none.
    pub base_urls: Vec<String>,
    /// Tools a session (and its sub-agents) may use, as globs.
    pub tools: Vec<String>,
    /// Queues a session may be put on, as globs: the queue picks the worker pool, and
    /// pools may differ in what their tools reach.
    pub queues: Vec<String>,
    pub max_iterations: Option<u32>,
    pub max_tokens: Option<u32>,
    /// Also applied to sessions that set no `token_budget`.
    pub token_budget: Option<u64>,
    pub tool_timeout_secs: Option<u64>,
    pub approval_timeout_secs: Option<u64>,
    /// The session's wall clock; also applied to sessions that set no `timeout_secs`.
    pub timeout_secs: Option<u64>,
    /// Sub-agents one session may start (the lower of this and `worker.max_children`).
    pub max_children: Option<usize>,
    /// Deepest sub-agent nesting (the lower of this and `worker.max_depth`).
    pub max_depth: Option<u32>,
    /// Sessions one tree may create, its root included (unset:
    /// [`crate::budget::DEFAULT_MAX_TREE_SESSIONS`]).
    pub max_tree_sessions: Option<u64>,
    /// Files one request may bring (`files`), and their bytes in all, decoded.
    pub max_input_files: usize,
    pub max_input_bytes: u64,
    /// Longest (bytes) and deepest (segments) path of a request's file.
    pub max_path_bytes: usize,
    pub max_path_depth: usize,
    pub tenants: BTreeMap<String, TenantPolicySection>,
}

impl Default for PolicySection {
    fn default() -> Self {
        let mut tools: Vec<String> = agentq_agent::tools::READ_ONLY_TOOLS
            .iter()
            .map(|s| s.to_string())
            .collect();
        tools.push(SPAWN_AGENT_TOOL.to_string());
        PolicySection {
            providers: PROVIDERS.iter().map(|s| s.to_string()).collect(),
            models: vec!["*".to_string()],
            base_urls: Vec::new(),
            tools,
            queues: vec!["*".to_string()],
            max_iterations: None,
            max_tokens: None,
            token_budget: None,
            tool_timeout_secs: None,
            approval_timeout_secs: None,
            timeout_secs: None,
            max_children: None,
            max_depth: None,
            max_tree_sessions: None,
            max_input_files: crate::workspace_path::FileLimits::DEFAULT.max_files,
            max_input_bytes: crate::workspace_path::FileLimits::DEFAULT.max_bytes,
            max_path_bytes: crate::workspace_path::FileLimits::DEFAULT.max_path_bytes,
            max_path_depth: crate::workspace_path::FileLimits::DEFAULT.max_path_depth,
            tenants: BTreeMap::new(),
        }
    }
}

/// One `[[budgets]]` entry: what a tenant may spend per period, in tokens (input +
/// output) and/or dollars, and what becomes of its sessions once it has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    pub tenant: String,
    pub period: crate::budget::Period,
    #[serde(default)]
    pub tokens: Option<u64>,
    #[serde(default)]
    pub usd: Option<f64>,
    #[serde(default)]
    pub on_budget: crate::budget::OnBudget,
}

impl BudgetSettings {
    /// The budget as the gate and the store hold it (dollars in nano-dollars).
    pub fn budget(&self) -> crate::budget::TenantBudget {
        crate::budget::TenantBudget {
            tenant: self.tenant.clone(),
            period: self.period,
            tokens: self.tokens,
            usd_nanos: self.usd.map(crate::budget::usd_to_nanos),
            on_budget: self.on_budget,
        }
    }
}

/// The tool that starts a sub-agent (the worker's own; allowed by the default policy).
pub const SPAWN_AGENT_TOOL: &str = "spawn_agent";

/// `[policy.tenants.<name>]`: each field it sets replaces the global one for the tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantPolicySection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub providers: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_urls: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_children: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tree_sessions: Option<u64>,
    pub max_input_files: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_input_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_path_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_path_depth: Option<usize>,
}

impl PolicySection {
    /// The policy of `tenant`: its override over the global fields.
    pub fn tenant(&self, tenant: &str) -> PolicySection {
        let mut p = PolicySection {
            tenants: BTreeMap::new(),
            ..self.clone()
        };
        let Some(o) = self.tenants.get(tenant) else {
            return p;
        };
        let o = o.clone();
        macro_rules! replace {
            ($($list:ident),*; $($bound:ident),*) => {
                $(if let Some(v) = o.$list { p.$list = v; })*
                $(if o.$bound.is_some() { p.$bound = o.$bound; })*
            };
        }
        replace!(providers, models, base_urls, tools, queues,
            max_input_files, max_input_bytes, max_path_bytes, max_path_depth;
            max_iterations, max_tokens, token_budget, tool_timeout_secs,
            approval_timeout_secs, timeout_secs, max_children, max_depth, max_tree_sessions);
        p
    }
}

/// A hook's timeout unless configured.
pub const DEFAULT_HOOK_TIMEOUT_MS: u64 = 5_000;
/// The longest a hook may take: a PreToolUse hook holds up every call it sees.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 60_000;
/// The guardian's timeout unless configured.
pub const DEFAULT_GUARDIAN_TIMEOUT_MS: u64 = 30_000;
pub const MAX_GUARDIAN_TIMEOUT_MS: u64 = 300_000;

fn d_hook_timeout() -> u64 {
    DEFAULT_HOOK_TIMEOUT_MS
}

/// One `[[hooks]]` entry: a webhook (`url`) or a command (`command`) asked at one point.
/// Only `pre_tool_use` hooks decide (`on_timeout` and `on_error` apply to them, and
/// default to deny: a hook that cannot answer blocks the call); the other points observe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSettings {
    pub on: HookPoint,
    /// An http(s) URL the event is POSTed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A program and its arguments, given the event on stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default = "d_hook_timeout")]
    pub timeout_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<Behavior>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<Behavior>,
    /// Tool points: only tools whose name matches one of these globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// A header sent to the webhook with every request, whose value is read from the
    /// environment variable `header_env` (never from the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_env: Option<String>,
    /// The value of `header_env`, read by the environment layer.
    #[serde(skip)]
    pub header_value: Option<Secret>,
}

impl HookSettings {
    /// What the hook does when it cannot answer in time.
    pub fn timeout_behavior(&self) -> Behavior {
        self.on_timeout.unwrap_or(Behavior::Deny)
    }

    /// What the hook does when it fails or answers no verdict.
    pub fn error_behavior(&self) -> Behavior {
        self.on_error.unwrap_or(Behavior::Deny)
    }
}

/// `[guardian]`: an LLM reviewer asked about each tool call the other automatic stages
/// let through. Off unless `provider` is set. It is built from the worker's own provider
/// settings (endpoints and keys of `[providers]`), never from a session's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardianSection {
    /// `openai`, `anthropic` or `scripted`; unset: no guardian.
    pub provider: Option<String>,
    /// Unset: the provider's default model.
    pub model: Option<String>,
    /// The reviewer's instructions; unset: a built-in reviewer prompt.
    pub prompt: Option<String>,
    pub timeout_ms: u64,
    /// When the review fails or its answer is not a verdict.
    pub on_error: Behavior,
    /// A call the reviewer cannot be shown whole (an argument or a target too long):
    /// `deny` it unasked, or `review` what was shown, told what was cut.
    pub on_truncated: OnTruncated,
    /// Only tools whose name matches one of these globs are reviewed; unset: every tool.
    pub tools: Option<Vec<String>>,
    /// The scripted provider's script for the guardian (tests and demos).
    pub script: Option<PathBuf>,
}

impl Default for GuardianSection {
    fn default() -> Self {
        GuardianSection {
            provider: None,
            model: None,
            prompt: None,
            timeout_ms: DEFAULT_GUARDIAN_TIMEOUT_MS,
            on_error: Behavior::Deny,
            on_truncated: OnTruncated::Deny,
            tools: None,
            script: None,
        }
    }
}

/// `[workspace]`: how long the durable workspaces of finished trees are kept, and the
/// collection of contents no workspace holds any more (run by the scheduler).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkspaceSection {
    /// A tree's files are deleted this long after its root finished (unless it runs
    /// again first); 0 keeps them for as long as the session.
    pub ttl_secs: u64,
    /// A content no workspace holds is collected once nothing touched it for this long.
    /// Longer than any commit may take after its uploads (a worker gives a commit up
    /// after ten lease times).
    pub blob_grace_secs: u64,
    /// How often the scheduler expires workspaces and collects contents.
    pub gc_interval_secs: u64,
    /// Trees expired, and contents collected, per statement at most.
    pub gc_batch: u32,
    /// Where the bytes of contents live: `database` (the `blobs` table) or `s3` (an
    /// S3-compatible bucket, `[workspace.s3]`; the database keeps the index).
    pub blob_store: BlobStoreKind,
    pub s3: S3Section,
}

/// `[workspace] blob_store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlobStoreKind {
    #[default]
    Database,
    S3,
}

/// `[workspace.s3]`: the bucket of `blob_store = "s3"`, addressed path-style (as
/// S3-compatible servers expect). The credentials are read from the environment
/// variables named here, never from the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Section {
    pub bucket: String,
    /// `http(s)://host[:port]`, e.g. `https://s3.eu-west-1.amazonaws.com`.
    pub endpoint: String,
    pub region: String,
    /// Prepended to each object's key (the content's SHA-256 in hex), e.g. `agentq/`.
    pub prefix: String,
    pub access_key_env: String,
    pub secret_key_env: String,
}

impl Default for S3Section {
    fn default() -> Self {
        S3Section {
            bucket: String::new(),
            endpoint: String::new(),
            region: "us-east-1".to_string(),
            prefix: String::new(),
            access_key_env: "AWS_ACCESS_KEY_ID".to_string(),
            secret_key_env: "AWS_SECRET_ACCESS_KEY".to_string(),
        }
    }
}

impl Default for WorkspaceSection {
    fn default() -> Self {
        WorkspaceSection {
            ttl_secs: 30 * 24 * 3600,
            blob_grace_secs: 3600,
            gc_interval_secs: 60,
            gc_batch: 500,
            blob_store: BlobStoreKind::Database,
            s3: S3Section::default(),
        }
    }
}

/// Sets one setting from the text of an environment variable; the message says why the
/// text is not a value of it.
type Apply = fn(&mut Settings, &str) -> std::result::Result<(), String>;

/// One setting's names: its dotted key in the file, the environment variable and the
/// flag that override it (the flag of `agentq worker`, or of `agentq dev` for what only
/// it has), and how the variable's text sets it.
pub struct Setting {
    pub key: &'static str,
    pub env: Option<&'static str>,
    pub flag: Option<&'static str>,
    apply: Option<Apply>,
}

const fn file(key: &'static str) -> Setting {
    Setting {
        key,
        env: None,
        flag: None,
        apply: None,
    }
}

const fn var(
    key: &'static str,
    env: &'static str,
    flag: Option<&'static str>,
    apply: Apply,
) -> Setting {
    Setting {
        key,
        env: Some(env),
        flag,
        apply: Some(apply),
    }
}

fn parse<T: std::str::FromStr>(v: &str) -> std::result::Result<T, String>
where
    T::Err: std::fmt::Display,
{
    v.trim()
        .parse()
        .map_err(|e| format!("`{v}` is not a valid value: {e}"))
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn boolean(v: &str) -> std::result::Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("`{v}` is not a boolean (true or false)")),
    }
}

/// Every setting, in file order. The environment layer and the error messages read it;
/// a test holds it equal to the fields of [`Settings`] and to `agentq.example.toml`.
pub const SETTINGS: &[Setting] = &[
    var(
        "database_url",
        "AGENTQ_DATABASE_URL",
        Some("--database-url"),
        |s, v| {
            s.database_url = Some(v.to_string());
            Ok(())
        },
    ),
    var(
        "redis_url",
        "AGENTQ_REDIS_URL",
        Some("--redis-url"),
        |s, v| {
            s.redis_url = Some(v.to_string());
            Ok(())
        },
    ),
    var("sqlite_path", "AGENTQ_DB", Some("--db"), |s, v| {
        s.sqlite_path = PathBuf::from(v);
        Ok(())
    }),
    var("api_addr", "AGENTQ_API_ADDR", Some("--addr"), |s, v| {
        s.api_addr = v.to_string();
        Ok(())
    }),
    var(
        "metrics_addr",
        "AGENTQ_METRICS_ADDR",
        Some("--metrics-addr"),
        |s, v| {
            s.metrics_addr = v.to_string();
            Ok(())
        },
    ),
    var("api_url", "AGENTQ_API_URL", Some("--api-url"), |s, v| {
        s.api_url = v.to_string();
        Ok(())
    }),
    file("hooks"),
    file("limits"),
    var(
        "worker.concurrency",
        "AGENTQ_WORKER_CONCURRENCY",
        Some("--concurrency"),
        |s, v| {
            s.worker.concurrency = parse(v)?;
            Ok(())
        },
    ),
    Setting {
        flag: Some("--queues"),
        ..file("worker.queues")
    },
    var(
        "worker.lease_ttl_secs",
        "AGENTQ_LEASE_TTL_SECS",
        Some("--lease-ttl-secs"),
        |s, v| {
            s.worker.lease_ttl_secs = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.heartbeat_secs",
        "AGENTQ_HEARTBEAT_SECS",
        Some("--heartbeat-secs"),
        |s, v| {
            s.worker.heartbeat_secs = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.reclaim_min_idle_secs",
        "AGENTQ_RECLAIM_MIN_IDLE_SECS",
        Some("--reclaim-min-idle-secs"),
        |s, v| {
            s.worker.reclaim_min_idle_secs = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.reclaim_interval_secs",
        "AGENTQ_RECLAIM_INTERVAL_SECS",
        Some("--reclaim-interval-secs"),
        |s, v| {
            s.worker.reclaim_interval_secs = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.max_attempts",
        "AGENTQ_MAX_ATTEMPTS",
        Some("--max-attempts"),
        |s, v| {
            s.worker.max_attempts = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.drain_timeout_secs",
        "AGENTQ_DRAIN_TIMEOUT_SECS",
        Some("--drain-timeout-secs"),
        |s, v| {
            s.worker.drain_timeout_secs = parse(v)?;
            Ok(())
        },
    ),
    file("worker.read_block_ms"),
    var(
        "worker.workspace_root",
        "AGENTQ_WORKSPACE_ROOT",
        Some("--workspace-root"),
        |s, v| {
            s.worker.workspace_root = PathBuf::from(v);
            Ok(())
        },
    ),
    var(
        "worker.default_provider",
        "AGENTQ_DEFAULT_PROVIDER",
        Some("--default-provider"),
        |s, v| {
            s.worker.default_provider = v.trim().to_string();
            Ok(())
        },
    ),
    var(
        "worker.default_model",
        "AGENTQ_DEFAULT_MODEL",
        Some("--default-model"),
        |s, v| {
            s.worker.default_model = Some(v.trim().to_string());
            Ok(())
        },
    ),
    file("worker.default_tools"),
    var(
        "worker.shell_enabled",
        "AGENTQ_SHELL_ENABLED",
        Some("--enable-shell"),
        |s, v| {
            s.worker.shell_enabled = boolean(v)?;
            Ok(())
        },
    ),
    file("worker.allow_private_network"),
    var(
        "worker.allowed_hosts",
        "AGENTQ_ALLOWED_HOSTS",
        Some("--allowed-hosts"),
        |s, v| {
            s.worker.allowed_hosts = list(v);
            Ok(())
        },
    ),
    var(
        "worker.max_file_bytes",
        "AGENTQ_MAX_FILE_BYTES",
        Some("--max-file-bytes"),
        |s, v| {
            s.worker.max_file_bytes = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.workspace_quota_bytes",
        "AGENTQ_WORKSPACE_QUOTA_BYTES",
        Some("--workspace-quota-bytes"),
        |s, v| {
            s.worker.workspace_quota_bytes = parse(v)?;
            Ok(())
        },
    ),
    file("worker.sensitive_tools"),
    file("worker.event_ttl_secs"),
    file("worker.max_depth"),
    file("worker.max_children"),
    var(
        "worker.checkpoint_batch_max",
        "AGENTQ_CHECKPOINT_BATCH_MAX",
        Some("--checkpoint-batch-max"),
        |s, v| {
            s.worker.checkpoint_batch_max = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.checkpoint_writers",
        "AGENTQ_CHECKPOINT_WRITERS",
        Some("--checkpoint-writers"),
        |s, v| {
            s.worker.checkpoint_writers = parse(v)?;
            Ok(())
        },
    ),
    var(
        "worker.write_ahead_grace_ms",
        "AGENTQ_WRITE_AHEAD_GRACE_MS",
        Some("--write-ahead-grace-ms"),
        |s, v| {
            s.worker.write_ahead_grace_ms = parse(v)?;
            Ok(())
        },
    ),
    file("worker.max_llm_retries"),
    file("worker.rate_limit_suspend_secs"),
    file("scheduler.sweep_interval_secs"),
    file("scheduler.sweep_age_secs"),
    file("scheduler.max_prompt_bytes"),
    file("scheduler.max_batch"),
    file("scheduler.queues"),
    file("scheduler.max_queues"),
    file("scheduler.stream_max_len"),
    var(
        "scheduler.key_cache_secs",
        "AGENTQ_KEY_CACHE_SECS",
        None,
        |s, v| {
            s.scheduler.key_cache_secs = parse(v)?;
            Ok(())
        },
    ),
    file("scheduler.max_connections"),
    file("scheduler.max_connections_per_key"),
    file("scheduler.max_connections_per_peer"),
    file("scheduler.batch_decode_bytes"),
    file("scheduler.max_event_streams"),
    file("scheduler.max_event_streams_per_tenant"),
    file("scheduler.max_event_streams_per_key"),
    file("scheduler.header_read_timeout_secs"),
    file("scheduler.body_read_timeout_secs"),
    file("scheduler.write_timeout_secs"),
    file("scheduling.buffer"),
    file("scheduling.dispatch_interval_ms"),
    file("scheduling.tenant_max_running"),
    var(
        "providers.openai_base_url",
        "OPENAI_BASE_URL",
        None,
        |s, v| {
            s.providers.openai_base_url = Some(v.trim().to_string());
            Ok(())
        },
    ),
    var(
        "providers.anthropic_base_url",
        "ANTHROPIC_BASE_URL",
        None,
        |s, v| {
            s.providers.anthropic_base_url = Some(v.trim().to_string());
            Ok(())
        },
    ),
    var(
        "providers.script",
        "AGENTQ_SCRIPT",
        Some("--script"),
        |s, v| {
            s.providers.script = Some(PathBuf::from(v));
            Ok(())
        },
    ),
    var(
        "policy.providers",
        "AGENTQ_POLICY_PROVIDERS",
        None,
        |s, v| {
            s.policy.providers = list(v);
            Ok(())
        },
    ),
    var("policy.models", "AGENTQ_POLICY_MODELS", None, |s, v| {
        s.policy.models = list(v);
        Ok(())
    }),
    var(
        "policy.base_urls",
        "AGENTQ_POLICY_BASE_URLS",
        None,
        |s, v| {
            s.policy.base_urls = list(v);
            Ok(())
        },
    ),
    var("policy.tools", "AGENTQ_POLICY_TOOLS", None, |s, v| {
        s.policy.tools = list(v);
        Ok(())
    }),
    file("policy.queues"),
    file("policy.max_iterations"),
    file("policy.max_tokens"),
    file("policy.token_budget"),
    file("policy.tool_timeout_secs"),
    file("policy.approval_timeout_secs"),
    file("policy.timeout_secs"),
    file("policy.max_children"),
    file("policy.max_depth"),
    file("policy.max_tree_sessions"),
    file("prices"),
    file("budgets"),
    file("policy.max_input_files"),
    file("policy.max_input_bytes"),
    file("policy.max_path_bytes"),
    file("policy.max_path_depth"),
    file("guardian.provider"),
    file("guardian.model"),
    file("guardian.prompt"),
    file("guardian.timeout_ms"),
    file("guardian.on_error"),
    file("guardian.on_truncated"),
    file("guardian.tools"),
    file("guardian.script"),
    var(
        "workspace.ttl_secs",
        "AGENTQ_WORKSPACE_TTL_SECS",
        None,
        |s, v| {
            s.workspace.ttl_secs = parse(v)?;
            Ok(())
        },
    ),
    file("workspace.blob_grace_secs"),
    file("workspace.gc_interval_secs"),
    file("workspace.gc_batch"),
    file("workspace.blob_store"),
    file("workspace.s3.bucket"),
    file("workspace.s3.endpoint"),
    file("workspace.s3.region"),
    file("workspace.s3.prefix"),
    file("workspace.s3.access_key_env"),
    file("workspace.s3.secret_key_env"),
];

type SetKey = fn(&mut ProvidersSection, Option<Secret>);

/// The provider keys: environment only, no file key, no flag.
const KEYS: &[(&str, SetKey)] = &[
    ("OPENAI_API_KEY", |p, k| p.openai_api_key = k),
    ("ANTHROPIC_API_KEY", |p, k| p.anthropic_api_key = k),
];

/// How a message names a setting: its key, and the variable and flag that set it.
pub fn describe(key: &str) -> String {
    let Some(s) = SETTINGS.iter().find(|s| s.key == key) else {
        return format!("`{key}`");
    };
    let others: Vec<&str> = s.env.iter().chain(s.flag.iter()).copied().collect();
    if others.is_empty() {
        format!("`{key}`")
    } else {
        format!("`{key}` ({})", others.join(", "))
    }
}

impl Settings {
    /// [`Settings::load_with`] on the process environment.
    pub fn load(path: Option<&Path>) -> Result<Settings> {
        Self::load_with(path, |k| std::env::var(k).ok())
    }

    /// The file (`path`, an error if it does not exist; else `./agentq.toml` when
    /// present), then the environment given as a lookup function. Not validated: a
    /// command adds its flags first ([`Settings::resolve`]).
    pub fn load_with(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings> {
        let mut settings = match path {
            Some(p) => Self::from_file(p)?,
            None => {
                let p = Path::new(DEFAULT_FILE);
                if p.is_file() {
                    Self::from_file(p)?
                } else {
                    Settings::default()
                }
            }
        };
        settings.apply_env(env, None)?;
        Ok(settings)
    }

    /// The file, then the environment of only the settings named in `keys` (file keys,
    /// e.g. `api_url`): for a command that needs a few settings, so that a variable meant
    /// for another command (`AGENTQ_WORKER_CONCURRENCY=auto`) cannot stop it. Not
    /// validated.
    pub fn load_only(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        keys: &[&str],
    ) -> Result<Settings> {
        let mut settings = Self::load_with(path, |_| None)?;
        settings.apply_env(env, Some(keys))?;
        Ok(settings)
    }

    /// What every command that runs something builds its settings with: the file, the
    /// environment, then `flags` (the command's own overrides), validated.
    pub fn resolve(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        flags: impl FnOnce(&mut Settings),
    ) -> Result<Settings> {
        let mut settings = Self::load_with(path, env)?;
        flags(&mut settings);
        settings.validate()?;
        Ok(settings)
    }

    /// Parse a TOML file (no environment applied).
    pub fn from_file(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml(&text).map_err(|e| match e {
            Error::Config(m) => Error::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parse TOML text (no environment applied).
    pub fn from_toml(text: &str) -> Result<Settings> {
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

    /// The environment over the settings; `only`: just the settings with these keys, and
    /// no provider keys.
    fn apply_env(
        &mut self,
        env: impl Fn(&str) -> Option<String>,
        only: Option<&[&str]>,
    ) -> Result<()> {
        // An empty variable counts as unset (a common result of `FOO= cmd` or templating).
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        for s in SETTINGS {
            let (Some(name), Some(apply)) = (s.env, s.apply) else {
                continue;
            };
            if only.is_some_and(|keys| !keys.contains(&s.key)) {
                continue;
            }
            if let Some(v) = var(name) {
                apply(self, &v)
                    .map_err(|why| Error::Config(format!("{name} (`{}`): {why}", s.key)))?;
            }
        }
        if only.is_none() {
            for (name, set) in KEYS {
                set(&mut self.providers, var(name).map(Secret::new));
            }
            for hook in &mut self.hooks {
                if let Some(name) = &hook.header_env {
                    hook.header_value = var(name).map(Secret::new);
                }
            }
            for t in self.providers.tenants.values_mut() {
                let read = |name: &Option<String>| {
                    name.as_deref()
                        .and_then(|n| var(n.trim()))
                        .map(|v| Secret::new(v.trim()))
                };
                t.openai_api_key = read(&t.openai_key_env);
                t.anthropic_api_key = read(&t.anthropic_key_env);
            }
        }
        Ok(())
    }

    /// What the agent's provider factory needs: endpoints and keys (the script is read
    /// separately, by [`ProvidersSection::read_script`]).
    pub fn provider_settings(&self) -> ProviderSettings {
        let p = &self.providers;
        let key = |k: &Option<Secret>| k.as_ref().map(|s| s.expose().to_string());
        ProviderSettings {
            openai_base_url: p.openai_base_url.clone(),
            openai_api_key: key(&p.openai_api_key),
            anthropic_base_url: p.anthropic_base_url.clone(),
            anthropic_api_key: key(&p.anthropic_api_key),
            script: None,
        }
    }

    /// [`Settings::provider_settings`] of each tenant with a `[providers.tenants.<name>]`
    /// table: its own keys, its endpoints or else the shared ones.
    pub fn tenant_provider_settings(&self) -> BTreeMap<String, ProviderSettings> {
        let p = &self.providers;
        let key = |k: &Option<Secret>| k.as_ref().map(|s| s.expose().to_string());
        p.tenants
            .iter()
            .map(|(name, t)| {
                let own = ProviderSettings {
                    openai_base_url: t
                        .openai_base_url
                        .clone()
                        .or_else(|| p.openai_base_url.clone()),
                    openai_api_key: key(&t.openai_api_key),
                    anthropic_base_url: t
                        .anthropic_base_url
                        .clone()
                        .or_else(|| p.anthropic_base_url.clone()),
                    anthropic_api_key: key(&t.anthropic_api_key),
                    script: None,
                };
                (name.clone(), own)
            })
            .collect()
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
        if is_credential_name(k) && !names_a_variable(k, v) {
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

/// A `…_env` setting whose value is an environment variable's name (such as
/// `workspace.s3.secret_key_env = "AWS_SECRET_ACCESS_KEY"`) names where a secret is, and
/// holds none; any other value of it is refused like a secret.
fn names_a_variable(k: &str, v: &toml::Value) -> bool {
    k.ends_with("_env")
        && v.as_str().is_some_and(|s| {
            !s.is_empty()
                && s.len() <= 128
                && !s.starts_with(|c: char| c.is_ascii_digit())
                && s.bytes()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
        })
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

mod limits;
mod validate;

pub use limits::LimitSettings;

#[cfg(test)]
mod tests;
