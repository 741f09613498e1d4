//! What a session is asked to do and under which limits: the per-session knobs with their
//! defaults, the run modes, and the reasons a session ends.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub const DEFAULT_MAX_ITERATIONS: u32 = 40;
pub const DEFAULT_TEMPERATURE: f32 = 0.1;
pub const DEFAULT_MAX_TOKENS: u32 = 8192;
pub const TOOL_RESULT_MAX_CHARS: usize = 50_000;
pub const DEFAULT_MAX_LLM_RETRIES: u32 = 2;
pub const DEFAULT_RETRY_DELAY_MS: u64 = 1_000;
pub const DEFAULT_TOOL_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_APPROVAL_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_MAX_BACKGROUND_DRAIN_ROUNDS: u32 = 3;
pub const DEFAULT_HISTORY_WINDOW: usize = 100;
/// See `docs/stuck.md` for the transcripts these two were chosen from.
pub const DEFAULT_MAX_REPEATED_CALLS: u32 = 5;
pub const DEFAULT_WARN_REPEATED_CALLS: u32 = 2;

/// The tool name a session lists in `tools` to have its provider search the web itself
/// (a server tool: the provider runs the searches during its answer, and bills them per
/// search). Never a local tool: no registry may hold one of this name.
pub const WEB_SEARCH_TOOL: &str = "web_search";
/// Searches one LLM call may run when the session does not say.
pub const DEFAULT_WEB_SEARCH_MAX_USES: u32 = 5;
/// The most searches one LLM call may run, whatever the session says.
pub const MAX_WEB_SEARCH_MAX_USES: u32 = 50;
/// The most entries of `web_search.allowed_domains` and of `blocked_domains`.
pub const MAX_WEB_SEARCH_DOMAINS: usize = 100;

/// How the provider's own web search (the `web_search` tool) may search: how often per LLM
/// call, and where. Applies when the session has the tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebSearch {
    /// Searches one LLM call may run (1 to 50; unset: 5, or the tenant's bound when
    /// lower); past it the provider answers the search with an
    /// error the model sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    /// Only results from these domains (no scheme: `example.com`); not with
    /// `blocked_domains`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_domains: Vec<String>,
    /// Never results from these domains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_domains: Vec<String>,
}

impl WebSearch {
    /// Searches one LLM call may run.
    pub fn max_uses(&self) -> u32 {
        self.max_uses.unwrap_or(DEFAULT_WEB_SEARCH_MAX_USES)
    }

