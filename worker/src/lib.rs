//! agentq-worker: takes session entries off the queue, leases the session in the store,
//! runs the agent loop with a fenced checkpointer, and publishes the completion. Owns the
//! worker's background duties too: lease and entry heartbeats, reclaiming entries of dead
//! workers, cancel notifications, and graceful drain on shutdown.

mod checkpoint;
mod group_commit;
mod inbox;
mod observe;
mod session;
pub mod spawn;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use agentq_agent::provider::LlmProvider;
use agentq_agent::provider::factory::{self, ProviderSettings};
use agentq_agent::tools::ToolSettings;
use agentq_core::metrics::Metrics;
use agentq_core::protocol::WorkerSignal;
use agentq_core::queue::{Delivery, EventRecord};
use agentq_core::{Lease, Queue, Store};

pub use checkpoint::StoreCheckpointer;
pub use group_commit::GroupCommit;
pub use observe::{OverheadTap, overhead_tap};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Core(#[from] agentq_core::Error),
    #[error("configuration error: {0}")]
    Config(String),
}

/// Everything a worker process is configured with.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Consumer name in the group; unique per process.
    pub consumer: String,
    pub queues: Vec<String>,
    /// Sessions run at once.
    pub concurrency: usize,
    pub lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    /// Entries idle this long belong to a dead worker. A few heartbeats.
    pub reclaim_min_idle: Duration,
    pub reclaim_interval: Duration,
    /// Claims without finishing before the entry is dead-lettered.
    pub max_attempts: u32,
    /// How long running sessions get to reach a checkpoint on shutdown.
    pub drain_timeout: Duration,
    /// How long one XREADGROUP blocks.
    pub read_block: Duration,
    /// Per-tree workspaces live under here.
    pub workspace_root: PathBuf,
    pub default_provider: String,
    pub default_model: Option<String>,
    /// Tools a session gets when it names none.
    pub default_tools: Vec<String>,
    pub providers: ProviderSettings,
    pub tool_settings: ToolSettings,
    pub sensitive_tools: Vec<String>,
    /// How long a finished session's event stream is kept.
    pub event_ttl: Duration,
    /// Deepest sub-agent nesting (a root session is depth 0).
    pub max_depth: u32,
    /// Most sub-agents one session may start.
    pub max_children: usize,
    /// Group commit: most checkpoints in one commit.
    pub checkpoint_batch_max: usize,
    /// Group commit: commits in flight at once, each on its own store connection.
    pub checkpoint_writers: usize,
    /// See [`agentq_agent::driver::Agent::write_ahead_grace`].
    pub write_ahead_grace: Duration,
    /// The embedding program's own tools, offered beside the built-in ones: a session
    /// names them in its `tools` like any other, and one with a built-in's name replaces
    /// the built-in. Declare each one's [`agentq_agent::tools::SideEffect`] truthfully:
    /// resumes and the write-ahead rule depend on it.
    pub tools: agentq_agent::tools::ToolRegistry,
}

impl WorkerConfig {
    /// Store connections for everything but checkpoints and heartbeats: a quarter of the
    /// sessions run at once (claims, reads and inbox writes are short), 4 to 64.
    pub fn pool_connections(&self) -> u32 {
        pool_connections(self.concurrency)
    }

    /// Store connections the worker's checkpoints and heartbeats need to themselves: the
    /// group commit's commits in flight, and one for the heartbeat.
    pub fn writer_connections(&self) -> u32 {
        u32::try_from(self.checkpoint_writers.max(1))
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }
}

