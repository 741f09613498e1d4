//! The metric families, registered by area (the loop and its sessions, LLM calls, rate
//! limiting, tools and hooks, checkpoints and events, queues, tenants' spending), each
//! with its name, help, labels and buckets. Names carry their unit; buckets are
//! explicit.

use prometheus::{
    CounterVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
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

/// The agent loop and the sessions a worker runs, from start to finish.
pub(super) struct SessionFamilies {
    pub iterations: IntCounterVec,
    pub sessions_started: IntCounterVec,
    pub sessions_finished: IntCounterVec,
    pub sessions_active: IntGauge,
    pub sessions_waiting: IntGaugeVec,
    pub sessions_held: IntGaugeVec,
    pub sessions_suspended: IntCounterVec,
    pub session_iterations: Histogram,
    pub session_tokens: Histogram,
    pub lease_lost: IntCounter,
    pub sessions_reclaimed: IntCounter,
    pub dead_letter: IntCounter,
}

impl SessionFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        SessionFamilies {
            iterations: counter_vec(
                r,
                "agentq_iterations_total",
                "Agent loop iterations completed (LLM responses committed).",
                &["queue", "provider", "model"],
            ),
            sessions_started: counter_vec(
                r,
                "agentq_sessions_started_total",
                "Session runs started (a resumed session starts again).",
                &["queue"],
            ),
            sessions_finished: counter_vec(
                r,
                "agentq_sessions_finished_total",
                "Sessions that reached a terminal state, by finish reason.",
                &["queue", "finish_reason"],
            ),
            sessions_active: gauge(
                r,
                "agentq_sessions_active",
                "Sessions this worker is running.",
            ),
            sessions_waiting: gauge_vec(
                r,
                "agentq_sessions_waiting",
                "Sessions suspended, by what they wait for.",
                &["reason"],
            ),
            sessions_held: gauge_vec(
                r,
                "agentq_sessions_held",
                "Queued sessions held in the store, behind a full delivery buffer or a cap on running sessions, per queue.",
                &["queue"],
            ),
            sessions_suspended: counter_vec(
                r,
                "agentq_sessions_suspended_total",
                "Runs that gave their session up to wait without a lease, by what it waits for (children, approval, rate_limit, budget).",
                &["reason"],
            ),
            session_iterations: histogram(
                r,
                "agentq_session_iterations",
                "Iterations per finished session.",
                ITERATION_BUCKETS,
            ),
            session_tokens: histogram(
                r,
                "agentq_session_tokens",
                "Tokens (input + output) per finished session.",
                TOKEN_BUCKETS,
            ),
            lease_lost: counter(
                r,
                "agentq_lease_lost_total",
                "Runs stopped because another worker took the session's lease.",
            ),
            sessions_reclaimed: counter(
                r,
                "agentq_sessions_reclaimed_total",
                "Queue entries taken over from workers that stopped heartbeating.",
            ),
            dead_letter: counter(
                r,
                "agentq_dead_letter_total",
                "Sessions moved to the dead-letter stream.",
            ),
        }
    }
}

/// LLM calls: tokens, attempts and their outcomes, latency, retries and re-issues.
pub(super) struct LlmFamilies {
    pub llm_tokens: IntCounterVec,
    pub llm_web_searches: IntCounterVec,
    pub guardian_tokens: IntCounterVec,
    pub llm_requests: IntCounterVec,
    pub llm_request_duration: HistogramVec,
    pub llm_ttft: HistogramVec,
    pub llm_retries: IntCounterVec,
    pub llm_reissued: IntCounter,
    pub llm_reissued_tokens: IntCounter,
}

impl LlmFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        LlmFamilies {
            llm_tokens: counter_vec(
                r,
                "agentq_llm_tokens_total",
                "Tokens reported by LLM providers, by kind (input, output, cache_read, cache_write, reasoning).",
                &["provider", "model", "type"],
            ),
            llm_web_searches: counter_vec(
                r,
                "agentq_llm_web_searches_total",
                "Web searches LLM providers ran for the calls themselves (their own search tool, billed per search).",
                &["provider", "model"],
            ),
            guardian_tokens: counter_vec(
                r,
                "agentq_guardian_tokens_total",
                "Tokens reported by the guardian's review calls, by kind (input, output, cache_read, cache_write, reasoning); not in agentq_llm_tokens_total.",
                &["provider", "model", "type"],
            ),
            llm_requests: counter_vec(
                r,
                "agentq_llm_requests_total",
                "LLM request attempts by outcome.",
                &["provider", "model", "outcome"],
            ),
            llm_request_duration: histogram_vec(
                r,
                "agentq_llm_request_duration_seconds",
                "Duration of one LLM request attempt, to the end of its stream.",
                &["provider", "model"],
                LLM_BUCKETS,
            ),
            llm_ttft: histogram_vec(
                r,
                "agentq_llm_time_to_first_token_seconds",
                "Time from sending an LLM request to its first streamed token.",
                &["provider", "model"],
                LLM_BUCKETS,
            ),
            llm_retries: counter_vec(
                r,
                "agentq_llm_retries_total",
                "LLM request attempts that failed and were retried, by reason.",
                &["provider", "reason"],
            ),
            llm_reissued: counter(
                r,
                "agentq_llm_reissued_total",
                "LLM calls made again because the worker that made them died before their response was committed (mid-call, or while read-only calls ran under the write-ahead grace).",
            ),
            llm_reissued_tokens: counter(
                r,
                "agentq_llm_reissued_tokens_total",
                "Tokens (input + output) spent on re-issued LLM calls.",
            ),
        }
    }
}

