//! Every Prometheus metric agentq exports, defined in one place with its unit and
//! buckets, registered in one registry per process. Labels never carry a session id, a
//! prompt or any user value: only provider, model, queue, tool and bounded outcome names.
//! A session names its model, so the `model` label is the model only when the operator
//! configured it ([`Metrics::label_models`]) and [`OTHER_MODEL`] otherwise: callers cannot
//! add series.

//!
//! The families are registered by area in `families`; `serve` answers `GET /metrics`.

use std::collections::HashSet;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

use families::{
    LimiterFamilies, LlmFamilies, QueueFamilies, RetentionFamilies, SessionFamilies, StoreFamilies,
    TenantFamilies, ToolFamilies, WebhookFamilies,
};

mod families;
mod serve;

pub use serve::serve_metrics;

/// The `model` label of every model the operator did not configure.
pub const OTHER_MODEL: &str = "other";

pub struct Metrics {
    pub registry: Registry,
    pub iterations: IntCounterVec,
    pub llm_tokens: IntCounterVec,
    pub llm_web_searches: IntCounterVec,
    pub guardian_tokens: IntCounterVec,
    pub llm_requests: IntCounterVec,
    pub llm_request_duration: HistogramVec,
    pub llm_ttft: HistogramVec,
    pub llm_retries: IntCounterVec,
    pub llm_rate_limited: IntCounterVec,
    pub admission_wait: HistogramVec,
    /// Calls given back late to the rate limiter and asked again.
    pub admission_late: IntCounterVec,
    pub limiter_errors: IntCounter,
    pub llm_reissued: IntCounter,
    pub llm_reissued_tokens: IntCounter,
    pub tool_calls: IntCounterVec,
    pub hook_calls: IntCounterVec,
    pub tool_duration: HistogramVec,
    pub sessions_started: IntCounterVec,
    pub sessions_finished: IntCounterVec,
    pub sessions_active: IntGauge,
    pub sessions_waiting: IntGaugeVec,
    pub sessions_held: IntGaugeVec,
    pub sessions_suspended: IntCounterVec,
    pub session_iterations: Histogram,
    pub session_tokens: Histogram,
    pub checkpoint_duration: Histogram,
    pub checkpoint_batch_size: Histogram,
    pub claim_batch_size: Histogram,
    pub iteration_overhead: Histogram,
    pub lease_lost: IntCounter,
    pub sessions_reclaimed: IntCounter,
    pub dead_letter: IntCounter,
    pub events_dropped: IntCounterVec,
    pub queue_length: IntGaugeVec,
    pub queue_pending: IntGaugeVec,
    pub queue_lag: IntGaugeVec,
    pub build_info: IntGaugeVec,
    pub tenant_tokens: IntCounterVec,
    pub tenant_web_searches: IntCounterVec,
    pub tenant_cost_usd: prometheus::CounterVec,
    pub tenant_settlements_retried: IntCounterVec,
    pub webhook_attempts: IntCounterVec,
    pub webhook_endpoints_disabled: IntCounter,
    pub retention_trees: IntCounterVec,
    pub retention_sessions: IntCounterVec,
    pub retention_messages: IntCounter,
    pub retention_blob_bytes: IntCounter,
    /// The models that are their own `model` label value (see the module docs).
    models: RwLock<HashSet<String>>,
    /// The tenants that are their own `tenant` label value: the configured ones (a
    /// tenant is any string an API key names, so the rest share [`OTHER_MODEL`]'s `other`).
    tenants: RwLock<HashSet<String>>,
    /// The MCP servers whose tools share a `tool` label value of their own
    /// (`mcp__<server>`): the configured ones.
    mcp_servers: RwLock<HashSet<String>>,
}

impl Metrics {
    /// A fresh registry with every metric (tests use their own; processes use [`global`]).
    pub fn new() -> Self {
        Self::with_limiter_errors(fresh_limiter_errors())
    }