    /// Check the options a client sent; the error names the field (below `web_search`).
    pub fn validate(&self) -> Result<(), (String, String)> {
        if let Some(n) = self.max_uses
            && !(1..=MAX_WEB_SEARCH_MAX_USES).contains(&n)
        {
            return Err((
                "web_search.max_uses".into(),
                format!("must be between 1 and {MAX_WEB_SEARCH_MAX_USES}, got {n}"),
            ));
        }
        if !self.allowed_domains.is_empty() && !self.blocked_domains.is_empty() {
            return Err((
                "web_search.blocked_domains".into(),
                "cannot be combined with allowed_domains".into(),
            ));
        }
        for (field, list) in [
            ("allowed_domains", &self.allowed_domains),
            ("blocked_domains", &self.blocked_domains),
        ] {
            if list.len() > MAX_WEB_SEARCH_DOMAINS {
                return Err((
                    format!("web_search.{field}"),
                    format!(
                        "holds at most {MAX_WEB_SEARCH_DOMAINS} domains, got {}",
                        list.len()
                    ),
                ));
            }
            if let Some(i) = list.iter().position(|d| !domain_ok(d)) {
                return Err((
                    format!("web_search.{field}[{i}]"),
                    "must be a domain without scheme or spaces, such as `example.com` or \
                     `docs.example.com/guide` (at most 253 characters)"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}

/// A domain filter as the provider takes it: a host, optionally with a path, no scheme.
fn domain_ok(d: &str) -> bool {
    let host = d.split('/').next().unwrap_or_default();
    !d.is_empty()
        && d.len() <= 253
        && !d.contains("://")
        && !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '*'))
        && !d.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// How much a session may do: run tools, or only answer or plan (a model asked for a plan
/// or an answer from knowledge must not touch the workspace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Tools are offered and run automatically.
    #[default]
    Act,
    /// No tools: answer from knowledge.
    Think,
    /// No tools: produce a plan only.
    Plan,
    /// A plan phase without tools, then an act phase with them.
    PlanAct,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "act" => Ok(Mode::Act),
            "think" => Ok(Mode::Think),
            "plan" => Ok(Mode::Plan),
            "plan-act" | "plan_act" => Ok(Mode::PlanAct),
            other => Err(format!(
                "unknown mode `{other}` (expected act, think, plan or plan-act)"
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Act => "act",
            Mode::Think => "think",
            Mode::Plan => "plan",
            Mode::PlanAct => "plan-act",
        })
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExitReason {
    Stop,
    MaxIterations,
    Interrupted,
    Timeout,
    Error,
    Yielded,
    BudgetExhausted,
    /// The model made the same call `max_repeated_calls` times in a row.
    Stuck,
}

impl ExitReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            ExitReason::Stop => "stop",
            ExitReason::MaxIterations => "max_iterations",
            ExitReason::Interrupted => "interrupted",
            ExitReason::Timeout => "timeout",
            ExitReason::Error => "error",
            ExitReason::Yielded => "yielded",
            ExitReason::BudgetExhausted => "budget_exhausted",
            ExitReason::Stuck => "stuck",
        }
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn d_max_iterations() -> u32 {
    DEFAULT_MAX_ITERATIONS
}
fn d_temperature() -> f32 {
    DEFAULT_TEMPERATURE
}
fn d_max_tokens() -> u32 {
    DEFAULT_MAX_TOKENS
}
fn d_tool_timeout() -> u64 {
    DEFAULT_TOOL_TIMEOUT_SECS
}
fn d_approval_timeout() -> u64 {
    DEFAULT_APPROVAL_TIMEOUT_SECS
}
fn d_history_window() -> usize {
    DEFAULT_HISTORY_WINDOW
}
fn d_retry_delay() -> u64 {
    DEFAULT_RETRY_DELAY_MS
}
fn d_drain_rounds() -> u32 {
    DEFAULT_MAX_BACKGROUND_DRAIN_ROUNDS
}
fn d_max_repeated_calls() -> u32 {
    DEFAULT_MAX_REPEATED_CALLS
}
fn d_warn_repeated_calls() -> u32 {
    DEFAULT_WARN_REPEATED_CALLS
}
fn d_output_max() -> usize {
    TOOL_RESULT_MAX_CHARS
}

/// A session's request: the prompt plus every per-session override. Serialisable: it is
/// stored with the session and sent over the API. Provider credentials are never here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SessionSpec {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// `openai`, `anthropic` or `scripted`; absent means the host's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "d_max_iterations")]
    pub max_iterations: u32,
    #[serde(default = "d_temperature")]
    pub temperature: f32,
    #[serde(default = "d_max_tokens")]
    pub max_tokens: u32,
    /// Names of the tools this session may use; absent means the host's default set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default = "d_tool_timeout")]
    pub tool_timeout_secs: u64,
    #[serde(default = "d_approval_timeout")]
    pub approval_timeout_secs: u64,
    /// Messages of history sent to the model at most (the request view only).
    #[serde(default = "d_history_window")]
    pub history_window: usize,
    /// Above this many characters, old tool outputs are shortened in the request view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_budget_chars: Option<usize>,
    /// Total tokens (input + output) the session may spend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// Wall-clock limit of the whole session, from its first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Retries of an LLM call after real failures (transport, 5xx, undecodable answers);
    /// rate-limit waits never count. Absent: the host's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_llm_retries: Option<u32>,
    #[serde(default = "d_retry_delay")]
    pub retry_delay_ms: u64,
    #[serde(default = "d_drain_rounds")]
    pub max_background_drain_rounds: u32,
    #[serde(default = "d_output_max")]
    pub tool_output_max_chars: usize,
    /// End the session `stuck` when the model makes the same call (same tool, equal
    /// arguments) this many times in a row with the same result each time; 0: never.
    #[serde(default = "d_max_repeated_calls")]
    pub max_repeated_calls: u32,
    /// From this many same calls in a row with the same result on, the result tells the
    /// model so; 0: never.
    #[serde(default = "d_warn_repeated_calls")]
    pub warn_repeated_calls: u32,
    /// Tools that need a human's approval before they run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sensitive_tools: Vec<String>,
    /// How the provider's web search may search, when the session has the `web_search` tool
    /// (unset: its defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search: Option<WebSearch>,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
}

impl SessionSpec {
    pub fn new(prompt: impl Into<String>) -> Self {
        SessionSpec {
            prompt: prompt.into(),
            system: None,
            provider: None,
            model: None,
            base_url: None,
            mode: Mode::Act,
            max_iterations: DEFAULT_MAX_ITERATIONS,
            temperature: DEFAULT_TEMPERATURE,
            max_tokens: DEFAULT_MAX_TOKENS,
            tools: None,
            tool_timeout_secs: DEFAULT_TOOL_TIMEOUT_SECS,
            approval_timeout_secs: DEFAULT_APPROVAL_TIMEOUT_SECS,
            history_window: DEFAULT_HISTORY_WINDOW,
            context_budget_chars: None,
            token_budget: None,
            timeout_secs: None,
            max_llm_retries: None,
            retry_delay_ms: DEFAULT_RETRY_DELAY_MS,
            max_background_drain_rounds: DEFAULT_MAX_BACKGROUND_DRAIN_ROUNDS,
            tool_output_max_chars: TOOL_RESULT_MAX_CHARS,
            max_repeated_calls: DEFAULT_MAX_REPEATED_CALLS,
            warn_repeated_calls: DEFAULT_WARN_REPEATED_CALLS,
            sensitive_tools: Vec::new(),
            web_search: None,
            metadata: Value::Null,
        }
    }

    /// Check the limits a client sent; the error names the field.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.prompt.trim().is_empty() {
            return Err(("prompt", "must not be empty".into()));
        }
        if self.max_iterations == 0 || self.max_iterations > 10_000 {
            return Err(("max_iterations", "must be between 1 and 10000".into()));
        }
        if !(0.0..=2.0).contains(&self.temperature) || self.temperature.is_nan() {
            return Err(("temperature", "must be between 0 and 2".into()));
        }
        if self.max_tokens == 0 || self.max_tokens > 1_000_000 {
            return Err(("max_tokens", "must be between 1 and 1000000".into()));
        }
        if self.tool_timeout_secs == 0 {
            return Err(("tool_timeout_secs", "must be positive".into()));
        }
        if self.history_window == 0 {
            return Err(("history_window", "must be positive".into()));
        }
        if self.tool_output_max_chars < 100 {
            return Err(("tool_output_max_chars", "must be at least 100".into()));
        }
        if let Some(p) = &self.provider
            && !matches!(p.as_str(), "openai" | "anthropic" | "scripted")
        {
            return Err((
                "provider",
                format!("unknown provider `{p}` (expected openai, anthropic or scripted)"),
            ));
        }
        if let Some(url) = &self.base_url {
            crate::provider::endpoint::check_base_url(url).map_err(|why| ("base_url", why))?;
        }
        Ok(())
    }

    /// Where the session's `tools` name the provider's web search; `None` when they do
    /// not (or it names no tools, and the host's defaults decide).
    pub fn web_search_index(&self) -> Option<usize> {
        self.tools
            .as_deref()?
            .iter()
            .position(|t| t == WEB_SEARCH_TOOL)
    }

    /// The web search options this session runs with: its own, or the defaults.
    pub fn web_search_options(&self) -> WebSearch {
        self.web_search.clone().unwrap_or_default()
    }
}