/// [`WorkerConfig::pool_connections`] for a worker running `concurrency` sessions at once.
pub fn pool_connections(concurrency: usize) -> u32 {
    u32::try_from(concurrency / 4)
        .unwrap_or(u32::MAX)
        .clamp(4, 64)
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            consumer: default_consumer_name(),
            queues: vec!["default".into()],
            concurrency: 256,
            lease_ttl: Duration::from_secs(6),
            heartbeat_interval: Duration::from_secs(2),
            reclaim_min_idle: Duration::from_secs(6),
            reclaim_interval: Duration::from_secs(2),
            max_attempts: 5,
            drain_timeout: Duration::from_secs(30),
            read_block: Duration::from_secs(2),
            workspace_root: PathBuf::from("./agentq-workspaces"),
            default_provider: "scripted".into(),
            default_model: None,
            default_tools: agentq_agent::tools::READ_ONLY_TOOLS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            providers: ProviderSettings::from_env(),
            tool_settings: ToolSettings::default(),
            sensitive_tools: Vec::new(),
            event_ttl: Duration::from_secs(24 * 3600),
            max_depth: 3,
            max_children: 16,
            checkpoint_batch_max: 256,
            checkpoint_writers: 2,
            write_ahead_grace: agentq_agent::driver::DEFAULT_WRITE_AHEAD_GRACE,
            tools: agentq_agent::tools::ToolRegistry::new(),
        }
    }
}

/// `host-pid-random`: distinct for every process, so a restarted worker never inherits
/// the pending entries of its previous life (the reclaimer hands those out).
pub fn default_consumer_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &rand[..8])
}

/// Providers by (name, base URL).
type ProviderCache = HashMap<(String, Option<String>), Arc<dyn LlmProvider>>;

/// A session this worker is running.
pub(crate) struct Active {
    pub lease: Lease,
    pub queue: String,
    pub entry_id: String,
    /// The user asked to cancel: the run ends `interrupted`.
    pub cancel: CancellationToken,
    /// The lease is gone: drop the run without writing anything.
    pub abort: CancellationToken,
    pub inbox: Arc<inbox::SessionInbox>,
    pub interrupter: Arc<agentq_agent::driver::Interrupter>,
    /// The run returned and its entry is being settled: its lease may be gone by design
    /// (a final checkpoint or a suspension gives it up), so no heartbeat.
    pub settling: Arc<std::sync::atomic::AtomicBool>,
}

/// How long a wake-up for a session not running here is remembered (see
/// [`Inner::register`]).
const MISSED_WAKE_RETENTION: Duration = Duration::from_secs(30);
/// Records are pruned by age once there are this many, at most once a second.
const MISSED_WAKES_PRUNE_AT: usize = 4096;
/// More records than this (a storm of wake-ups) are dropped all at once; runs whose claim
/// came before that then read their inboxes anyway.
const MISSED_WAKES_MAX: usize = 200_000;

/// Wake-ups for sessions that had no run here when they came (see [`Inner::register`]).
struct MissedWakes {
    at: HashMap<String, std::time::Instant>,
    pruned_at: std::time::Instant,
    cleared_at: Option<std::time::Instant>,
}

impl Default for MissedWakes {
    fn default() -> Self {
        MissedWakes {
            at: HashMap::new(),
            pruned_at: std::time::Instant::now(),
            cleared_at: None,
        }
    }
}

impl MissedWakes {
    fn note(&mut self, session_id: &str) {
        let now = std::time::Instant::now();
        if self.at.len() >= MISSED_WAKES_PRUNE_AT
            && now.duration_since(self.pruned_at) >= Duration::from_secs(1)
        {
            self.at
                .retain(|_, at| now.duration_since(*at) < MISSED_WAKE_RETENTION);
            self.pruned_at = now;
        }
        if self.at.len() >= MISSED_WAKES_MAX {
            self.at.clear();
            self.cleared_at = Some(now);
        }
        self.at.insert(session_id.to_string(), now);
    }

    /// Whether a wake-up for `session_id` may have come since `since`.
    fn take(&mut self, session_id: &str, since: std::time::Instant) -> bool {
        let noted = self.at.remove(session_id).is_some();
        // Pruning keeps every record younger than the retention, so a run that registers
        // within half of it after its claim finds any that came meanwhile.
        noted
            || self.cleared_at.is_some_and(|c| c >= since)
            || since.elapsed() >= MISSED_WAKE_RETENTION / 2
    }
}

