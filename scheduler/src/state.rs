//! The state the HTTP handlers share ([`Scheduler`]): the store, the queue, the settings
//! and the per-process parts (queue registry, event fan-out, stream caps, the batch
//! decode budget, the turns to write batch objects, the dispatcher's holds).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use agentq_core::{Queue, Store};

use crate::dispatch;
use crate::events;
use crate::http::decode::DecodeBudget;
use crate::queues::QueueRegistry;
use crate::settings::SchedulerSettings;

/// Body limit of `POST /v1/sessions/batch` (10,000 sessions of about 3 KiB each). A
/// batch takes about four times its body while it is created (the body, the requests,
/// the statement's arguments and the rows it answers), so this bounds one batch to about
/// 128 MiB of the scheduler's memory.
pub const BATCH_BODY_LIMIT: usize = 32 * 1024 * 1024;

/// Batch objects one scheduler writes to the store at once. Each holds a connection of
/// the store's pool in its transaction for as long as its inserts take (seconds for
/// 100,000 sessions); more batches at once would take the connections every other
/// request needs. The others wait their turn, their items already checked and spooled.
pub const BATCHES_WRITTEN_AT_ONCE: usize = 2;

/// Shared state of the HTTP handlers. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub cfg: SchedulerSettings,
    pub(crate) queues: QueueRegistry,
    /// Cancelled when shutdown begins: `/readyz` then answers 503.
    pub(crate) draining: CancellationToken,
    /// The readers that fan live events out to the event streams.
    pub(crate) hub: events::Hub,
    /// The open event streams, against their caps.
    pub(crate) streams: events::StreamCaps,
    /// The bytes of batch bodies being read and decoded, against `batch_decode_bytes`.
    pub(crate) decoding: DecodeBudget,
    /// Turns to write a checked batch object to the store ([`BATCHES_WRITTEN_AT_ONCE`]).
    pub(crate) batch_writes: Arc<tokio::sync::Semaphore>,
    /// Which new sessions wait in the store for the dispatcher.
    pub(crate) dispatch: dispatch::Dispatch,
}

impl Scheduler {
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, cfg: SchedulerSettings) -> Self {
        let queues = match cfg.auth.keyless {
            true => QueueRegistry::new(cfg.queues.clone()).settings_only(),
            false => QueueRegistry::new(cfg.queues.clone()),
        };
        let streams = events::StreamCaps::new(cfg.streams);
        let dispatch = dispatch::Dispatch::new(cfg.scheduling.clone());
        let decoding = DecodeBudget::new(cfg.batch_decode_bytes);
        Scheduler {
            decoding,
            batch_writes: Arc::new(tokio::sync::Semaphore::new(BATCHES_WRITTEN_AT_ONCE)),
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

    /// Tell the world about a cancel made here ([`agentq_core::lifecycle::announce_cancel`],
    /// with this configuration's event stream expiry).
    pub(crate) async fn announce_cancel(&self, result: &agentq_core::CancelResult) {
        agentq_core::lifecycle::announce_cancel(
            self.store.as_ref(),
            self.queue.as_ref(),
            result,
            self.cfg.event_ttl,
        )
        .await;
    }

    /// Cancel every unfinished descendant of `root`
    /// ([`agentq_core::lifecycle::cancel_descendants`]).
    pub(crate) async fn cancel_descendants(&self, root: &str) {
        agentq_core::lifecycle::cancel_descendants(
            self.store.as_ref(),
            self.queue.as_ref(),
            root,
            self.cfg.event_ttl,
        )
        .await;
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
    /// by name before this limit is reached. It is also the longest line a JSON Lines
    /// batch upload may hold.
    pub fn single_body_limit(&self) -> usize {
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

    /// Run the dispatcher for this scheduler until `cancel` (as `run` does); until it
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
