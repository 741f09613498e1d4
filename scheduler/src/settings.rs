//! The scheduler's runtime settings ([`SchedulerSettings`]), built from `[scheduler]`
//! and the sections it reads besides (`[policy]`, `[[prices]]`, `[[budgets]]`,
//! `[[limits]]`, `[scheduling]`, `[workspace]`, `[webhooks]`, `[schedules]`).

use std::sync::Arc;
use std::time::Duration;

use agentq_core::config::{SchedulerSection, SchedulesSection, SchedulingSection, Settings};
use agentq_core::policy::Policy;

use crate::events::StreamLimits;
use crate::http::auth::AuthSettings;
use crate::serve::ServeLimits;
use crate::webhooks::WebhookSettings;

/// The scheduler's knobs (from `[scheduler]` of the configuration).
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    pub sweep_interval: Duration,
    pub sweep_age: Duration,
    pub max_prompt_bytes: usize,
    pub max_batch: usize,
    /// Items of one JSON Lines upload of `POST /v1/batches`.
    pub max_batch_items: usize,
    /// Queues whose consumer group is created at start.
    pub queues: Vec<String>,
    /// Most queues there may be (configured and admin-created).
    pub max_queues: usize,
    /// Length past which the sweeper trims a queue stream's acked history.
    pub stream_max_len: u64,
    /// How long a finished session's event stream is kept (`worker.event_ttl_secs`): set
    /// on the sessions cancelled here before a worker runs them, and on those the sweeper
    /// settles in a dead worker's place.
    pub event_ttl: Duration,
    /// Who may call the API (the admin key is not part of the configuration file: the
    /// process reads it from `AGENTQ_ADMIN_KEY`).
    pub auth: AuthSettings,
    /// The operator's policy (`[policy]`), held to every session request.
    pub policy: Arc<Policy>,
    /// Open event streams at most (in all, per tenant, per key).
    pub streams: StreamLimits,
    /// Connections and read timeouts of the API's listener.
    pub serve: ServeLimits,
    /// Bytes of batch bodies read and decoded at once, across requests (a tenant's at
    /// most half of them).
    pub batch_decode_bytes: usize,
    /// Retention of durable workspaces (`[workspace]`).
    pub workspace: agentq_core::config::WorkspaceSection,
    /// Retention of finished session trees (`[retention]`).
    pub retention: agentq_core::config::RetentionSection,
    /// How the dispatcher shares the queues (`[scheduling]`).
    pub scheduling: SchedulingSection,
    /// Prices per model (`[[prices]]`): the cost fields of the API.
    pub prices: Arc<agentq_core::budget::Prices>,
    /// Tenant budgets as configured (`[[budgets]]`); stored ones replace a tenant's.
    pub budgets: Vec<agentq_core::budget::TenantBudget>,
    /// The fleet's rate limits as configured, and the Redis their state is kept in
    /// (`GET /v1/admin/limits`).
    pub limits: LimitsAdmin,
    /// Webhook deliveries (`[webhooks]` and the operator's key).
    pub webhooks: WebhookSettings,
    /// The schedules' fire loop (`[schedules]`).
    pub schedules: FireSettings,
}

/// What the limiter's admin view reads.
#[derive(Debug, Clone, Default)]
pub struct LimitsAdmin {
    pub configured: Vec<agentq_core::config::LimitSettings>,
    /// `None`: no Redis, so no fleet-wide limiter.
    pub redis_url: Option<String>,
    /// `redis_url` names a Redis Cluster's seed nodes.
    pub redis_cluster: bool,
}

impl SchedulerSettings {
    /// `[scheduler]` and `[policy]` of validated settings.
    pub fn from_settings(s: &Settings) -> agentq_core::Result<Self> {
        Ok(SchedulerSettings {
            policy: Arc::new(Policy::from_section(&s.policy)?),
            prices: Arc::new(agentq_core::budget::Prices::new(&s.prices)?),
            budgets: s.budgets.iter().map(|b| b.budget()).collect(),
            limits: LimitsAdmin {
                configured: s.limits.clone(),
                redis_url: s.redis_url.clone(),
                redis_cluster: s.redis.cluster,
            },
            scheduling: s.scheduling.clone(),
            workspace: s.workspace.clone(),
            retention: s.retention.clone(),
            webhooks: WebhookSettings::from_section(&s.webhooks)?,
            schedules: FireSettings::from(&s.schedules),
            event_ttl: s.worker.event_ttl_secs.duration(),
            ..(&s.scheduler).into()
        })
    }
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        (&SchedulerSection::default()).into()
    }
}

impl From<&SchedulerSection> for SchedulerSettings {
    fn from(c: &SchedulerSection) -> Self {
        SchedulerSettings {
            sweep_interval: Duration::from_secs(c.sweep_interval_secs),
            sweep_age: Duration::from_secs(c.sweep_age_secs),
            max_prompt_bytes: c.max_prompt_bytes,
            max_batch: c.max_batch,
            max_batch_items: c.max_batch_items,
            queues: c.queues.clone(),
            max_queues: c.max_queues,
            stream_max_len: c.stream_max_len,
            event_ttl: agentq_core::config::WorkerSection::default()
                .event_ttl_secs
                .duration(),
            policy: Arc::new(Policy::default()),
            limits: LimitsAdmin::default(),
            workspace: agentq_core::config::WorkspaceSection::default(),
            retention: agentq_core::config::RetentionSection::default(),
            auth: AuthSettings {
                cache_ttl: Duration::from_secs(c.key_cache_secs),
                ..AuthSettings::default()
            },
            streams: StreamLimits {
                total: c.max_event_streams,
                per_tenant: c.max_event_streams_per_tenant,
                per_key: c.max_event_streams_per_key,
            },
            serve: ServeLimits {
                max_connections: c.max_connections,
                max_connections_per_key: c.max_connections_per_key,
                max_connections_per_peer: c.max_connections_per_peer,
                header_read_timeout: Duration::from_secs(c.header_read_timeout_secs),
                body_read_timeout: Duration::from_secs(c.body_read_timeout_secs),
                write_timeout: Duration::from_secs(c.write_timeout_secs),
            },
            batch_decode_bytes: c.batch_decode_bytes,
            prices: Arc::default(),
            budgets: Vec::new(),
            scheduling: SchedulingSection::default(),
            webhooks: WebhookSettings::default(),
            schedules: FireSettings::default(),
        }
    }
}

/// How the fire loop polls and leases (`[schedules]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FireSettings {
    /// The pause between two passes.
    pub poll: Duration,
    /// How long a claim holds a schedule: past it, another claimer may take it over.
    pub lease: Duration,
}

impl Default for FireSettings {
    fn default() -> Self {
        FireSettings::from(&SchedulesSection::default())
    }
}

impl From<&SchedulesSection> for FireSettings {
    fn from(s: &SchedulesSection) -> Self {
        FireSettings {
            poll: Duration::from_secs(s.poll_secs),
            lease: Duration::from_secs(s.lease_secs),
        }
    }
}
