//! agentq-worker: takes session entries off the queue, leases the session in the store,
//! runs the agent loop with a fenced checkpointer, and publishes the completion. Owns the
//! worker's background duties too: lease and entry heartbeats, reclaiming entries of dead
//! workers, cancel notifications, and graceful drain on shutdown.
//!
//! Layout: [`config`] (what a worker runs with), `inner` (what it holds for all its
//! sessions), `run_loop` (read the queue, start each delivery, drain on shutdown),
//! `delivery` (may a delivery start here, a slot and a task for it; [`Worker::process`] is
//! the same path on the caller's task), `session` (one delivery: claim, run, settle),
//! `heartbeat`, `reclaim`, `listener` (cancel and wake-up signals), `runs` (the sessions
//! running here and what waits for them), `pipeline` (the writers every run hands its
//! checkpoints and events to), `checkpoint`, `inbox`, `observe`, [`workspace`] (a tree's
//! files on this worker), [`spawn`] (the `spawn_agent` tool). The gate of a session's LLM
//! calls is `admission`, made of `budget` (with `stored_budgets`, and `settlements`, which
//! tries again what the store failed to count) and the fleet limiter; `tenant` says whose
//! session it is, `backoff` how long to wait between tries, `error` what goes wrong.

mod admission;
mod backoff;
mod budget;
mod checkpoint;
pub mod config;
mod delivery;
mod error;
mod group_claim;
mod group_commit;
mod heartbeat;
mod in_parts;
mod inbox;
mod inner;
mod listener;
mod observe;
mod pipeline;
mod reclaim;
mod run_loop;
mod runs;
mod session;
mod settlements;
pub mod spawn;
mod stored_budgets;
mod tenant;
pub mod workspace;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use agentq_core::queue::Delivery;
use agentq_core::{Queue, Store};

use crate::inner::Inner;

pub use checkpoint::StoreCheckpointer;
pub use config::{WorkerSettings, default_consumer_name, pool_connections};
pub use error::{Error, Result};
pub use group_commit::GroupCommit;
pub use inner::Stats;
pub use observe::{EVENT_BUFFER, OverheadTap, overhead_tap};
pub use session::Processed;

/// How a worker's drain ended, for its stop line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Every running session stopped at a checkpoint and was handed back.
    Finished,
    /// `drain_timeout` passed first: the sessions still running were aborted, to be
    /// taken over once their leases expire.
    TimedOut,
}

/// A worker process's engine. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl Worker {
    pub fn new(store: Arc<dyn Store>, queue: Arc<dyn Queue>, cfg: WorkerSettings) -> Self {
        Worker {
            inner: Arc::new(Inner::new(store, queue, cfg)),
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

    /// Run until `shutdown` fires, then drain (the answer says whether every session
    /// stopped within the bound): running sessions stop at their next
    /// checkpoint (bounded by `drain_timeout`), leases are released and their sessions
    /// re-enqueued so another worker resumes them at once. Once per worker.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<Drain> {
        run_loop::run(self.inner.clone(), shutdown).await
    }

    /// Start this worker's MCP servers unless `run` has, and wait (at most `bound`) until
    /// each has answered or failed once: a session built before sees no tools of a
    /// server still starting.
    pub async fn start_mcp(&self, bound: std::time::Duration) {
        self.inner.mcp().settled(bound).await;
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
        delivery::process(&self.inner, delivery).await
    }
}
