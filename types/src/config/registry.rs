//! The registry of settings ([`SETTINGS`]): each setting's dotted key in the file, the
//! environment variable and the flag that override it, and how the variable's text sets
//! it, one row per setting. The environment layer and every message naming a setting
//! ([`describe`]) read it; a test holds it equal to the fields of
//! [`Settings`](super::Settings) and to `agentq.example.toml`.

use std::path::PathBuf;

use super::providers::ProvidersSection;
use super::settings::Settings;
use super::values::Secret;

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
    pub(super) apply: Option<Apply>,
}

/// `Some` of what is given, `None` of nothing.
macro_rules! given {
    () => {
        None
    };
    ($value:expr) => {
        Some($value)
    };
}

/// The [`Apply`] of a field read from the environment with `$read`, none for a setting
/// only the file (or a flag) sets.
macro_rules! apply {
    ([$($field:tt)*]) => {
        None
    };
    ([$($field:tt)*] $read:ident) => {
        Some((|s: &mut Settings, v: &str| -> std::result::Result<(), String> {
            s.$($field)* = $read(v)?;
            Ok(())
        }) as Apply)
    };
}

/// The table of [`Setting`]s, one row each, written
/// `section.field [= "VARIABLE" as read] [, "--flag"];` where `read` turns the
/// variable's text into the field's value. The key is the field's path, so a row naming
/// no field does not compile.
macro_rules! settings {
    ($(
        $first:ident $(. $rest:ident)* $(= $env:literal as $read:ident)? $(, $flag:literal)?;
    )*) => {
        /// Every setting, in file order. The environment layer and the error messages
        /// read it; a test holds it equal to the fields of [`Settings`] and to
        /// `agentq.example.toml`.
        pub const SETTINGS: &[Setting] = &[$(
            Setting {
                key: concat!(stringify!($first) $(, ".", stringify!($rest))*),
                env: given!($($env)?),
                flag: given!($($flag)?),
                apply: apply!([$first $(. $rest)*] $($read)?),
            },
        )*];

        // Every row names a field, the file-only ones too: a misspelt row does not
        // compile.
        const _: fn(&Settings) = |s| {
            $(let _ = &s.$first $(. $rest)*;)*
        };
    };
}

