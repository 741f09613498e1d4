//! agentq-scheduler: the front door of the distributed deployment. It owns the HTTP API
//! (`/v1/sessions…`, `/healthz`, `/readyz`: [`router`]; its bodies are the types of
//! `agentq-api`), enqueueing (insert the row, then `XADD`), the consumer groups of the
//! configured queues (created at start so KEDA's lag scaler sees them before the first
//! session) and the sweeper that repairs a crash between insert and `XADD` ([`sweeper`]),
//! the session event streams over SSE ([`events`]), API keys checked on every route
//! (`http::auth`) and `/metrics` on a listener of its own ([`metrics`]). It holds
//! no state of its own: Postgres is the truth, Redis carries the work, so any number of
//! schedulers can run side by side.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use agentq_core::config::{SchedulerSection, SchedulingSection, Settings};
use agentq_core::policy::Policy;
use agentq_core::{Queue, QueueStore, Store};

pub mod dispatch;
pub mod error;
pub mod events;
mod http;
mod inputs;
pub mod metrics;
pub mod request;
mod routes;
pub mod serve;
pub mod sweeper;
pub mod workspace_gc;

pub use error::ApiError;
pub use events::StreamLimits;
pub use http::auth::{Access, AuthSettings, is_loopback_host};
pub use routes::{metrics_router, route_table, router};
pub use serve::{ServeLimits, serve};

/// Body limit of `POST /v1/sessions/batch` (10,000 sessions of about 3 KiB each). A
/// batch takes about four times its body while it is created (the body, the requests,
/// the statement's arguments and the rows it answers), so this bounds one batch to about
/// 128 MiB of the scheduler's memory.
pub const BATCH_BODY_LIMIT: usize = 32 * 1024 * 1024;
/// The most bytes of sessions (their prompts, systems, results and errors) one page of
/// `GET /v1/sessions` holds: past it the page ends early, with a cursor to the rest, so a
/// listing costs a bounded amount of memory however large the sessions are.
pub const LIST_MAX_BYTES: usize = 16 * 1024 * 1024;

/// The scheduler's knobs (from `[scheduler]` of the configuration).
#[derive(Debug, Clone)]
pub struct SchedulerSettings {
    pub sweep_interval: Duration,
    pub sweep_age: Duration,
    pub max_prompt_bytes: usize,
    pub max_batch: usize,
    /// Queues whose consumer group is created at start.
    pub queues: Vec<String>,
    /// Most queues there may be (configured and admin-created).
    pub max_queues: usize,
    /// Length past which the sweeper trims a queue stream's acked history.
    pub stream_max_len: u64,
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
    /// How the dispatcher shares the queues (`[scheduling]`).
    pub scheduling: SchedulingSection,
    /// Prices per model (`[[prices]]`): the cost fields of the API.
    pub prices: Arc<agentq_core::budget::Prices>,
    /// Tenant budgets as configured (`[[budgets]]`); stored ones replace a tenant's.
    pub budgets: Vec<agentq_core::budget::TenantBudget>,
    /// The fleet's rate limits as configured, and the Redis their state is kept in
    /// (`GET /v1/admin/limits`).
    pub limits: LimitsAdmin,
}

/// What the limiter's admin view reads.
#[derive(Debug, Clone, Default)]
pub struct LimitsAdmin {
    pub configured: Vec<agentq_core::config::LimitSettings>,
    /// `None`: no Redis, so no fleet-wide limiter.
    pub redis_url: Option<String>,
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
            },
            scheduling: s.scheduling.clone(),
            workspace: s.workspace.clone(),
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
            queues: c.queues.clone(),
            max_queues: c.max_queues,
            stream_max_len: c.stream_max_len,
            policy: Arc::new(Policy::default()),
            limits: LimitsAdmin::default(),
            workspace: agentq_core::config::WorkspaceSection::default(),
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
        }
    }
}

/// The queues sessions may name, and those whose stream and consumer group are known to
/// exist (so each is created once per process rather than on every request). A queue is
/// known when it is configured or an admin created it (stored, so every scheduler learns
/// it); callers cannot invent queues, each of which is a Redis stream and a metrics label
/// value. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct QueueRegistry {
    configured: Arc<Vec<String>>,
    /// Admin-created queues learned from the store.
    created: Arc<Mutex<HashSet<String>>>,
    ensured: Arc<Mutex<HashSet<String>>>,
}

