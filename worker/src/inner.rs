//! What a worker holds for all its sessions ([`Inner`]): its settings, store and queue,
//! the runs in progress, the writers they hand their checkpoints and events to, the slots
//! that bound them, and what sessions share once built (providers, the workspace root).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use agentq_agent::provider::LlmProvider;
use agentq_agent::provider::factory;
use agentq_agent::tools::{ToolRegistry, builtin_registry};
use agentq_core::metrics::Metrics;
use agentq_core::{Queue, Store};
use agentq_mcp::McpServers;

use crate::config::WorkerSettings;
use crate::group_claim::{ClaimTerms, GroupClaim};
use crate::group_commit;
use crate::observe::EVENT_BUFFER;
use crate::pipeline::Pipeline;
use crate::runs::Runs;
use crate::settlements::Settlements;
use crate::stored_budgets::StoredBudgets;

/// Providers by (the tenant whose own settings built it, or `None` for the shared ones;
/// provider name; the session's base URL).
type ProviderCache = HashMap<(Option<String>, String, Option<String>), Arc<dyn LlmProvider>>;

/// What a worker holds for all its sessions.
pub(crate) struct Inner {
    pub cfg: WorkerSettings,
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub metrics: &'static Metrics,
    pub stats: Stats,
    /// Sessions running here, and entries and signals that wait for them.
    pub runs: Runs,
    /// The writers every run hands its checkpoints and events to.
    pub pipeline: Pipeline,
    /// Every delivery's claim goes through it.
    pub claims: GroupClaim,
    /// A session runs only with one of these (`cfg.concurrency` of them).
    pub slots: Arc<Semaphore>,
    /// Set on shutdown: runs stop at their next checkpoint.
    pub draining: CancellationToken,
    /// Built on first use and shared by every session.
    shared: Shared,
    /// The tenant budgets stored through the admin API, as last read.
    pub stored_budgets: StoredBudgets,
    /// The MCP servers of `cfg.mcp_servers`, started with the worker's run (or the first
    /// session processed without one).
    mcp: std::sync::OnceLock<McpServers>,
    /// Stops the MCP servers once the worker has drained.
    pub mcp_stop: CancellationToken,
    /// Settlements of tenant holds the store failed, to try again.
    pub settlements: Settlements,
}

/// What sessions share and nobody needs before the first one: providers (one HTTP
/// connection pool per endpoint), the tools sessions choose from, and the workspace root.
#[derive(Default)]
struct Shared {
    providers: Mutex<ProviderCache>,
    /// The built-in tools (as `cfg.tool_settings` allows) and `cfg.tools`: the same for
    /// every session, so built once instead of per session.
    tools: std::sync::OnceLock<ToolRegistry>,
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
    pub(crate) fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, cfg: WorkerSettings) -> Self {
        let metrics = agentq_core::metrics::global();
        metrics.label_models(cfg.labelled_models());
        metrics.label_tenants(cfg.labelled_tenants());
        metrics.label_mcp_servers(cfg.mcp_servers.iter().map(|s| s.name.clone()));
        let slots = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
        let terms = ClaimTerms {
            owner: cfg.consumer.clone(),
            ttl: cfg.lease_ttl,
            max_attempts: cfg.max_attempts,
        };
        let claims = GroupClaim::new(terms, metrics);
        Inner {
            cfg,
            store,
            queue,
            metrics,
            stats: Stats::default(),
            runs: Runs::new(),
            pipeline: Pipeline::new(EVENT_BUFFER, metrics),
            claims,
            slots,
            draining: CancellationToken::new(),
            shared: Shared::default(),
            stored_budgets: StoredBudgets::default(),
            mcp: std::sync::OnceLock::new(),
            mcp_stop: CancellationToken::new(),
            settlements: Settlements::new(),
        }
    }

    /// The tools a session chooses its own from (MCP tools and `spawn` aside).
    pub(crate) fn tools(&self) -> &ToolRegistry {
        self.shared.tools.get_or_init(|| {
            let mut all = builtin_registry(&self.cfg.tool_settings);
            all.extend(&self.cfg.tools);
            all
        })
    }

    /// The MCP servers, started on first use (they need the runtime, which `new` may not
    /// have).
    pub(crate) fn mcp(&self) -> &McpServers {
        self.mcp.get_or_init(|| {
            McpServers::start(
                &self.cfg.mcp_servers,
                &self.cfg.tool_settings,
                &self.cfg.consumer,
                &self.mcp_stop,
            )
        })
    }

    /// Stop the MCP servers (if started) and wait, within `bound`, until they are.
    pub(crate) async fn stop_mcp(&self, bound: std::time::Duration) {
        self.mcp_stop.cancel();
        if let Some(m) = self.mcp.get()
            && tokio::time::timeout(bound, m.stopped()).await.is_err()
        {
            tracing::warn!("MCP servers still closing after {bound:?}; their processes are killed");
        }
    }

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
            self.cfg.event_ttl,
        );
    }
}
