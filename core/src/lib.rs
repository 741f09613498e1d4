//! agentq-core: what the scheduler and the worker share. It owns the process glue: the
//! session lifecycle steps built from `Store` and `Queue` calls ([`lifecycle`]), the
//! operator's hooks and guardian built once per process ([`hooks`]) and the metrics
//! registry ([`metrics`]). Everything else lives in the crates below it and is
//! re-exported here under the paths it always had:
//!
//! - `agentq-types`: the domain without I/O — [`model`], [`protocol`], [`wait`],
//!   [`scheduling`], [`auth`], [`policy`], [`budget`], [`batch`] and [`workspace`] types,
//!   [`workspace_path`], the settings tree ([`config`]);
//! - `agentq-error`: the [`Error`] every backend and process shares;
//! - `agentq-store`: the `Store` traits ([`store`]), Postgres ([`pg`]), SQLite
//!   ([`sqlite`]), blobs ([`blob`]), [`checkpoint`]s and the migrations;
//! - `agentq-queue`: the `Queue` traits ([`queue`]), Redis Streams ([`redis_queue`]), in
//!   process ([`mem_queue`]);
//! - `agentq-limiter`: the fleet rate limiter ([`admission`]).

/// The tracing target of the lines an operator sees with the default filter: a process's
/// start and stop, and a worker taking over a dead worker's sessions.
pub const PROCESS_TARGET: &str = "agentq::process";

pub mod hooks;
pub mod lifecycle;
pub mod metrics;

pub use agentq_limiter as admission;
pub use agentq_queue::{mem_queue, queue, redis_queue};
pub use agentq_store::{blob, checkpoint, pg, sharded, store};
pub use agentq_types::{
    auth, config, fork, model, policy, protocol, report, scheduling, shard, wait, workspace_path,
};

/// The error every backend and process shares (the `agentq-error` crate), and the
/// domain's (`agentq-types`), which converts into it variant for variant.
pub mod error {
    pub use agentq_error::{Error, Result};
    pub use agentq_types::Error as DomainError;
}

/// Batches as objects of the API: the types (`agentq-types`) and the store traits.
pub mod batch {
    pub use agentq_store::{BatchSource, BatchStore};
    pub use agentq_types::batch::*;
}

/// Budgets: the arithmetic and types (`agentq-types`) and the store trait.
pub mod budget {
    pub use agentq_store::BudgetStore;
    pub use agentq_types::budget::*;
}

/// Workspaces: the types (`agentq-types`) and the store trait.
pub mod workspace {
    pub use agentq_store::WorkspaceStore;
    pub use agentq_types::workspace::*;
}

/// Schedules: the schedules and their fires (`agentq-types`) and the store trait.
pub mod schedule {
    pub use agentq_store::ScheduleStore;
    pub use agentq_types::schedule::*;
}

/// Webhooks: the endpoints and outbox rows (`agentq-types`) and the store trait.
pub mod webhook {
    pub use agentq_store::WebhookStore;
    pub use agentq_types::webhook::*;
}

/// Retention: the rules and answers (`agentq-types`) and the store trait.
pub mod retention {
    pub use agentq_store::RetentionStore;
    pub use agentq_types::retention::*;
}

/// The embedded store (`agentq-store`), and the recovery an embedded process runs at
/// start, which needs the queue too ([`lifecycle::requeue_runnable`]).
pub mod sqlite {
    pub use agentq_store::sqlite::*;

    pub use crate::lifecycle::requeue_runnable;
}

pub use blob::BlobStore;
pub use checkpoint::Checkpoint;
pub use error::{Error, Result};
pub use model::*;
pub use queue::{EventStreams, Queue, QueueHealth, Signals, WorkQueue};
pub use store::{
    BatchStore, Committed, InboxStore, KeyStore, LeaseStore, QueueCreate, QueueStore, ReportStore,
    RetentionStore, RetryResult, ScheduleStore, SessionStore, Store, SweepStore, WebhookStore,
};
pub use wait::WaitReason;
pub use workspace::WorkspaceStore;