pub(crate) struct Inner {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub cfg: WorkerConfig,
    pub active: Mutex<HashMap<String, Active>>,
    /// Set on shutdown: runs stop at their next checkpoint.
    pub draining: CancellationToken,
    providers: Mutex<ProviderCache>,
    pub stats: Stats,
    pub metrics: &'static Metrics,
    pub events: tokio::sync::mpsc::UnboundedSender<EventRecord>,
    events_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<EventRecord>>>,
    /// Entries of a session that arrived while this worker was still running or settling
    /// it: dispatched once it is done (acking them could lose a wake-up).
    deferred: Mutex<HashMap<String, Vec<Delivery>>>,
    /// Wake-ups for sessions that were not running here when they came: one of them may
    /// be a session between its claim and its registration in `active`, which must not
    /// miss it (see [`Inner::register`]).
    missed_wakes: Mutex<MissedWakes>,
    redispatch: tokio::sync::mpsc::UnboundedSender<Delivery>,
    redispatch_rx: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Delivery>>>,
    /// Every session's checkpoints go through the worker's group commit.
    pub commits: GroupCommit,
    commits_rx: Mutex<Option<group_commit::JobReceiver>>,
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
        if let Some(p) = self.workspaces.get() {
            return Ok(p);
        }
        let root = &self.cfg.workspace_root;
        std::fs::create_dir_all(root)
            .and_then(|_| std::fs::canonicalize(root))
            .map(|p| self.workspaces.get_or_init(|| p).as_path())
            .map_err(|e| format!("workspace root {}: {e}", root.display()))
    }

    pub(crate) fn active_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Active>> {
        self.active.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make a claimed session's run reachable by signals. Returns whether a wake-up may
    /// have come for it since its claim (`claimed_at`) and before now, when no run of it was
    /// registered to take it: the run must then read its inbox although the claimed row
    /// showed nothing new.
    pub(crate) fn register(
        &self,
        session_id: &str,
        run: Active,
        claimed_at: std::time::Instant,
    ) -> bool {
        // Same lock order as the listener: active, then missed_wakes; so a wake-up is
        // either seen by the run in `active` or recorded for it here, never neither.
        let mut active = self.active_lock();
        active.insert(session_id.to_string(), run);
        self.missed_wakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(session_id, claimed_at)
    }

    /// A wake-up for a session with no run here (called with the `active` lock held).
    fn note_missed_wake(&self, session_id: &str) {
        self.missed_wakes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(session_id);
    }

    /// The session's run is settled: forget it, and hand on entries that waited for it.
    pub(crate) fn finish_active(&self, session_id: &str) {
        // Same lock order as `dispatch`: active, then deferred.
        let mut active = self.active_lock();
        active.remove(session_id);
        let waiting = self
            .deferred
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id)
            .unwrap_or_default();
        drop(active);
        for d in waiting {
            let _ = self.redispatch.send(d);
        }
    }

    /// Providers are shared across sessions (one HTTP connection pool per endpoint).
    /// Credentials go only to the endpoint they are configured for: a session that names
    /// another base URL gets a provider without them.
    pub(crate) fn provider(
        &self,
        name: &str,
        base_url: Option<&str>,
    ) -> agentq_agent::Result<Arc<dyn LlmProvider>> {
        let key = (name.to_string(), base_url.map(str::to_string));
        let mut cache = self.providers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        let mut settings = self.cfg.providers.clone();
        if let Some(url) = base_url {
            let configured = match name {
                "anthropic" => settings.anthropic_base_url.as_deref(),
                _ => settings.openai_base_url.as_deref(),
            };
            if configured.map(|c| c.trim_end_matches('/')) != Some(url.trim_end_matches('/')) {
                settings.openai_api_key = None;
                settings.anthropic_api_key = None;
            }
        }
        let p = factory::build(name, base_url, &settings)?;
        cache.insert(key, p.clone());
        Ok(p)
    }
}