impl QueueRegistry {
    pub fn new(configured: Vec<String>) -> Self {
        QueueRegistry {
            configured: Arc::new(configured),
            created: Arc::default(),
            ensured: Arc::default(),
        }
    }

    pub fn is_configured(&self, name: &str) -> bool {
        self.configured.iter().any(|q| q == name)
    }

    /// Remember an admin-created queue.
    pub fn learn(&self, name: &str) {
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
    }

    /// How many queues may be stored when at most `max_queues` may exist in all.
    pub fn room_for_created(&self, max_queues: usize) -> usize {
        max_queues.saturating_sub(self.configured.len())
    }

    /// Every known queue, configured ones first (asks the store for created ones).
    pub async fn known(&self, store: &dyn QueueStore) -> agentq_core::Result<Vec<String>> {
        let mut names: Vec<String> = self.configured.to_vec();
        for q in store.stored_queues().await? {
            self.learn(&q);
            if !names.contains(&q) {
                names.push(q);
            }
        }
        Ok(names)
    }

    /// A 422 naming `field` unless sessions may name `queue`. A queue this process has not
    /// seen is looked up in the store (another scheduler may have created it).
    pub async fn check_known(
        &self,
        store: &dyn QueueStore,
        queue: &str,
        field: &str,
    ) -> Result<(), ApiError> {
        let learned = || {
            self.created
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(queue)
        };
        if self.is_configured(queue) || learned() {
            return Ok(());
        }
        self.known(store).await?;
        if learned() {
            return Ok(());
        }
        Err(ApiError::invalid(
            field,
            format!(
                "unknown queue {queue:?}: name a configured queue or one an admin created \
                 (POST /v1/queues)"
            ),
        ))
    }

    fn is_ensured(&self, name: &str) -> bool {
        self.ensured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Create the queue's group unless done already. A failure is logged and not
    /// remembered: the next call tries again (and `enqueue` creates a missing group too).
    pub async fn ensure(&self, queue: &dyn Queue, name: &str) -> bool {
        if self.is_ensured(name) {
            return true;
        }
        match queue.ensure_queue(name).await {
            Ok(()) => {
                self.ensured
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.to_string());
                true
            }
            Err(e) => {
                tracing::warn!(queue = name, error = %e, "cannot create the consumer group yet");
                false
            }
        }
    }

    /// Configured queues, admin-created ones this process learned, and those it created
    /// a group for since (the sweeper's, for sessions stored before queues were checked).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.configured.iter().cloned().collect();
        for set in [&self.created, &self.ensured] {
            for n in set.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
        names
    }

    /// Ensure every configured queue; true when all exist.
    pub async fn ensure_configured(&self, queue: &dyn Queue) -> bool {
        let mut all = true;
        for name in self.configured.iter() {
            all &= self.ensure(queue, name).await;
        }
        all
    }
}

/// Shared state of the HTTP handlers. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub cfg: SchedulerSettings,
    queues: QueueRegistry,
    /// Cancelled when shutdown begins: `/readyz` then answers 503.
    draining: CancellationToken,
    /// The readers that fan live events out to the event streams.
    hub: events::Hub,
    /// The open event streams, against their caps.
    streams: events::StreamCaps,
    /// The bytes of batch bodies being read and decoded, against `batch_decode_bytes`.
    decoding: http::decode::DecodeBudget,
    /// Which new sessions wait in the store for the dispatcher.
    dispatch: dispatch::Dispatch,
}

