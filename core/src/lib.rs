//! agentq-core: what the scheduler and the worker share — the session model, the `Store`
//! (Postgres; SQLite for the embedded mode), the `Queue` (Redis Streams; in-process for
//! the embedded mode), configuration, the completion message and the metrics registry.

pub mod blob;
pub mod checkpoint;
pub mod hooks;
pub mod lifecycle;
pub mod metrics;
pub mod pg;
mod rowconv;
mod sql;
pub mod sqlite;
pub mod store;

pub use agentq_limiter as admission;
pub use agentq_queue::{mem_queue, queue, redis_queue};
pub use agentq_types::{auth, config, model, policy, protocol, scheduling, wait, workspace_path};

/// The error every backend and process shares (the `agentq-error` crate), and the
/// domain's (`agentq-types`), which converts into it variant for variant.
pub mod error {
    pub use agentq_error::{Error, Result};
    pub use agentq_types::Error as DomainError;
}

/// Budgets: the arithmetic and types (`agentq-types`) and the store trait.
pub mod budget {
    pub use agentq_types::budget::*;

    pub use crate::store::BudgetStore;
}

/// Workspaces: the types (`agentq-types`) and the store trait.
pub mod workspace {
    pub use agentq_types::workspace::*;

    pub use crate::store::WorkspaceStore;
}

pub use blob::BlobStore;
pub use checkpoint::Checkpoint;
pub use error::{Error, Result};
pub use model::*;
pub use queue::{EventStreams, Queue, QueueHealth, Signals, WorkQueue};
pub use store::{
    Committed, InboxStore, KeyStore, LeaseStore, QueueCreate, QueueStore, RetryResult,
    SessionStore, Store, SweepStore,
};
pub use wait::WaitReason;
pub use workspace::WorkspaceStore;