/// A worker process's engine. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl Worker {
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, cfg: WorkerConfig) -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (redispatch, redispatch_rx) = tokio::sync::mpsc::unbounded_channel();
        let (commits, commits_rx) = GroupCommit::channel();
        Worker {
            inner: Arc::new(Inner {
                store,
                queue,
                cfg,
                active: Mutex::new(HashMap::new()),
                draining: CancellationToken::new(),
                providers: Mutex::new(HashMap::new()),
                stats: Stats::default(),
                metrics: agentq_core::metrics::global(),
                events: tx,
                events_rx: Mutex::new(Some(rx)),
                deferred: Mutex::new(HashMap::new()),
                missed_wakes: Mutex::new(MissedWakes::default()),
                redispatch,
                redispatch_rx: Mutex::new(Some(redispatch_rx)),
                commits,
                commits_rx: Mutex::new(Some(commits_rx)),
                workspaces: std::sync::OnceLock::new(),
            }),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    pub fn consumer(&self) -> &str {
        &self.inner.cfg.consumer
    }

    /// Sessions running right now.
    pub fn active_sessions(&self) -> Vec<String> {
        self.inner.active_lock().keys().cloned().collect()
    }

    /// Run until `shutdown` fires, then drain: running sessions stop at their next
    /// checkpoint (bounded by `drain_timeout`), leases are released and their sessions
    /// re-enqueued so another worker resumes them at once.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<()> {
        let inner = self.inner.clone();
        inner.store.check_schema().await?;
        for q in &inner.cfg.queues {
            retry_forever(&shutdown, || inner.queue.ensure_queue(q)).await;
        }
        info!(consumer = %inner.cfg.consumer, queues = ?inner.cfg.queues, concurrency = inner.cfg.concurrency, "worker started");
        let slots = Arc::new(Semaphore::new(inner.cfg.concurrency.max(1)));
        let events_rx = take_once(&inner.events_rx)?;
        let tracker = TaskTracker::new();
        let bg_stop = CancellationToken::new();
        let mut redispatch_rx = take_once(&inner.redispatch_rx)?;
        let commits_rx = take_once(&inner.commits_rx)?;
        let commits_stop = CancellationToken::new();
        let committer = tokio::spawn(group_commit::writer(
            inner.store.clone(),
            commits_rx,
            group_commit::Limits {
                max_batch: inner.cfg.checkpoint_batch_max,
                in_flight: inner.cfg.checkpoint_writers,
            },
            inner.metrics,
            commits_stop.clone(),
        ));
        let writer_stop = CancellationToken::new();
        let writer = tokio::spawn(observe::event_writer(
            inner.queue.clone(),
            events_rx,
            writer_stop.clone(),
        ));
        let redispatcher = {
            let (inner, slots, tracker, stop) = (
                inner.clone(),
                slots.clone(),
                tracker.clone(),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let d = tokio::select! {
                        d = redispatch_rx.recv() => match d { Some(d) => d, None => return },
                        _ = stop.cancelled() => return,
                    };
                    dispatch(&inner, &slots, &tracker, d).await;
                }
            })
        };
        let background = vec![
            redispatcher,
            tokio::spawn(heartbeat_loop(inner.clone(), bg_stop.clone())),
            tokio::spawn(cancel_listener(inner.clone(), bg_stop.clone())),
            tokio::spawn(reclaim_loop(
                inner.clone(),
                slots.clone(),
                tracker.clone(),
                shutdown.clone(),
            )),
        ];

        // Entries delivered to this consumer earlier and never acked (a read dropped
        // mid-flight): they would otherwise wait for the reclaimer.
        match inner
            .queue
            .read_own_pending(&inner.cfg.queues, &inner.cfg.consumer, 1000)
            .await
        {
            Ok(ds) => {
                for d in ds {
                    dispatch(&inner, &slots, &tracker, d).await;
                }
            }
            Err(e) => warn!(error = %e, "reading own pending entries failed"),
        }

        let mut backoff = Backoff::new();
        loop {
            let free = tokio::select! {
                p = slots.clone().acquire_many_owned(1) => match p {
                    Ok(p) => { drop(p); slots.available_permits().max(1) }
                    Err(_) => break,
                },
                _ = shutdown.cancelled() => break,
            };
            let read = inner.queue.read(
                &inner.cfg.queues,
                &inner.cfg.consumer,
                free,
                inner.cfg.read_block,
            );
            let deliveries = tokio::select! {
                r = read => r,
                _ = shutdown.cancelled() => break,
            };
            match deliveries {
                Ok(ds) => {
                    backoff.reset();
                    for d in ds {
                        dispatch(&inner, &slots, &tracker, d).await;
                    }
                }
                Err(e) => {
                    let wait = backoff.next();
                    warn!(error = %e, ?wait, "reading the queue failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }

        info!("worker draining");
        inner.draining.cancel();
        tracker.close();
        if tokio::time::timeout(inner.cfg.drain_timeout, tracker.wait())
            .await
            .is_err()
        {
            warn!("drain timeout: aborting the sessions still running");
            let actives: Vec<CancellationToken> = inner
                .active_lock()
                .values()
                .map(|a| a.abort.clone())
                .collect();
            for a in actives {
                a.cancel();
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), tracker.wait()).await;
        }
        // Sessions are done with checkpoints (or abandoned): commits in flight finish.
        commits_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), committer).await;
        bg_stop.cancel();
        for b in background {
            let _ = tokio::time::timeout(Duration::from_secs(5), b).await;
        }
        writer_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        info!("worker stopped");
        Ok(())
    }
}