    /// A fresh registry with every metric, `limiter_errors` being this counter.
    fn with_limiter_errors(limiter_errors: IntCounter) -> Self {
        let r = Registry::new();
        let s = SessionFamilies::register(&r);
        let llm = LlmFamilies::register(&r);
        let limiter = LimiterFamilies::register(&r, limiter_errors);
        let tools = ToolFamilies::register(&r);
        let store = StoreFamilies::register(&r);
        let queues = QueueFamilies::register(&r);
        let tenants = TenantFamilies::register(&r);
        let webhooks = WebhookFamilies::register(&r);
        let retention = RetentionFamilies::register(&r);
        Metrics {
            build_info: families::build_info(&r),
            registry: r,
            iterations: s.iterations,
            llm_tokens: llm.llm_tokens,
            llm_web_searches: llm.llm_web_searches,
            guardian_tokens: llm.guardian_tokens,
            llm_requests: llm.llm_requests,
            llm_request_duration: llm.llm_request_duration,
            llm_ttft: llm.llm_ttft,
            llm_retries: llm.llm_retries,
            llm_rate_limited: limiter.llm_rate_limited,
            admission_wait: limiter.admission_wait,
            admission_late: limiter.admission_late,
            limiter_errors: limiter.limiter_errors,
            llm_reissued: llm.llm_reissued,
            llm_reissued_tokens: llm.llm_reissued_tokens,
            tool_calls: tools.tool_calls,
            hook_calls: tools.hook_calls,
            tool_duration: tools.tool_duration,
            sessions_started: s.sessions_started,
            sessions_finished: s.sessions_finished,
            sessions_active: s.sessions_active,
            sessions_waiting: s.sessions_waiting,
            sessions_held: s.sessions_held,
            sessions_suspended: s.sessions_suspended,
            session_iterations: s.session_iterations,
            session_tokens: s.session_tokens,
            checkpoint_duration: store.checkpoint_duration,
            checkpoint_batch_size: store.checkpoint_batch_size,
            claim_batch_size: store.claim_batch_size,
            iteration_overhead: store.iteration_overhead,
            lease_lost: s.lease_lost,
            sessions_reclaimed: s.sessions_reclaimed,
            dead_letter: s.dead_letter,
            events_dropped: store.events_dropped,
            queue_length: queues.queue_length,
            queue_pending: queues.queue_pending,
            queue_lag: queues.queue_lag,
            tenant_tokens: tenants.tenant_tokens,
            tenant_web_searches: tenants.tenant_web_searches,
            tenant_cost_usd: tenants.tenant_cost_usd,
            tenant_settlements_retried: tenants.tenant_settlements_retried,
            webhook_attempts: webhooks.webhook_attempts,
            webhook_endpoints_disabled: webhooks.webhook_endpoints_disabled,
            retention_trees: retention.retention_trees,
            retention_sessions: retention.retention_sessions,
            retention_messages: retention.retention_messages,
            retention_blob_bytes: retention.retention_blob_bytes,
            models: RwLock::default(),
            tenants: RwLock::default(),
            mcp_servers: RwLock::default(),
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Let these models be `model` label values (added to those already known).
    pub fn label_models(&self, models: impl IntoIterator<Item = String>) {
        self.models
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(models);
    }

    /// The `model` label value of `model`: itself when configured, else [`OTHER_MODEL`].
    pub fn model_label<'a>(&self, model: &'a str) -> &'a str {
        if self
            .models
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(model)
        {
            model
        } else {
            OTHER_MODEL
        }
    }

