//! agentq-worker: takes session entries off the queue, leases the session in the store,
//! runs the agent loop with a fenced checkpointer, and publishes the completion. Owns the
//! worker's background duties too: lease and entry heartbeats, reclaiming entries of dead
//! workers, cancel notifications, and graceful drain on shutdown.
//!
//! Layout: [`config`] (what a worker runs with), `run_loop` (read the queue, hand each
//! delivery to `dispatch`, drain on shutdown), `dispatch` (a slot and a task per
//! delivery; [`Worker::process`] is the same path on the caller's task), `session` (one
//! delivery: claim, run, settle), `heartbeat`, `reclaim`, `listener` (cancel and wake-up
//! signals), `runs` (the sessions running here and what waits for them), `pipeline` (the
//! writers every run hands its checkpoints and events to).

mod admission;
mod budget;
mod checkpoint;
pub mod config;
mod dispatch;
mod group_commit;
mod heartbeat;
mod inbox;
mod listener;
mod observe;
mod pipeline;
mod reclaim;
mod run_loop;
mod runs;
mod session;
pub mod spawn;
pub mod workspace;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use agentq_agent::provider::LlmProvider;
use agentq_agent::provider::factory;
use agentq_core::metrics::Metrics;
use agentq_core::queue::Delivery;
use agentq_core::{Queue, Store};

pub use checkpoint::StoreCheckpointer;
pub use config::{WorkerConfig, default_consumer_name, pool_connections};
pub use group_commit::GroupCommit;
pub use observe::{EVENT_BUFFER, OverheadTap, overhead_tap};
pub use session::Processed;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] agentq_core::Error),
    #[error("configuration error: {0}")]
    Config(String),
}

/// A domain error (settings, policy) is a core error, as it was before the domain had a
/// crate of its own.
impl From<agentq_core::error::DomainError> for Error {
    fn from(e: agentq_core::error::DomainError) -> Self {
        Error::Core(e.into())
    }
}

/// Providers by (the tenant whose own settings built it, or `None` for the shared ones;
/// provider name; the session's base URL).
type ProviderCache = HashMap<(Option<String>, String, Option<String>), Arc<dyn LlmProvider>>;

/// What a worker holds for all its sessions.
pub(crate) struct Inner {
    pub cfg: WorkerConfig,
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub metrics: &'static Metrics,
    pub stats: Stats,
    /// Sessions running here, and entries and signals that wait for them.
    pub runs: runs::Runs,
    /// The writers every run hands its checkpoints and events to.
    pub pipeline: pipeline::Pipeline,
    /// A session runs only with one of these (`cfg.concurrency` of them).
    pub slots: Arc<Semaphore>,
    /// Set on shutdown: runs stop at their next checkpoint.
    pub draining: CancellationToken,
    /// Built on first use and shared by every session.
    shared: Shared,
    /// The tenant budgets stored through the admin API, as last read.
    pub stored_budgets: budget::StoredBudgets,
}

/// What sessions share and nobody needs before the first one: providers (one HTTP
/// connection pool per endpoint) and the workspace root.
#[derive(Default)]
struct Shared {
    providers: Mutex<ProviderCache>,
    /// `cfg.workspace_root`, made and canonicalized by the first session that needs it.
    workspaces: std::sync::OnceLock<std::path::PathBuf>,
}

/// Counters tests and the demo read.
#[derive(Default)]
pub struct Stats {
    pub completed: std::sync::atomic::AtomicU64,
    pub lost_leases: std::sync::atomic::AtomicU64,
    pub resumed: std::sync::atomic::AtomicU64,
    pub dead_lettered: std::sync::atomic::AtomicU64,
}

impl Inner {
    /// The directory session trees' workspaces go in, canonical; made once. A failure is
    /// not remembered: the next session tries again.
    pub(crate) fn workspaces(&self) -> Result<&std::path::Path, String> {
        if let Some(p) = self.shared.workspaces.get() {
            return Ok(p);
        }
        let root = &self.cfg.workspace_root;
        std::fs::create_dir_all(root)
            .and_then(|_| std::fs::canonicalize(root))
            .map(|p| self.shared.workspaces.get_or_init(|| p).as_path())
            .map_err(|e| format!("workspace root {}: {e}", root.display()))
    }