/// A receiver `run` takes for itself; it is there only once.
fn take_once<T>(slot: &Mutex<Option<T>>) -> Result<T> {
    slot.lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or_else(|| Error::Config("Worker::run called twice".into()))
}

/// Hand a delivery to a session task once a slot is free.
async fn dispatch(inner: &Arc<Inner>, slots: &Arc<Semaphore>, tracker: &TaskTracker, d: Delivery) {
    {
        let active = inner.active_lock();
        if let Some(a) = active.get(&d.session_id) {
            if a.entry_id != d.entry_id {
                // Another entry of a session this worker is running or settling: it may be
                // a wake-up that arrived after the run's last look, so run it afterwards.
                inner
                    .deferred
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(d.session_id.clone())
                    .or_default()
                    .push(d);
            }
            return;
        }
    }
    let permit = match slots.clone().acquire_owned().await {
        Ok(p) => p,
        Err(_) => return,
    };
    let inner = inner.clone();
    tracker.spawn(async move {
        session::handle(inner, d).await;
        drop(permit);
    });
}

async fn heartbeat_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.cfg.heartbeat_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let (leases, entries): (Vec<Lease>, HashMap<String, Vec<String>>) = {
            let active = inner.active_lock();
            let leases = active
                .values()
                .filter(|a| !a.settling.load(std::sync::atomic::Ordering::SeqCst))
                .map(|a| a.lease.clone())
                .collect();
            let mut entries: HashMap<String, Vec<String>> = HashMap::new();
            for a in active.values() {
                entries
                    .entry(a.queue.clone())
                    .or_default()
                    .push(a.entry_id.clone());
            }
            (leases, entries)
        };
        if entries.is_empty() {
            continue;
        }
        for (q, ids) in &entries {
            if let Err(e) = inner.queue.touch(q, &inner.cfg.consumer, ids).await {
                debug!(error = %e, "touching pending entries failed");
            }
        }
        if leases.is_empty() {
            continue;
        }
        match inner.store.heartbeat(&leases, inner.cfg.lease_ttl).await {
            Ok(statuses) => {
                let active = inner.active_lock();
                for s in statuses {
                    let Some(a) = active.get(&s.session_id) else {
                        continue;
                    };
                    if s.lost && !a.settling.load(std::sync::atomic::Ordering::SeqCst) {
                        warn!(session_id = %s.session_id, "lease lost; stopping the run");
                        a.abort.cancel();
                    } else if s.cancel_requested {
                        a.cancel.cancel();
                    }
                }
            }
            Err(e) => warn!(error = %e, "lease heartbeat failed"),
        }
    }
}

