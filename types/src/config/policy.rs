//! `[policy]` (what sessions may ask for, per tenant) and `[[budgets]]` (what a tenant
//! may spend), as the file writes them; the rules themselves live in [`crate::policy`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::providers::PROVIDERS;
use super::section::section;

/// The tool that starts a sub-agent (the worker's own; allowed by the default policy).
pub const SPAWN_AGENT_TOOL: &str = "spawn_agent";

section! {
    /// `[policy]`: what sessions may ask for — providers, models, endpoints, tools — and
    /// the upper bounds of their limits, for every tenant; `[policy.tenants.<name>]`
    /// replaces the fields it sets for that tenant's sessions (lists are replaced, never
    /// merged). The rules themselves live in [`crate::policy`]. An unset bound means no
    /// bound beyond the API's own limits.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct PolicySection {
        /// Providers a session may name (or run with, by default).
        pub providers: Vec<String> = PROVIDERS.iter().map(|s| s.to_string()).collect(),
        /// Models a session may use, as globs (`gpt-4o*`, `claude-*`, `*`).
        pub models: Vec<String> = vec!["*".to_string()],
        /// Endpoints a session may name as `base_url`, compared as scheme, host, port and
        /// path without a trailing slash. Empty: a session may name none.
        pub base_urls: Vec<String> = Vec::new(),
        /// Tools a session (and its sub-agents) may use, as globs.
        pub tools: Vec<String> = default_tools(),
        /// Queues a session may be put on, as globs: the queue picks the worker pool, and
        /// pools may differ in what their tools reach.
        pub queues: Vec<String> = vec!["*".to_string()],
        pub max_iterations: Option<u32> = None,
        pub max_tokens: Option<u32> = None,
        /// Also applied to sessions that set no `token_budget`.
        pub token_budget: Option<u64> = None,
        pub tool_timeout_secs: Option<u64> = None,
        pub approval_timeout_secs: Option<u64> = None,
        /// The session's wall clock; also applied to sessions that set no `timeout_secs`.
        pub timeout_secs: Option<u64> = None,
        /// Sub-agents one session may start (the lower of this and `worker.max_children`).
        pub max_children: Option<usize> = None,
        /// Deepest sub-agent nesting (the lower of this and `worker.max_depth`).
        pub max_depth: Option<u32> = None,
        /// Sessions one tree may create, its root included (unset:
        /// [`crate::budget::DEFAULT_MAX_TREE_SESSIONS`]).
        pub max_tree_sessions: Option<u64> = None,
        /// Web searches one LLM call of a session with `web_search` may run (its
        /// `web_search.max_uses`).
        pub max_web_search_uses: Option<u32> = None,
        /// Files one request may bring (`files`), and their bytes in all, decoded.
        pub max_input_files: usize = crate::workspace_path::FileLimits::DEFAULT.max_files,
        pub max_input_bytes: u64 = crate::workspace_path::FileLimits::DEFAULT.max_bytes,
        /// Longest (bytes) and deepest (segments) path of a request's file.
        pub max_path_bytes: usize = crate::workspace_path::FileLimits::DEFAULT.max_path_bytes,
        pub max_path_depth: usize = crate::workspace_path::FileLimits::DEFAULT.max_path_depth,
        pub tenants: BTreeMap<String, TenantPolicySection> = BTreeMap::new(),
    }
}

/// The agent's read-only tools and [`SPAWN_AGENT_TOOL`].
fn default_tools() -> Vec<String> {
    let mut tools: Vec<String> = agentq_agent::tools::READ_ONLY_TOOLS
        .iter()
        .map(|s| s.to_string())
        .collect();
    tools.push(SPAWN_AGENT_TOOL.to_string());
    tools
}

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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_web_search_uses: Option<u32>,
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
            approval_timeout_secs, timeout_secs, max_children, max_depth, max_tree_sessions,
            max_web_search_uses);
        p
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