    /// Let these tenants be `tenant` label values (added to those already known).
    pub fn label_tenants(&self, tenants: impl IntoIterator<Item = String>) {
        self.tenants
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tenants);
    }

    /// The `tenant` label value of `tenant`: itself when configured, else `other`.
    pub fn tenant_label<'a>(&self, tenant: &'a str) -> &'a str {
        if self
            .tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(tenant)
        {
            tenant
        } else {
            OTHER_MODEL
        }
    }

    /// Let the tools of these MCP servers be labelled by their server.
    pub fn label_mcp_servers(&self, servers: impl IntoIterator<Item = String>) {
        self.mcp_servers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(servers);
    }

    /// The `tool` label value of `tool`: itself, except an MCP tool's
    /// (`mcp__<server>__<tool>`), whose name its server chooses, or the session for a
    /// server this worker lacks: `mcp__<server>` for a configured server, else
    /// `mcp__other`, so neither can add series at will.
    pub fn tool_label<'a>(&self, tool: &'a str) -> &'a str {
        const PREFIX: &str = "mcp__";
        let Some(rest) = tool.strip_prefix(PREFIX) else {
            return tool;
        };
        let server = rest.split("__").next().unwrap_or_default();
        let known = self
            .mcp_servers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(server);
        match tool.get(..PREFIX.len() + server.len()) {
            Some(label) if known => label,
            _ => "mcp__other",
        }
    }

    /// An LLM call of `tenant` spent `usage`, costing `usd` (its searches included).
    pub fn tenant_spent(&self, tenant: &str, usage: &agentq_agent::schema::Usage, usd: f64) {
        let t = self.tenant_label(tenant);
        if usage.web_search_requests > 0 {
            self.tenant_web_searches
                .with_label_values(&[t])
                .inc_by(usage.web_search_requests);
        }
        for (kind, n) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
        ] {
            if n > 0 {
                self.tenant_tokens.with_label_values(&[t, kind]).inc_by(n);
            }
        }
        if usd.is_finite() && usd > 0.0 {
            self.tenant_cost_usd.with_label_values(&[t]).inc_by(usd);
        }
    }

    /// A guardian's review call of `model` on `provider` spent `usage`.
    pub fn guardian_spent(&self, provider: &str, model: &str, usage: &agentq_agent::schema::Usage) {
        let model = self.model_label(model);
        for (kind, n) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
            ("reasoning", usage.reasoning_tokens),
        ] {
            if n > 0 {
                self.guardian_tokens
                    .with_label_values(&[provider, model, kind])
                    .inc_by(n);
            }
        }
    }

    pub fn observe_checkpoint(&self, d: Duration) {
        self.checkpoint_duration.observe(d.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The process-wide registry.
pub fn global() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| Metrics::with_limiter_errors(agentq_limiter::errors().clone()))
}

/// The name of the limiter's counter ([`agentq_limiter::errors`], which every limiter of
/// the process counts in and [`global`] exports); a unit test holds the limiter to it.
const LIMITER_ERRORS: &str = "agentq_admission_limiter_errors_total";

/// [`LIMITER_ERRORS`] for a registry no limiter counts in.
fn fresh_limiter_errors() -> IntCounter {
    IntCounter::new(LIMITER_ERRORS, agentq_limiter::ERRORS_HELP)
        .unwrap_or_else(|e| panic!("metric {LIMITER_ERRORS}: {e}"))
}

#[cfg(test)]
mod tests {
    use prometheus::core::Collector;

    use super::*;

    #[test]
    fn the_limiter_counts_under_the_name_defined_here() {
        let desc = agentq_limiter::errors().desc();
        assert_eq!(desc[0].fq_name, LIMITER_ERRORS);
        let global = global().limiter_errors.desc();
        assert_eq!(global[0].fq_name, LIMITER_ERRORS);
    }

    #[test]
    fn all_metrics_register_and_render() {
        let m = Metrics::new();
        m.iterations
            .with_label_values(&["default", "openai", "gpt"])
            .inc();
        m.llm_request_duration
            .with_label_values(&["openai", "gpt"])
            .observe(0.5);
        let text = m.render();
        assert!(text.contains("agentq_iterations_total{"));
        assert!(text.contains("agentq_build_info{version="));
        assert!(text.contains("agentq_llm_request_duration_seconds_bucket"));
    }

    /// An MCP server names its tools and a session names the tools of servers a worker
    /// lacks: neither may add `tool` series.
    #[test]
    fn mcp_tools_are_labelled_by_their_configured_server() {
        let m = Metrics::new();
        m.label_mcp_servers(["time".to_string()]);
        assert_eq!(m.tool_label("read_file"), "read_file");
        assert_eq!(m.tool_label("mcp__time__get_current_time"), "mcp__time");
        assert_eq!(m.tool_label("mcp__time__anything_else"), "mcp__time");
        assert_eq!(m.tool_label("mcp__evil__x1"), "mcp__other");
        assert_eq!(m.tool_label("mcp__"), "mcp__other");
        assert_eq!(m.tool_label("mcp__time"), "mcp__time");
    }
}
