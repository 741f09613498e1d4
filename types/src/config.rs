//! The settings of every agentq process, as one typed tree ([`Settings`]) built in one
//! order: defaults, then a TOML file (`agentq.toml`, or the path given with `--config`),
//! then the environment, then the command's flags; then [`Settings::validate`].
//!
//! This module owns the file format (the top level and the sections `[worker]`,
//! `[scheduler]`, `[providers]`, `[policy]`, `[[hooks]]`, `[guardian]`, `[mcp]`), every default,
//! the environment variables that override settings ([`SETTINGS`]), and every rule a
//! setting must follow. `Default` never reads the environment: reading it is the
//! explicit [`Settings::load_with`] step, with the lookup given as a function so tests can
//! inject one.
//!
//! Provider keys (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) are read only from the
//! environment, into [`Secret`]s that never print and never serialise: a config file is
//! often committed or mounted from a ConfigMap, so one that names a key is refused rather
//! than silently used.
//!
//! Where things are: each section is a struct written with its defaults beside its
//! fields (`settings` the root, `worker`, `scheduler`, `providers`, `policy`, `hooks`,
//! `workspace`, `limits`); `registry` is the one table naming each setting's file key,
//! variable and flag; `load` reads the file and the environment; `validate` holds the
//! rules. A new setting is a field with its default in its section, its row in the
//! registry (with its variable and flag, if any), its rule in `validate`, and its line in
//! `agentq.example.toml`.

mod hooks;
mod limits;
mod load;
mod mcp;
mod policy;
mod providers;
mod redis;
mod registry;
mod retention;
mod scheduler;
mod schedules;
mod section;
mod settings;
mod validate;
mod values;
mod webhooks;
mod worker;
mod workspace;

pub use hooks::{
    DEFAULT_GUARDIAN_TIMEOUT_MS, DEFAULT_HOOK_TIMEOUT_MS, GuardianSection, HookSettings,
    MAX_GUARDIAN_TIMEOUT_MS, MAX_HOOK_TIMEOUT_MS,
};
pub use limits::LimitSettings;
pub use load::is_credential_name;
pub use mcp::{
    DEFAULT_MCP_MAX_CONCURRENT_CALLS, DEFAULT_MCP_MAX_RESULT_BYTES, DEFAULT_MCP_TIMEOUT_SECS,
    MAX_MCP_CONCURRENT_CALLS, MCP_SEPARATOR, MCP_TOOL_PREFIX, McpSection, McpServerSettings,
    McpToolSettings, SideEffectSetting, mcp_server_of, mcp_tool_name,
};
pub use policy::{BudgetSettings, PolicySection, SPAWN_AGENT_TOOL, TenantPolicySection};
pub use providers::{NO_MODEL, PROVIDERS, ProvidersSection, TenantProviders};
pub use redis::{CLUSTER_PARTITIONS, LimiterSection, MAX_PARTITIONS, OnUnavailable, RedisSection};
pub use registry::{SETTINGS, Setting, describe};
pub use retention::{ExportTarget, RetentionOverride, RetentionSection};
pub use scheduler::{SchedulerSection, SchedulingSection, TenantScheduling};
pub use schedules::SchedulesSection;
pub use settings::{
    DEFAULT_API_ADDR, DEFAULT_API_URL, DEFAULT_FILE, DEFAULT_METRICS_ADDR, DEFAULT_SQLITE_PATH,
    Settings,
};
pub use values::{Secret, Secs};
pub use webhooks::WebhooksSection;
pub use worker::WorkerSection;
pub use workspace::{BlobStoreKind, S3Section, WorkspaceSection};

#[cfg(test)]
mod tests;