settings! {
    database_url = "AGENTQ_DATABASE_URL" as some_text, "--database-url";
    redis_url = "AGENTQ_REDIS_URL" as some_text, "--redis-url";
    sqlite_path = "AGENTQ_DB" as path, "--db";
    api_addr = "AGENTQ_API_ADDR" as text, "--addr";
    metrics_addr = "AGENTQ_METRICS_ADDR" as text, "--metrics-addr";
    api_url = "AGENTQ_API_URL" as text, "--api-url";
    hooks;
    limits;
    redis.cluster = "AGENTQ_REDIS_CLUSTER" as boolean;
    redis.partitions = "AGENTQ_REDIS_PARTITIONS" as some_parse;
    limiter.on_unavailable;
    worker.concurrency = "AGENTQ_WORKER_CONCURRENCY" as parse, "--concurrency";
    worker.queues, "--queues";
    worker.lease_ttl_secs = "AGENTQ_LEASE_TTL_SECS" as parse, "--lease-ttl-secs";
    worker.heartbeat_secs = "AGENTQ_HEARTBEAT_SECS" as parse, "--heartbeat-secs";
    worker.reclaim_min_idle_secs = "AGENTQ_RECLAIM_MIN_IDLE_SECS" as parse,
        "--reclaim-min-idle-secs";
    worker.reclaim_interval_secs = "AGENTQ_RECLAIM_INTERVAL_SECS" as parse,
        "--reclaim-interval-secs";
    worker.max_attempts = "AGENTQ_MAX_ATTEMPTS" as parse, "--max-attempts";
    worker.drain_timeout_secs = "AGENTQ_DRAIN_TIMEOUT_SECS" as parse, "--drain-timeout-secs";
    worker.read_block_ms;
    worker.workspace_root = "AGENTQ_WORKSPACE_ROOT" as path, "--workspace-root";
    worker.default_provider = "AGENTQ_DEFAULT_PROVIDER" as some_trimmed, "--default-provider";
    worker.default_model = "AGENTQ_DEFAULT_MODEL" as some_trimmed, "--default-model";
    worker.default_tools;
    worker.shell_enabled = "AGENTQ_SHELL_ENABLED" as boolean, "--enable-shell";
    worker.allow_private_network;
    worker.allowed_hosts = "AGENTQ_ALLOWED_HOSTS" as list, "--allowed-hosts";
    worker.max_file_bytes = "AGENTQ_MAX_FILE_BYTES" as parse, "--max-file-bytes";
    worker.workspace_quota_bytes = "AGENTQ_WORKSPACE_QUOTA_BYTES" as parse,
        "--workspace-quota-bytes";
    worker.skills_dirs;
    worker.sensitive_tools;
    worker.event_ttl_secs;
    worker.max_depth;
    worker.max_children;
    worker.checkpoint_batch_max = "AGENTQ_CHECKPOINT_BATCH_MAX" as parse,
        "--checkpoint-batch-max";
    worker.checkpoint_writers = "AGENTQ_CHECKPOINT_WRITERS" as parse, "--checkpoint-writers";
    worker.write_ahead_grace_ms = "AGENTQ_WRITE_AHEAD_GRACE_MS" as parse,
        "--write-ahead-grace-ms";
    worker.max_llm_retries;
    worker.rate_limit_suspend_secs;
    scheduler.sweep_interval_secs;
    scheduler.sweep_age_secs;
    scheduler.max_prompt_bytes;
    scheduler.max_batch;
    scheduler.max_batch_items;
    scheduler.queues;
    scheduler.max_queues;
    scheduler.stream_max_len;
    scheduler.key_cache_secs = "AGENTQ_KEY_CACHE_SECS" as parse;
    scheduler.max_connections;
    scheduler.max_connections_per_key;
    scheduler.max_connections_per_peer;
    scheduler.batch_decode_bytes;
    scheduler.max_event_streams;
    scheduler.max_event_streams_per_tenant;
    scheduler.max_event_streams_per_key;
    scheduler.header_read_timeout_secs;
    scheduler.body_read_timeout_secs;
    scheduler.write_timeout_secs;
    scheduling.buffer;
    scheduling.dispatch_interval_ms;
    scheduling.tenant_max_running;
    providers.openai_base_url = "OPENAI_BASE_URL" as some_trimmed;
    providers.anthropic_base_url = "ANTHROPIC_BASE_URL" as some_trimmed;
    providers.script = "AGENTQ_SCRIPT" as some_path, "--script";
    providers.http = "AGENTQ_PROVIDERS_HTTP" as parse;
    providers.streams_per_connection = "AGENTQ_PROVIDERS_STREAMS_PER_CONNECTION" as parse;
    policy.providers = "AGENTQ_POLICY_PROVIDERS" as list;
    policy.models = "AGENTQ_POLICY_MODELS" as list;
    policy.base_urls = "AGENTQ_POLICY_BASE_URLS" as list;
    policy.tools = "AGENTQ_POLICY_TOOLS" as list;
    policy.queues;
    policy.max_iterations;
    policy.max_tokens;
    policy.token_budget;
    policy.tool_timeout_secs;
    policy.approval_timeout_secs;
    policy.timeout_secs;
    policy.max_children;
    policy.max_depth;
    policy.max_tree_sessions;
    policy.max_web_search_uses;
    prices;
    budgets;
    policy.max_input_files;
    policy.max_input_bytes;
    policy.max_path_bytes;
    policy.max_path_depth;
    guardian.provider;
    guardian.model;
    guardian.prompt;
    guardian.timeout_ms;
    guardian.on_error;
    guardian.on_truncated;
    guardian.tools;
    guardian.script;
    workspace.ttl_secs = "AGENTQ_WORKSPACE_TTL_SECS" as parse;
    workspace.blob_grace_secs;
    workspace.gc_interval_secs;
    workspace.gc_batch;
    workspace.blob_store;
    workspace.s3.bucket;
    workspace.s3.endpoint;
    workspace.s3.region;
    workspace.s3.prefix;
    workspace.s3.access_key_env;
    workspace.s3.secret_key_env;
    mcp.servers;
    webhooks.allowed_hosts = "AGENTQ_WEBHOOKS_ALLOWED_HOSTS" as list;
    webhooks.key_env;
    webhooks.timeout_secs;
    webhooks.max_response_bytes;
    webhooks.retry_for_secs;
    webhooks.max_backoff_secs;
    webhooks.disable_after_secs;
    webhooks.max_in_flight;
    webhooks.max_in_flight_per_endpoint;
    webhooks.max_endpoints;
    webhooks.retention_secs;
    webhooks.poll_interval_ms;
    retention.days = "AGENTQ_RETENTION_DAYS" as some_parse;
    retention.keep;
    retention.export = "AGENTQ_RETENTION_EXPORT" as some_trimmed;
    retention.batch;
    retention.max_batches;
    retention.pause_ms;
    retention.interval_secs;
    schedules.poll_secs = "AGENTQ_SCHEDULES_POLL_SECS" as parse;
    schedules.lease_secs = "AGENTQ_SCHEDULES_LEASE_SECS" as parse;
}

type SetKey = fn(&mut ProvidersSection, Option<Secret>);

/// The provider keys: environment only, no file key, no flag.
pub(super) const KEYS: &[(&str, SetKey)] = &[
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

// How a variable's text becomes a field's value. Addresses and paths are taken as
// written; names are trimmed.

type Read<T> = std::result::Result<T, String>;

fn text(v: &str) -> Read<String> {
    Ok(v.to_string())
}

fn some_text(v: &str) -> Read<Option<String>> {
    Ok(Some(v.to_string()))
}

fn some_trimmed(v: &str) -> Read<Option<String>> {
    Ok(Some(v.trim().to_string()))
}

fn path(v: &str) -> Read<PathBuf> {
    Ok(PathBuf::from(v))
}

fn some_path(v: &str) -> Read<Option<PathBuf>> {
    Ok(Some(PathBuf::from(v)))
}

fn parse<T: std::str::FromStr>(v: &str) -> Read<T>
where
    T::Err: std::fmt::Display,
{
    v.trim()
        .parse()
        .map_err(|e| format!("`{v}` is not a valid value: {e}"))
}

fn some_parse<T: std::str::FromStr>(v: &str) -> Read<Option<T>>
where
    T::Err: std::fmt::Display,
{
    parse(v).map(Some)
}

/// A comma-separated list, blanks dropped.
fn list(v: &str) -> Read<Vec<String>> {
    Ok(v.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

fn boolean(v: &str) -> Read<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("`{v}` is not a boolean (true or false)")),
    }
}
