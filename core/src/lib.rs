//! agentq-core: what the scheduler and the worker share — the session model, the `Store`
//! (Postgres; SQLite for the embedded mode), the `Queue` (Redis Streams; in-process for
//! the embedded mode), configuration, the completion message and the metrics registry.

pub mod admission;
pub mod auth;
pub mod blob;
pub mod budget;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod hooks;
pub mod lifecycle;
pub mod mem_queue;
pub mod metrics;
pub mod model;
pub mod pg;
pub mod policy;
pub mod protocol;
pub mod queue;
pub mod redis_queue;
mod rowconv;
pub mod scheduling;
mod sql;
pub mod sqlite;
pub mod store;
pub mod wait;
pub mod workspace;
pub mod workspace_path;

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