    /// Providers are shared across sessions (one HTTP connection pool per endpoint). The
    /// provider is built from this worker's settings for `tenant` (its own
    /// `[providers.tenants.<name>]` when configured, else the shared `[providers]`); which
    /// key goes to which endpoint is the factory's rule, so a session's `base_url` never
    /// gets a key configured for another endpoint. The cache key holds everything that
    /// changes the credentials: whose settings, the provider and the endpoint.
    pub(crate) fn provider(
        &self,
        tenant: &str,
        name: &str,
        base_url: Option<&str>,
    ) -> agentq_agent::Result<Arc<dyn LlmProvider>> {
        let (owner, settings) = match self.cfg.tenant_providers.get(tenant) {
            Some(own) => (Some(tenant.to_string()), own),
            None => (None, &self.cfg.providers),
        };
        let key = (owner, name.to_string(), base_url.map(str::to_string));
        let mut cache = self
            .shared
            .providers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let p = factory::build(name, base_url, settings)?;
        cache.insert(key, p.clone());
        Ok(p)
    }

    /// Start the checkpoint and event writers unless they run already.
    pub(crate) fn start_pipeline(&self) {
        self.pipeline.start(
            self.store.clone(),
            self.queue.clone(),
            group_commit::Limits {
                max_batch: self.cfg.checkpoint_batch_max,
                in_flight: self.cfg.checkpoint_writers,
            },
        );
    }
}

/// A worker process's engine. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl Worker {
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, cfg: WorkerConfig) -> Self {
        let metrics = agentq_core::metrics::global();
        metrics.label_models(cfg.labelled_models());
        metrics.label_tenants(cfg.labelled_tenants());
        let slots = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
        Worker {
            inner: Arc::new(Inner {
                cfg,
                store,
                queue,
                metrics,
                stats: Stats::default(),
                runs: runs::Runs::new(),
                pipeline: pipeline::Pipeline::new(EVENT_BUFFER, metrics),
                slots,
                draining: CancellationToken::new(),
                shared: Shared::default(),
                stored_budgets: budget::StoredBudgets::default(),
            }),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    pub fn consumer(&self) -> &str {
        &self.inner.cfg.consumer
    }

    /// Events this worker dropped instead of sending to the sessions' event streams,
    /// because its event writer was behind (see [`EVENT_BUFFER`]).
    pub fn events_dropped(&self) -> u64 {
        self.inner.pipeline.events.dropped()
    }

    /// Sessions running right now.
    pub fn active_sessions(&self) -> Vec<String> {
        self.inner.runs.ids()
    }

    /// Run until `shutdown` fires, then drain: running sessions stop at their next
    /// checkpoint (bounded by `drain_timeout`), leases are released and their sessions
    /// re-enqueued so another worker resumes them at once. Once per worker.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<()> {
        run_loop::run(self.inner.clone(), shutdown).await
    }

    /// Process one delivery to its end on the caller's task: the path [`Worker::run`]
    /// gives each delivery it reads (a slot, the claim, the run, settling the entry), so a
    /// test can drive one delivery, or drop the future at an exact point to stand for a
    /// crash. The checkpoint and event writers start with the first call if `run` has not
    /// started them. Without `run`, nothing heartbeats the lease or listens for cancels:
    /// a session longer than the lease TTL loses its lease. After `run` has returned, its
    /// writers are stopped and a session is handed back at its first checkpoint.
    ///
    /// `Err` when the claim itself fails (the store is unreachable); what happened
    /// otherwise is the [`Processed`].
    pub async fn process(&self, delivery: Delivery) -> Result<Processed> {
        self.inner.start_pipeline();
        dispatch::process(&self.inner, delivery).await
    }
}

/// Exponential backoff for reconnect loops: 100 ms doubling to 5 s.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Self {
        Backoff(Duration::from_millis(100))
    }
    pub fn reset(&mut self) {
        self.0 = Duration::from_millis(100);
    }
    pub fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        d
    }
}

async fn retry_forever<F, Fut, T>(stop: &CancellationToken, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = agentq_core::Result<T>>,
{
    let mut backoff = Backoff::new();
    loop {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) => {
                let wait = backoff.next();
                warn!(error = %e, ?wait, "retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => return None,
                }
            }
        }
    }
}