/// Rate limiting of LLM calls: the providers' refusals, the waits for admission and the
/// limiter's own failures.
pub(super) struct LimiterFamilies {
    pub llm_rate_limited: IntCounterVec,
    pub admission_wait: HistogramVec,
    pub admission_late: IntCounterVec,
    pub limiter_errors: IntCounter,
}

impl LimiterFamilies {
    /// `limiter_errors` is the limiter's own counter (`agentq_limiter::errors`) in the
    /// process's registry, where every limiter counts; a fresh counter for any other.
    pub(super) fn register(r: &Registry, limiter_errors: IntCounter) -> Self {
        register(r, Box::new(limiter_errors.clone()));
        LimiterFamilies {
            llm_rate_limited: counter_vec(
                r,
                "agentq_llm_rate_limited_total",
                "LLM calls the provider refused for its rate limit (HTTP 429, or 529 overloaded).",
                &["provider", "model"],
            ),
            admission_wait: histogram_vec(
                r,
                "agentq_admission_wait_seconds",
                "Time an LLM call waited for admission by the rate limiter before it started.",
                &["provider", "model"],
                ADMISSION_BUCKETS,
            ),
            admission_late: counter_vec(
                r,
                "agentq_admission_late_total",
                "LLM calls that would have started later than the rate limiter's booking \
                 allowed (a starved worker, a slow gate): the booking was given back and the \
                 call asked again.",
                &["provider", "model"],
            ),
            limiter_errors,
        }
    }
}

/// Tool calls and the operator's hooks and guardian asked about them.
pub(super) struct ToolFamilies {
    pub tool_calls: IntCounterVec,
    pub hook_calls: IntCounterVec,
    pub tool_duration: HistogramVec,
}

impl ToolFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        ToolFamilies {
            tool_calls: counter_vec(
                r,
                "agentq_tool_calls_total",
                "Tool calls by tool and outcome (ok, error, timeout, denied, cancelled).",
                &["tool", "outcome"],
            ),
            hook_calls: counter_vec(
                r,
                "agentq_hook_calls_total",
                "Configured hooks and guardian asked, by point (pre_tool_use, post_tool_use, session_start, session_end, guardian) and outcome (allow, deny, ok; timeout, error, invalid: the configured behaviour applied; the guardian's truncated, budget, cancelled: denied without a verdict).",
                &["point", "outcome"],
            ),
            tool_duration: histogram_vec(
                r,
                "agentq_tool_duration_seconds",
                "Tool execution time.",
                &["tool"],
                TOOL_BUCKETS,
            ),
        }
    }
}

/// What a worker writes to the store and the event streams: checkpoints, their group
/// commits, its group claims, the loop's own time around them, and the events it had to drop.
pub(super) struct StoreFamilies {
    pub checkpoint_duration: Histogram,
    pub checkpoint_batch_size: Histogram,
    pub claim_batch_size: Histogram,
    pub iteration_overhead: Histogram,
    pub events_dropped: IntCounterVec,
}

impl StoreFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        StoreFamilies {
            checkpoint_duration: histogram(
                r,
                "agentq_checkpoint_duration_seconds",
                "Time to commit one checkpoint.",
                CHECKPOINT_BUCKETS,
            ),
            checkpoint_batch_size: histogram(
                r,
                "agentq_checkpoint_batch_size",
                "Checkpoints committed together by one group commit.",
                BATCH_BUCKETS,
            ),
            claim_batch_size: histogram(
                r,
                "agentq_claim_batch_size",
                "Claims sent to the store together by one group claim (a claim that found a slot free goes alone).",
                BATCH_BUCKETS,
            ),
            iteration_overhead: histogram(
                r,
                "agentq_iteration_overhead_seconds",
                "The loop's own time per iteration, outside the LLM and the tools (checkpoints, events, bookkeeping).",
                CHECKPOINT_BUCKETS,
            ),
            events_dropped: counter_vec(
                r,
                "agentq_events_dropped_total",
                "Session events a worker dropped instead of streaming them, because its event writer was behind (Redis slow or down); deltas go first.",
                &["kind"],
            ),
        }
    }
}

