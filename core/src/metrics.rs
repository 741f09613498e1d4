//! Every Prometheus metric agentq exports, defined in one place with its unit and
//! buckets, registered in one registry per process. Labels never carry a session id, a
//! prompt or any user value: only provider, model, queue, tool and bounded outcome names.
//! A session names its model, so the `model` label is the model only when the operator
//! configured it ([`Metrics::label_models`]) and [`OTHER_MODEL`] otherwise: callers cannot
//! add series.

use std::collections::HashSet;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// LLM calls can stream for minutes: buckets reach well past 120 s.
const LLM_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
const TOOL_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
const CHECKPOINT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];
/// The `model` label of every model the operator did not configure.
pub const OTHER_MODEL: &str = "other";

/// Waits for admission: most calls wait not at all (the first bucket), rate-limited ones
/// up to a provider's minute window and beyond.
const ADMISSION_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
const ITERATION_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 40.0, 80.0, 160.0];
const TOKEN_BUCKETS: &[f64] = &[
    100.0,
    1_000.0,
    5_000.0,
    10_000.0,
    50_000.0,
    100_000.0,
    500_000.0,
    1_000_000.0,
    5_000_000.0,
];

pub struct Metrics {
    pub registry: Registry,
    pub iterations: IntCounterVec,
    pub llm_tokens: IntCounterVec,
    pub guardian_tokens: IntCounterVec,
    pub llm_requests: IntCounterVec,
    pub llm_request_duration: HistogramVec,
    pub llm_ttft: HistogramVec,
    pub llm_retries: IntCounterVec,
    pub llm_rate_limited: IntCounterVec,
    pub admission_wait: HistogramVec,
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
    pub tenant_cost_usd: prometheus::CounterVec,
    /// The models that are their own `model` label value (see the module docs).
    models: RwLock<HashSet<String>>,
    /// The tenants that are their own `tenant` label value: the configured ones (a
    /// tenant is any string an API key names, so the rest share [`OTHER_MODEL`]'s `other`).
    tenants: RwLock<HashSet<String>>,
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, Box::new(c.clone()));
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, Box::new(c.clone()));
    c
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, Box::new(g.clone()));
    g
}

fn histogram_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, Box::new(h.clone()));
    h
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, Box::new(h.clone()));
    h
}

fn register(r: &Registry, c: Box<dyn prometheus::core::Collector>) {
    // Names are constants of this file: a failure is a programming error caught by the
    // unit test below, never by input.
    if let Err(e) = r.register(c) {
        panic!("registering a metric: {e}");
    }
}

impl Metrics {
    /// A fresh registry with every metric (tests use their own; processes use [`global`]).
    pub fn new() -> Self {
        Self::with_limiter_errors(fresh_limiter_errors())
    }