impl Scheduler {
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, cfg: SchedulerSettings) -> Self {
        let queues = QueueRegistry::new(cfg.queues.clone());
        let streams = events::StreamCaps::new(cfg.streams);
        let dispatch = dispatch::Dispatch::new(cfg.scheduling.clone());
        let decoding = http::decode::DecodeBudget::new(cfg.batch_decode_bytes);
        Scheduler {
            decoding,
            store,
            queue,
            cfg,
            queues,
            dispatch,
            draining: CancellationToken::new(),
            hub: events::Hub::default(),
            streams,
        }
    }

    /// Use `token` as the draining signal (shared with the server's shutdown).
    pub fn with_shutdown(mut self, token: CancellationToken) -> Self {
        self.draining = token;
        self
    }

    /// Make `/readyz` answer 503 from now on (load balancers stop sending traffic).
    pub fn begin_drain(&self) {
        self.draining.cancel();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    pub fn queues(&self) -> &QueueRegistry {
        &self.queues
    }

    pub fn dispatch(&self) -> &dispatch::Dispatch {
        &self.dispatch
    }

    /// Body limit of `POST /v1/sessions`: room for a prompt and a system prompt at their
    /// limit, plus metadata and escaping, and for files at the largest policy's bound,
    /// base64-encoded (or escaped text); the handler reports an oversize prompt or file
    /// by name before this limit is reached.
    pub(crate) fn single_body_limit(&self) -> usize {
        let files_room = usize::try_from(self.cfg.policy.max_input_bytes())
            .unwrap_or(usize::MAX)
            .saturating_mul(2);
        self.cfg
            .max_prompt_bytes
            .saturating_mul(2)
            .saturating_add(1024 * 1024)
            .saturating_add(files_room)
    }

    /// Body limit of `POST /v1/sessions/batch`: [`BATCH_BODY_LIMIT`], or one session's if
    /// that is more.
    pub(crate) fn batch_body_limit(&self) -> usize {
        BATCH_BODY_LIMIT.max(self.single_body_limit())
    }

    /// Run the dispatcher for this scheduler until `cancel` (as [`run`] does); until it
    /// starts, and after it stops, every new session is enqueued at once.
    pub fn spawn_dispatcher(&self, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        // Before the first request is served: from now on sessions may be held.
        self.dispatch.mark_running();
        tokio::spawn(dispatch::run_dispatcher(
            self.store.clone(),
            self.queue.clone(),
            self.queues.clone(),
            self.dispatch.clone(),
            cancel,
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("HTTP server: {0}")]
    Io(#[from] std::io::Error),
}

/// Run the scheduler until `shutdown` is cancelled: create the configured queues' consumer
/// groups, serve the API on `listener` (graceful: in-flight requests finish, `/readyz`
/// turns 503 at once) and `/metrics` on `metrics` (a listener of its own: the scraper
/// holds no API key), and run the sweeper and the dispatcher.
pub async fn run(
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    cfg: SchedulerSettings,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let state =
        Scheduler::new(store.clone(), queue.clone(), cfg.clone()).with_shutdown(shutdown.clone());
    // Not fatal when Redis is briefly away: the sweeper retries every tick.
    if !state.queues.ensure_configured(queue.as_ref()).await {
        tracing::warn!("some consumer groups could not be created yet; will retry");
    }

    // A child token: the sweeper also stops when the server ends on its own, without
    // cancelling the caller's token.
    let stop_sweeper = shutdown.child_token();
    let workspace_gc = tokio::spawn(workspace_gc::run_workspace_gc(
        store.clone(),
        cfg.workspace.clone(),
        stop_sweeper.clone(),
    ));
    let sweeper = tokio::spawn(sweeper::run_sweeper(
        store,
        queue,
        state.queues.clone(),
        cfg.sweep_interval,
        cfg.sweep_age,
        cfg.stream_max_len,
        stop_sweeper.clone(),
    ));
    let dispatcher = state.spawn_dispatcher(stop_sweeper.clone());

    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "scheduler listening");
    }
    let metrics_server = metrics.map(|m| {
        if let Ok(addr) = m.local_addr() {
            tracing::info!(%addr, "serving /metrics");
        }
        let token = shutdown.clone();
        let app = metrics_router(state.clone());
        tokio::spawn(async move {
            let served = axum::serve(m, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the /metrics server stopped");
            }
        })
    });
    let app = router(state);
    let served = serve(listener, app, cfg.serve, shutdown.clone()).await;
    stop_sweeper.cancel();
    if let Some(m) = metrics_server {
        m.abort();
    }
    if let Err(e) = sweeper.await {
        tracing::error!(error = %e, "sweeper task failed");
    }
    if let Err(e) = dispatcher.await {
        tracing::error!(error = %e, "dispatcher task failed");
    }
    if let Err(e) = workspace_gc.await {
        tracing::error!(error = %e, "workspace collector task failed");
    }
    served?;
    tracing::info!("scheduler stopped");
    Ok(())
}
