//! agentq-store: where the truth lives. The `Store` traits ([`store`]: sessions, leases,
//! inboxes, the sweeper's, keys, queues, budgets, workspaces and batches), their two backends,
//! Postgres ([`pg`]) and, for the embedded mode, SQLite ([`sqlite`]), with the statements
//! and row decoding they share (`sql/`), the migrations they embed (`migrations/` and
//! `migrations_sqlite/` at the repository root), the blob store ([`blob`], in the database
//! or on S3) and the checkpoint a worker commits ([`checkpoint`]). Re-exported by
//! agentq-core under the same module names.

pub mod blob;
pub mod checkpoint;
pub mod pg;
mod rowconv;
pub mod shard_map;
pub mod sharded;
mod single_checkpoint;
mod sql;
pub mod sqlite;
pub mod store;

pub use blob::BlobStore;
pub use checkpoint::Checkpoint;
pub use shard_map::ShardStore;
pub use sharded::ShardedStore;
pub use store::{
    BatchSource, BatchStore, BudgetStore, Committed, InboxStore, KeyStore, LeaseStore, QueueCreate,
    QueueStore, ReportStore, RetentionStore, RetryResult, ScheduleStore, SessionStore, Store,
    SweepStore, WebhookStore, WorkspaceStore,
};

// The domain under the paths this code has always used (`crate::model::…`).
use agentq_error as error;
use agentq_types::{
    auth, batch, budget, config, fork, model, protocol, report, retention, schedule, scheduling,
    wait, webhook, workspace,
};
use error::{Error, Result};
use model::{Lease, SessionStatus};
