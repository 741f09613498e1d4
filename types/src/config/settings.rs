//! [`Settings`], the root of the tree: the top-level settings (stores, addresses) and one
//! field per section, each with its default.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::hooks::{GuardianSection, HookSettings};
use super::limits::LimitSettings;
use super::mcp::McpSection;
use super::policy::{BudgetSettings, PolicySection};
use super::providers::ProvidersSection;
use super::redis::{LimiterSection, RedisSection};
use super::retention::RetentionSection;
use super::scheduler::{SchedulerSection, SchedulingSection};
use super::schedules::SchedulesSection;
use super::section::section;
use super::webhooks::WebhooksSection;
use super::worker::WorkerSection;
use super::workspace::WorkspaceSection;

/// The file looked for in the working directory when no path is given.
pub const DEFAULT_FILE: &str = "agentq.toml";
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7700";
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:7700";
pub const DEFAULT_SQLITE_PATH: &str = "./agentq.db";

section! {
    /// Everything a process may be configured with. Every field has a default, so an
    /// empty file (or none) is a valid configuration.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct Settings {
        /// Postgres; `None` means the embedded store.
        pub database_url: Option<String> = None,
        /// Redis; `None` means the in-process queue.
        pub redis_url: Option<String> = None,
        /// The embedded store's SQLite file (`agentq dev` without Postgres and Redis).
        pub sqlite_path: PathBuf = PathBuf::from(DEFAULT_SQLITE_PATH),
        /// Where the scheduler's HTTP API listens.
        pub api_addr: String = DEFAULT_API_ADDR.to_string(),
        /// Where `/metrics` is served by processes without the HTTP API.
        pub metrics_addr: String = DEFAULT_METRICS_ADDR.to_string(),
        /// Where the CLI client commands find the HTTP API.
        pub api_url: String = DEFAULT_API_URL.to_string(),
        /// The operator's hooks (`[[hooks]]`), each at one point, run by workers and
        /// `agentq run` in the order given.
        pub hooks: Vec<HookSettings> = Vec::new(),
        /// The fleet's rate limits (`[[limits]]`), per provider endpoint and key.
        pub limits: Vec<LimitSettings> = Vec::new(),
        /// `[redis]`: one server or a cluster, and the queues' partitions.
        pub redis: RedisSection = RedisSection::default(),
        /// `[limiter]`: what the rate limiter does while Redis cannot be reached.
        pub limiter: LimiterSection = LimiterSection::default(),
        pub worker: WorkerSection = WorkerSection::default(),
        pub scheduler: SchedulerSection = SchedulerSection::default(),
        pub scheduling: SchedulingSection = SchedulingSection::default(),
        pub providers: ProvidersSection = ProvidersSection::default(),
        pub policy: PolicySection = PolicySection::default(),
        pub guardian: GuardianSection = GuardianSection::default(),
        /// `[[prices]]`: dollars per million tokens per model (glob; the first match
        /// wins).
        pub prices: Vec<crate::budget::PriceEntry> = Vec::new(),
        /// `[[budgets]]`: tenant budgets per day or month (the admin API may override
        /// them).
        pub budgets: Vec<BudgetSettings> = Vec::new(),
        pub workspace: WorkspaceSection = WorkspaceSection::default(),
        /// `[mcp]`: the MCP servers every worker starts, whose tools sessions may call.
        pub mcp: McpSection = McpSection::default(),
        /// `[webhooks]`: the delivery of signed webhooks to tenants' endpoints.
        pub webhooks: WebhooksSection = WebhooksSection::default(),
        /// `[retention]`: how long finished session trees are kept.
        pub retention: RetentionSection = RetentionSection::default(),
        /// `[schedules]`: the schedules' fire loop.
        pub schedules: SchedulesSection = SchedulesSection::default(),
    }
}