    /// A fresh registry with every metric, `limiter_errors` being this counter.
    #[allow(clippy::too_many_lines)]
    fn with_limiter_errors(limiter_errors: IntCounter) -> Self {
        let r = Registry::new();
        let m = Metrics {
            iterations: counter_vec(
                &r,
                "agentq_iterations_total",
                "Agent loop iterations completed (LLM responses committed).",
                &["queue", "provider", "model"],
            ),
            llm_tokens: counter_vec(
                &r,
                "agentq_llm_tokens_total",
                "Tokens reported by LLM providers, by kind (input, output, cache_read, cache_write, reasoning).",
                &["provider", "model", "type"],
            ),
            guardian_tokens: counter_vec(
                &r,
                "agentq_guardian_tokens_total",
                "Tokens reported by the guardian's review calls, by kind (input, output, cache_read, cache_write, reasoning); not in agentq_llm_tokens_total.",
                &["provider", "model", "type"],
            ),
            llm_requests: counter_vec(
                &r,
                "agentq_llm_requests_total",
                "LLM request attempts by outcome.",
                &["provider", "model", "outcome"],
            ),
            llm_request_duration: histogram_vec(
                &r,
                "agentq_llm_request_duration_seconds",
                "Duration of one LLM request attempt, to the end of its stream.",
                &["provider", "model"],
                LLM_BUCKETS,
            ),
            llm_ttft: histogram_vec(
                &r,
                "agentq_llm_time_to_first_token_seconds",
                "Time from sending an LLM request to its first streamed token.",
                &["provider", "model"],
                LLM_BUCKETS,
            ),
            llm_retries: counter_vec(
                &r,
                "agentq_llm_retries_total",
                "LLM request attempts that failed and were retried, by reason.",
                &["provider", "reason"],
            ),
            llm_rate_limited: counter_vec(
                &r,
                "agentq_llm_rate_limited_total",
                "LLM calls the provider refused for its rate limit (HTTP 429, or 529 overloaded).",
                &["provider", "model"],
            ),
            admission_wait: histogram_vec(
                &r,
                "agentq_admission_wait_seconds",
                "Time an LLM call waited for admission by the rate limiter before it started.",
                &["provider", "model"],
                ADMISSION_BUCKETS,
            ),
            // The limiter's own counter (`agentq_limiter::errors`) in the process's
            // registry, where every limiter counts; a fresh counter for any other.
            limiter_errors: {
                register(&r, Box::new(limiter_errors.clone()));
                limiter_errors
            },
            llm_reissued: counter(
                &r,
                "agentq_llm_reissued_total",
                "LLM calls made again because the worker that made them died before their response was committed (mid-call, or while read-only calls ran under the write-ahead grace).",
            ),
            llm_reissued_tokens: counter(
                &r,
                "agentq_llm_reissued_tokens_total",
                "Tokens (input + output) spent on re-issued LLM calls.",
            ),
            tool_calls: counter_vec(
                &r,
                "agentq_tool_calls_total",
                "Tool calls by tool and outcome (ok, error, timeout, denied, cancelled).",
                &["tool", "outcome"],
            ),
            hook_calls: counter_vec(
                &r,
                "agentq_hook_calls_total",
                "Configured hooks and guardian asked, by point (pre_tool_use, post_tool_use, session_start, session_end, guardian) and outcome (allow, deny, ok; timeout, error, invalid: the configured behaviour applied; the guardian's truncated, budget, cancelled: denied without a verdict).",
                &["point", "outcome"],
            ),
            tool_duration: histogram_vec(
                &r,
                "agentq_tool_duration_seconds",
                "Tool execution time.",
                &["tool"],
                TOOL_BUCKETS,
            ),
            sessions_started: counter_vec(
                &r,
                "agentq_sessions_started_total",
                "Session runs started (a resumed session starts again).",
                &["queue"],
            ),
            sessions_finished: counter_vec(
                &r,
                "agentq_sessions_finished_total",
                "Sessions that reached a terminal state, by finish reason.",
                &["queue", "finish_reason"],
            ),
            sessions_active: {
                let g = IntGauge::new("agentq_sessions_active", "Sessions this worker is running.")
                    .unwrap_or_else(|e| panic!("metric: {e}"));
                register(&r, Box::new(g.clone()));
                g
            },
            sessions_waiting: gauge_vec(
                &r,
                "agentq_sessions_waiting",
                "Sessions suspended, by what they wait for.",
                &["reason"],
            ),
            sessions_held: gauge_vec(
                &r,
                "agentq_sessions_held",
                "Queued sessions held in the store, behind a full delivery buffer or a cap on running sessions, per queue.",
                &["queue"],
            ),
            sessions_suspended: counter_vec(
                &r,
                "agentq_sessions_suspended_total",
                "Runs that gave their session up to wait without a lease, by what it waits for (children, approval, rate_limit, budget).",
                &["reason"],
            ),
            session_iterations: histogram(
                &r,
                "agentq_session_iterations",
                "Iterations per finished session.",
                ITERATION_BUCKETS,
            ),
            session_tokens: histogram(
                &r,
                "agentq_session_tokens",
                "Tokens (input + output) per finished session.",
                TOKEN_BUCKETS,
            ),
            checkpoint_duration: histogram(
                &r,
                "agentq_checkpoint_duration_seconds",
                "Time to commit one checkpoint.",
                CHECKPOINT_BUCKETS,
            ),
            checkpoint_batch_size: histogram(
                &r,
                "agentq_checkpoint_batch_size",
                "Checkpoints committed together by one group commit.",
                BATCH_BUCKETS,
            ),
            iteration_overhead: histogram(
                &r,
                "agentq_iteration_overhead_seconds",
                "The loop's own time per iteration, outside the LLM and the tools (checkpoints, events, bookkeeping).",
                CHECKPOINT_BUCKETS,
            ),
            lease_lost: counter(
                &r,
                "agentq_lease_lost_total",
                "Runs stopped because another worker took the session's lease.",
            ),
            sessions_reclaimed: counter(
                &r,
                "agentq_sessions_reclaimed_total",
                "Queue entries taken over from workers that stopped heartbeating.",
            ),
            dead_letter: counter(
                &r,
                "agentq_dead_letter_total",
                "Sessions moved to the dead-letter stream.",
            ),
            events_dropped: counter_vec(
                &r,
                "agentq_events_dropped_total",
                "Session events a worker dropped instead of streaming them, because its event writer was behind (Redis slow or down); deltas go first.",
                &["kind"],
            ),
            queue_length: gauge_vec(
                &r,
                "agentq_queue_length",
                "Entries in the queue's stream (XLEN).",
                &["queue"],
            ),
            queue_pending: gauge_vec(
                &r,
                "agentq_queue_pending",
                "Entries delivered to workers and not acknowledged.",
                &["queue"],
            ),
            queue_lag: gauge_vec(
                &r,
                "agentq_queue_lag",
                "Entries not yet delivered to any worker.",
                &["queue"],
            ),
            build_info: gauge_vec(
                &r,
                "agentq_build_info",
                "Build information; the value is always 1.",
                &["version"],
            ),
            tenant_tokens: counter_vec(
                &r,
                "agentq_tenant_tokens_total",
                "Tokens spent by LLM calls per tenant, by kind (input, output, cache_read, cache_write).",
                &["tenant", "kind"],
            ),
            tenant_cost_usd: {
                let c = prometheus::CounterVec::new(
                    Opts::new(
                        "agentq_tenant_cost_usd_total",
                        "Dollars spent by LLM calls per tenant, at the configured prices.",
                    ),
                    &["tenant"],
                )
                .unwrap_or_else(|e| panic!("metric agentq_tenant_cost_usd_total: {e}"));
                r.register(Box::new(c.clone()))
                    .unwrap_or_else(|e| panic!("metric agentq_tenant_cost_usd_total: {e}"));
                c
            },
            registry: r,
            models: RwLock::default(),
            tenants: RwLock::default(),
        };
        m.build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        m
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

    /// An LLM call of `tenant` spent `usage`, costing `usd`.
    pub fn tenant_spent(&self, tenant: &str, usage: &agentq_agent::schema::Usage, usd: f64) {
        let t = self.tenant_label(tenant);
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

/// Serve `GET /metrics` on `addr` until `stop` fires. A tiny HTTP/1.1 responder so that
/// the worker (which has no HTTP API) needs no web framework.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    render: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    stop: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let (mut sock, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            _ = stop.cancelled() => return,
        };
        let render = render.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    render(),
                ),
                "/healthz" => ("200 OK", "text/plain", "ok".to_string()),
                _ => ("404 Not Found", "text/plain", "not found".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
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
}