async fn cancel_listener(inner: Arc<Inner>, stop: CancellationToken) {
    use futures::StreamExt;
    let mut stream = loop {
        match inner.queue.subscribe_cancels().await {
            Ok(s) => break s,
            Err(e) => {
                warn!(error = %e, "subscribing to cancels failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        }
    };
    loop {
        let msg = tokio::select! {
            m = stream.next() => match m { Some(msg) => msg, None => return },
            _ = stop.cancelled() => return,
        };
        let signal = WorkerSignal::decode(&msg);
        let id = signal.session_id();
        let active = inner.active_lock();
        if let Some(a) = active.get(id) {
            match signal {
                WorkerSignal::Wake(_) => a.inbox.mark_dirty(),
                WorkerSignal::Interrupt(_) => {
                    info!(session_id = %id, "interrupted by a new message");
                    a.inbox.mark_dirty();
                    a.interrupter.interrupt();
                }
                WorkerSignal::Cancel(_) => {
                    info!(session_id = %id, "cancel requested");
                    a.cancel.cancel();
                }
            }
        } else if !matches!(signal, WorkerSignal::Cancel(_)) {
            inner.note_missed_wake(id);
        }
    }
}

async fn reclaim_loop(
    inner: Arc<Inner>,
    slots: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(inner.cfg.reclaim_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        // Even with no slot free, take at least one: its dispatch then queues for the next
        // slot in turn with new work, instead of waiting until the backlog has drained.
        let free = slots.available_permits().max(1);
        for q in &inner.cfg.queues {
            match inner
                .queue
                .reclaim(q, &inner.cfg.consumer, inner.cfg.reclaim_min_idle, free)
                .await
            {
                Ok(ds) => {
                    for d in ds {
                        info!(session_id = %d.session_id, "reclaimed an entry of a dead worker");
                        inner.metrics.sessions_reclaimed.inc();
                        dispatch(&inner, &slots, &tracker, d).await;
                    }
                }
                Err(e) => debug!(error = %e, "reclaim failed"),
            }
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Instant;

    use agentq_core::mem_queue::MemQueue;
    use agentq_core::sqlite::SqliteStore;

    use super::*;

    fn active(store: Arc<dyn Store>, id: &str) -> Active {
        Active {
            lease: Lease {
                session_id: id.into(),
                root_id: id.into(),
                owner: "w".into(),
                epoch: 1,
            },
            queue: "default".into(),
            entry_id: "0-1".into(),
            cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
            inbox: inbox::SessionInbox::new(store, id, 0, 0, 0, None, Vec::new()),
            interrupter: agentq_agent::driver::Interrupter::new(),
            settling: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// A wake-up noted between a session's claim and its run's registration is handed to
    /// that run, once; a run with none noted starts clean; one that registers long after
    /// its claim assumes the worst.
    #[tokio::test]
    async fn a_wake_before_registration_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open(&dir.path().join("a.db")).await.unwrap());
        let w = Worker::new(
            store.clone(),
            Arc::new(MemQueue::new()),
            WorkerConfig::default(),
        );
        let inner = &w.inner;

        let claimed = Instant::now();
        inner.note_missed_wake("early");
        assert!(inner.register("early", active(store.clone(), "early"), claimed));
        // Taken: a second run of it starts clean.
        inner.finish_active("early");
        assert!(!inner.register("early", active(store.clone(), "early"), Instant::now()));

        assert!(!inner.register("quiet", active(store.clone(), "quiet"), Instant::now()));

        // A registration long after its claim cannot trust that records were kept.
        let long_ago = Instant::now() - MISSED_WAKE_RETENTION;
        assert!(inner.register("slow", active(store.clone(), "slow"), long_ago));
    }

    #[test]
    fn missed_wakes_are_pruned_by_age_and_bounded() {
        let long_ago = Instant::now() - MISSED_WAKE_RETENTION;
        let mut m = MissedWakes::default();
        for i in 0..MISSED_WAKES_PRUNE_AT {
            m.at.insert(format!("old{i}"), long_ago);
        }
        // Pruned at most once a second.
        m.note("young");
        assert_eq!(m.at.len(), MISSED_WAKES_PRUNE_AT + 1);
        m.pruned_at = long_ago;
        m.note("fresh");
        assert_eq!(
            m.at.len(),
            2,
            "only the records younger than the retention stay"
        );

        // A storm of recent ones: dropped all at once, and runs claimed before then
        // cannot trust the absence of a record.
        let claimed = Instant::now();
        for i in 0..MISSED_WAKES_MAX {
            m.at.insert(format!("storm{i}"), Instant::now());
        }
        m.note("last");
        assert_eq!(m.at.len(), 1);
        assert!(m.take("unrelated", claimed));
        assert!(!m.take("unrelated", Instant::now()));
        assert!(m.take("last", Instant::now()));
    }
}