/// The queues' streams, per queue.
pub(super) struct QueueFamilies {
    pub queue_length: IntGaugeVec,
    pub queue_pending: IntGaugeVec,
    pub queue_lag: IntGaugeVec,
}

impl QueueFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        QueueFamilies {
            queue_length: gauge_vec(
                r,
                "agentq_queue_length",
                "Entries waiting in the queue: not yet delivered plus delivered and not \
                 acknowledged (lag + pending; the stream's length when the lag is unknown).",
                &["queue"],
            ),
            queue_pending: gauge_vec(
                r,
                "agentq_queue_pending",
                "Entries delivered to workers and not acknowledged.",
                &["queue"],
            ),
            queue_lag: gauge_vec(
                r,
                "agentq_queue_lag",
                "Entries not yet delivered to any worker.",
                &["queue"],
            ),
        }
    }
}

/// Webhook deliveries (the scheduler's delivery loop).
pub(super) struct WebhookFamilies {
    pub webhook_attempts: IntCounterVec,
    pub webhook_endpoints_disabled: IntCounter,
}

impl WebhookFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        let disabled = IntCounter::new(
            "agentq_webhook_endpoints_disabled_total",
            "Webhook endpoints disabled after failing continuously for webhooks.disable_after_secs.",
        )
        .unwrap_or_else(|e| panic!("defining a metric: {e}"));
        register(r, Box::new(disabled.clone()));
        WebhookFamilies {
            webhook_attempts: counter_vec(
                r,
                "agentq_webhook_attempts_total",
                "Webhook delivery attempts by outcome: delivered (2xx), failed (retried later) \
                 or dead (failed, out of retries: a dead letter).",
                &["outcome"],
            ),
            webhook_endpoints_disabled: disabled,
        }
    }
}

/// Retention (the scheduler's pass over finished trees).
pub(super) struct RetentionFamilies {
    pub retention_trees: IntCounterVec,
    pub retention_sessions: IntCounterVec,
    pub retention_messages: IntCounter,
    pub retention_blob_bytes: IntCounter,
}

impl RetentionFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        RetentionFamilies {
            retention_trees: counter_vec(
                r,
                "agentq_retention_trees_total",
                "Finished session trees retention took, by what it kept of them (none: deleted; \
                 result: rows and answers kept, transcripts dropped).",
                &["keep"],
            ),
            retention_sessions: counter_vec(
                r,
                "agentq_retention_sessions_total",
                "Sessions retention took, by what it kept of them.",
                &["keep"],
            ),
            retention_messages: counter(
                r,
                "agentq_retention_messages_deleted_total",
                "Transcript messages retention deleted.",
            ),
            retention_blob_bytes: counter(
                r,
                "agentq_retention_blob_bytes_released_total",
                "Bytes of workspace contents that only the trees retention took held (then \
                 deleted by the workspace collector).",
            ),
        }
    }
}

/// What tenants spent, in tokens and dollars.
pub(super) struct TenantFamilies {
    pub tenant_tokens: IntCounterVec,
    pub tenant_web_searches: IntCounterVec,
    pub tenant_cost_usd: CounterVec,
    pub tenant_settlements_retried: IntCounterVec,
}

impl TenantFamilies {
    pub(super) fn register(r: &Registry) -> Self {
        TenantFamilies {
            tenant_tokens: counter_vec(
                r,
                "agentq_tenant_tokens_total",
                "Tokens spent by LLM calls per tenant, by kind (input, output, cache_read, cache_write).",
                &["tenant", "kind"],
            ),
            tenant_web_searches: counter_vec(
                r,
                "agentq_tenant_web_searches_total",
                "Web searches LLM providers ran for a tenant's calls (in agentq_tenant_cost_usd_total at their price).",
                &["tenant"],
            ),
            tenant_cost_usd: {
                let c = CounterVec::new(
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
            tenant_settlements_retried: counter_vec(
                r,
                "agentq_tenant_settlements_retried_total",
                "Settlements of a call's hold on its tenant's budgets tried again after the store failed them, by outcome: settled (on a later try), already (the failed try had committed), lost (given up when the hold expired or the worker stopped: the spend is not in the tenant's budget).",
                &["outcome"],
            ),
        }
    }
}

/// `agentq_build_info`, set to 1 for this build's version.
pub(super) fn build_info(r: &Registry) -> IntGaugeVec {
    let g = gauge_vec(
        r,
        "agentq_build_info",
        "Build information; the value is always 1.",
        &["version"],
    );
    g.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    g
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

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).unwrap_or_else(|e| panic!("metric: {e}"));
    register(r, Box::new(g.clone()));
    g
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
    // unit test of `Metrics`, never by input.
    if let Err(e) = r.register(c) {
        panic!("registering a metric: {e}");
    }
}
