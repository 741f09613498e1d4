//! The `Store`: where the truth lives. Sessions, their append-only messages, leases with
//! fencing. Implemented on Postgres ([`crate::pg::PgStore`]) and, for the embedded mode,
//! SQLite ([`crate::sqlite::SqliteStore`]). Every write a worker makes after a claim is
//! conditional on its lease epoch.
//!
//! The operations are split by caller, so that each caller can depend on only what it
//! uses: [`SessionStore`] (the API and the CLI: create, read, cancel), [`LeaseStore`] (a
//! worker running sessions: claim, checkpoint, heartbeat, release, suspend),
//! [`InboxStore`] (whatever wakes a session: inbox items, approvals, follow-ups) and
//! [`SweepStore`] (the scheduler's sweeper), [`KeyStore`] (API keys), [`QueueStore`]
//! (the queues an admin created) and [`BatchStore`] (batches as objects of the API). [`Store`] is all of them, plus the schema
//! check a process runs once at start; `Arc<dyn Store>` is what the processes hold.

use std::time::Duration;

use async_trait::async_trait;

use agentq_agent::schema::{Message, ToolCall};

use chrono::{DateTime, Utc};

use crate::auth::{ApiKey, NewApiKey};
use crate::batch::{BatchCreate, BatchItem, BatchOutcome, BatchRow, BatchTally, NewBatch};
use crate::blob::BlobStore;
use crate::budget::{
    HoldRefused, Ledger, ModelUsage, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use crate::error::Result;
use crate::fork::{ForkResult, NewFork};
use crate::model::{
    ApprovalRecorded, CancelResult, Delivered, InboxItem, ListFilter, NewSession, SessionRow,
    SessionStatus, Woken,
};
use crate::protocol::{InboxKind, InboxPayload};
use crate::report::{CostFilter, CostRow, StatusCount, WorkerLeases};
use crate::retention::{RetentionCandidate, RetentionRule, Retired, RuleKind, StoredRetentionRule};
use crate::schedule::{Advance, FireRow, NewSchedule, ScheduleRow};
use crate::scheduling::{ActiveCount, Candidate};
use crate::wait::WaitReason;
use crate::webhook::{
    AttemptOutcome, DeliveryCounts, DeliveryRow, DeliveryState, NewWebhook, Recorded, RetryRule,
    WebhookRow,
};
use crate::workspace::FileEntry;

mod lease;
pub use lease::{Committed, LeaseStatus, LeaseStore};

/// The whole store: every narrow trait below, and the schema check.
///
/// The schema check is the one operation of the database as a whole (not of sessions), run
/// by a process before it serves anything; it is declared here rather than in a narrow
/// trait so that `Store::check_schema(&store)` names it directly.
#[async_trait]
pub trait Store:
    SessionStore
    + LeaseStore
    + InboxStore
    + SweepStore
    + KeyStore
    + QueueStore
    + BudgetStore
    + WorkspaceStore
    + BatchStore
    + WebhookStore
    + ScheduleStore
    + ReportStore
    + RetentionStore
    + crate::shard_map::ShardStore
{
    /// Fail unless the schema is at least what this binary needs.
    async fn check_schema(&self) -> Result<()>;
}

/// What the console's summaries read: bounded aggregates, never rows.
#[async_trait]
pub trait ReportStore: Send + Sync {
    /// The sessions of `filter` (its `cursor`, `limit` and `oldest_first` aside) per status
    /// and, waiting, per reason; statuses without sessions left out.
    async fn count_sessions(&self, filter: &ListFilter) -> Result<Vec<StatusCount>>;

    /// Usage per tenant, model and UTC day of creation, the most recent day first.
    async fn costs(&self, filter: &CostFilter) -> Result<Vec<CostRow>>;

    /// The owners of running sessions' leases (at most `limit`, by name).
    async fn workers(&self, limit: u32) -> Result<Vec<WorkerLeases>>;
}

/// Retention: the finished trees a rule takes, and their deletion. Every "now" is passed
/// in (the scheduler's clock), so a test moves time by passing a later one.
#[async_trait]
pub trait RetentionStore: Send + Sync {
    /// The roots of trees `rule` takes at `now`: every session of the tree finished more
    /// than `rule.days` before `now`, and nothing still references it (a batch not yet
    /// finished); with `Keep::Result`, only trees not pruned already. Oldest finish
    /// first, at most `limit`. Reads only.
    async fn retention_candidates(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<RetentionCandidate>>;

    /// The ids of a tree's sessions, root first.
    async fn tree_ids(&self, root_id: &str) -> Result<Vec<String>>;

    /// Take the trees of `roots` that `rule` still takes at `now` (checked again in the
    /// deletion's transaction; those a writer holds are skipped), in one transaction:
    /// their transcripts, inboxes, approvals and workspace manifests are deleted; with
    /// `Keep::None` their session rows and specs too (their usage moved to the ledger
    /// `GET /v1/admin/costs` reads, and a batch left without sessions deleted), with
    /// `Keep::Result` the rows are kept and marked pruned. Contents no workspace holds
    /// any more are left for [`SweepStore::collect_blobs`].
    async fn retire_trees(
        &self,
        rule: &RetentionRule,
        now: DateTime<Utc>,
        roots: &[String],
    ) -> Result<Retired>;

    /// The rules stored through the admin API, the tenants' by name, then the queues'.
    async fn retention_rules(&self) -> Result<Vec<StoredRetentionRule>>;

    /// Store `rule`, replacing the stored one of its tenant or queue.
    async fn set_retention_rule(&self, rule: &StoredRetentionRule) -> Result<()>;

    /// Delete the stored rule of `kind` `name`; whether there was one.
    async fn delete_retention_rule(&self, kind: RuleKind, name: &str) -> Result<bool>;
}

/// Sessions as the API and the CLI see them: create, read, list, cancel, fail.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Insert a queued session. With an idempotency key that exists already, return the
    /// existing row and `false`.
    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)>;

    /// Insert many in one transaction; same idempotency rule per item.
    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>>;

    async fn get(&self, id: &str) -> Result<Option<SessionRow>>;

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>>;

    /// The stored history, in order.
    async fn messages(&self, id: &str) -> Result<Vec<Message>>;

    /// Create a fork (see `agentq_types::fork`): a new queued root session whose history
    /// is `fork.origin`'s up to iteration `fork.at_iteration` (shared, not copied), then
    /// `fork.message`, and whose tree's files are the origin's as of that step. One
    /// transaction; the origin is only read (its committed steps: it may be running).
    /// An origin of another tenant than `fork.new`'s is `NotFound`.
    async fn fork_session(&self, fork: &NewFork) -> Result<ForkResult>;

    /// Mark a session failed from outside a run (dead letter), with the reason.
    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>>;

    /// A finished session's settle steps are done: its parent was told, its follow-up
    /// started and its completion published. Until then (and a grace) the sweeper
    /// re-drives them ([`SweepStore::unannounced`]). A session not finished, or marked
    /// already, is left as it is.
    async fn mark_announced(&self, id: &str) -> Result<()>;

    /// Cancel: a queued session is cancelled at once; a running one gets the flag.
    async fn request_cancel(&self, id: &str) -> Result<CancelResult>;

    /// Redrive a session that failed with an error (its run's, or a dead letter): back
    /// to `queued` without a stream entry (the caller enqueues it), resuming from its last
    /// checkpoint, with its claim count reset and its outcome cleared; the lease epoch
    /// moves on, fencing off any earlier holder. A session that is not failed that way is
    /// left as it is ([`RetryResult::NotRetryable`]), so a repeated retry does nothing.
    /// With `hold`, it waits for the dispatcher rather than for the caller's enqueue.
    ///
    /// In a tree with a token budget it is re-opened on the tree's ledger in the same
    /// transaction, as [`InboxStore::follow_up`] says; `Error::NoBudget`, changing
    /// nothing, when the tree has nothing left to give it.
    async fn retry(&self, id: &str, hold: bool) -> Result<RetryResult>;

    /// Liveness of the database.
    async fn ping(&self) -> Result<()>;

    /// How many sessions are in each unfinished status (for the fleet's gauges).
    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>>;
}

/// What wakes a session: its inbox, the decisions on its held tool calls, follow-up turns.
#[async_trait]
pub trait InboxStore: Send + Sync {
    /// Append an item to a session's inbox (a no-op if `dedupe` was delivered before)
    /// and bump its wake counter; a session whose status is in `wake` goes back to
    /// `queued` (the caller enqueues it).
    async fn deliver(
        &self,
        session_id: &str,
        kind: InboxKind,
        dedupe: &str,
        payload: &InboxPayload,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>>;

    /// Inbox items of these kinds after position `after`, in order.
    async fn inbox(
        &self,
        session_id: &str,
        kinds: &[InboxKind],
        after: u64,
    ) -> Result<Vec<InboxItem>>;

    /// Record a human's decision on a held tool call (first decision wins) and wake the
    /// session if it awaits approval. `arguments` (an approval only): what the call runs
    /// with instead of the model's arguments, as a JSON text.
    async fn decide_approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
        approve: bool,
        reason: Option<&str>,
        arguments: Option<&str>,
    ) -> Result<ApprovalRecorded>;

    /// The decision on a held call, if any: (approved, reason, edited arguments as a JSON
    /// text).
    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>, Option<String>)>>;

    /// The calls of `held` (the row's [`SessionRow::held_calls`]) that still wait for a
    /// decision: made by the session's latest response, without a result and without a
    /// recorded decision; in the response's order, with their tool and arguments. Empty
    /// when the turn has moved on past that response (a user message follows it). One
    /// round trip.
    async fn pending_approvals(&self, session_id: &str, held: &[String]) -> Result<Vec<ToolCall>>;

    /// Start a new turn on a finished session: the user's message is appended to its
    /// full history and it is queued again. `consume` is the inbox position of the
    /// follow-up this came from (recorded so it runs once). `None` when the session is
    /// not finished (or the follow-up ran already).
    ///
    /// In a tree with a token budget, in the same transaction (serialised per tree with
    /// spawns and give-backs): a sub-agent draws a new allowance from its tree as a spawn
    /// does, from the nearest ancestor that still holds its own (at the latest the root),
    /// and at most what its own `token_budget` still lets it spend (a session's
    /// `token_budget` bounds its spend over all its turns); what it consumed before goes
    /// from its parent's finished children's spend back to what the parent holds for it,
    /// so its tokens are counted once. A root keeps its budget and its spend. When the
    /// tree (or its own budget) has nothing left: `Error::NoBudget`, changing nothing.
    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>>;
}

/// What the sweeper needs: which sessions have queue entries, and expired approvals.
#[async_trait]
pub trait SweepStore: Send + Sync {
    /// Remember that the session has a queue entry (so the sweeper leaves it alone).
    async fn mark_enqueued(&self, ids: &[String]) -> Result<()>;

    /// Forget that sessions of `queue` have queue entries (the queue lost its data): the
    /// sweeper then re-adds every queued and running one. Returns how many.
    async fn reset_enqueued(&self, queue: &str) -> Result<u64>;

    /// Running sessions whose lease expired more than `grace` ago and whose owner's
    /// liveness row expired as long ago (or is missing: a worker from before those rows;
    /// [`SweepStore::requeue_orphans`] finds the others sooner), with a queue entry added
    /// before that lease: forget the entry, so that [`SweepStore::unenqueued`] returns them
    /// and the sweeper adds a new one. The lease is the truth for liveness: whatever became
    /// of the old entry (trimmed, lost with Redis, pending for a dead worker), the session
    /// runs again, and a duplicate entry is harmless. A session whose entry was added after
    /// its lease expired is left alone (each expiry is re-queued once). Up to `limit`,
    /// longest expired first; returns how many.
    async fn forget_expired_entries(&self, grace: Duration, limit: u32) -> Result<u64>;

    /// Running sessions of `queues` whose owner stopped heartbeating (its liveness row
    /// expired, and the session's claim expiry is behind too) and whose queue entry was
    /// added while that owner lived (or not recorded): forget the entry and return (id,
    /// queue) of each, up to `limit`, for the caller to add a new one at once, then
    /// [`SweepStore::mark_enqueued`]. Until then a session comes back at every call (to
    /// concurrent callers, possibly to each: a duplicate entry is harmless, the claim
    /// decides); once recorded, not again for that death.
    async fn requeue_orphans(&self, queues: &[String], limit: u32)
    -> Result<Vec<(String, String)>>;

    /// Forget the liveness rows of workers that stopped more than `age` ago and own no
    /// running session any more. Returns how many.
    async fn forget_workers(&self, age: Duration) -> Result<u64>;

    /// Finished sessions whose settle steps were not marked done ([`SessionStore::mark_announced`])
    /// more than `grace` after they finished, those finished first first, up to `limit`:
    /// the sweeper settles them again (every step is idempotent).
    async fn unannounced(&self, grace: Duration, limit: u32) -> Result<Vec<SessionRow>>;

    /// Queued (or running) sessions without a queue entry, older than `age`.
    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>>;

    /// Sessions awaiting an approval past their deadline go back to the queue (their
    /// held calls are then denied with `timeout`). Returns (id, queue) to enqueue.
    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<Woken>>;

    /// Sessions waiting with a wake time that has come (a rate limit's) go back to the
    /// queue, those due longest first, up to `limit`. Returns (id, queue) to enqueue.
    async fn wake_due(&self, limit: u32) -> Result<Vec<Woken>>;

    /// `tenant`'s sessions parked for a spent budget go back to the queue (its budget was
    /// raised or its period turned over), longest parked first, up to `limit`. Returns
    /// (id, queue) to enqueue. A session that is still running when this is called and
    /// parks afterwards is not woken by it.
    async fn wake_budget_waiters(&self, tenant: &str, limit: u32) -> Result<Vec<Woken>>;

    /// Suspended (`waiting`, `awaiting_approval`) sessions per wait reason (one query).
    async fn waiting_by_reason(&self) -> Result<Vec<(WaitReason, u64)>>;
    /// Queued sessions held in the store (behind a full delivery buffer or a cap on
    /// running sessions), per queue; queues with none are absent.
    async fn held_by_queue(&self) -> Result<Vec<(String, u64)>>;
    /// Per (queue, tenant, batch): sessions running, and sessions queued and not held
    /// (in the delivery buffer, or about to be). Groups with neither are absent.
    async fn dispatch_load(&self) -> Result<Vec<ActiveCount>>;

    /// The held sessions of `queue`: at most `per_group` of each (tenant, batch), the
    /// best of each (higher priority, then older), and at most `limit` in all, lowest
    /// ranks first.
    async fn held(&self, queue: &str, per_group: u32, limit: u32) -> Result<Vec<Candidate>>;

    /// Whether any session of `queue` (`None`: of any queue) is held (cheap: the first
    /// index entry).
    async fn any_held(&self, queue: Option<&str>) -> Result<bool>;

    /// Stop holding these sessions (the caller then enqueues them): only those still held
    /// and queued, which are returned, so that of two racing callers one gets each.
    async fn release_held(&self, ids: &[String]) -> Result<Vec<String>>;

    /// Delete the workspaces (manifests) of up to `limit` trees whose root finished more
    /// than `ttl` ago and did not run since; their blobs are then unreferenced, for
    /// [`SweepStore::collect_blobs`]. Returns how many trees.
    async fn expire_workspaces(&self, ttl: Duration, limit: u32) -> Result<u64>;

    /// Delete up to `limit` blobs that no manifest references and that nothing touched for
    /// `grace` (an upload about to be committed touched its blobs just before). Returns
    /// how many.
    async fn collect_blobs(&self, grace: Duration, limit: u32) -> Result<u64>;
}

/// What [`SessionStore::retry`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryResult {
    /// Queued again; the caller enqueues it.
    Retried(Box<SessionRow>),
    /// It is not a session that failed with an error (as it stands now).
    NotRetryable(Box<SessionRow>),
    NotFound,
}

/// API keys (the hashes of them: a key itself is never stored).
#[async_trait]
pub trait KeyStore: Send + Sync {
    /// Store a new key; `Error::Conflict` when its id exists already.
    async fn create_key(&self, key: &NewApiKey) -> Result<ApiKey>;

    /// Every key, oldest first (revoked and expired ones included).
    async fn list_keys(&self) -> Result<Vec<ApiKey>>;

    /// Revoke the key (a revoked key stays revoked, at its first revocation's time); the
    /// key as stored now, `None` when there is no such key.
    async fn revoke_key(&self, id: &str) -> Result<Option<ApiKey>>;

    /// The key with this public id, whose stored hash a presented key is then compared
    /// with (`auth::verify`, constant time).
    async fn key(&self, id: &str) -> Result<Option<ApiKey>>;
}

/// The queues an admin created (the configured ones are in the configuration): a queue is
/// a Redis stream and a label value of the metrics, so sessions may only name known ones.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Store the queue `name`, unless it is stored already or `limit` queues are; the
    /// count and the insert are one step for every scheduler at once.
    async fn create_queue(&self, name: &str, limit: usize) -> Result<QueueCreate>;

    /// Every stored queue, oldest first.
    async fn stored_queues(&self) -> Result<Vec<String>>;
}

/// What [`QueueStore::create_queue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueCreate {
    Created,
    /// It was stored already.
    Exists,
    /// `limit` queues are stored: none was added.
    Full,
}

/// The ledger, the cap on trees and tenant budgets and spend.
#[async_trait]
pub trait BudgetStore: Send + Sync {
    /// Create the child `new` under `limits`, in one transaction: a session with the same
    /// idempotency key is answered as it is; else the tree's count (on the root row) must
    /// be below `max_tree_sessions`, and with a budget the parent's remaining budget must
    /// give a grant ([`crate::budget::grant`]); the child is inserted with that grant as its
    /// spec's `token_budget` and stored allowance, the parent holds it, and the root counts
    /// one more session. Concurrent spawns in one tree (on any worker) are serialised by the
    /// root's row, so two cannot both take the last slot or the last of the budget.
    async fn spawn_session(&self, new: &NewSession, limits: &SpawnLimits) -> Result<Spawned>;

    /// The session's part of the ledger, `None` when there is no such session.
    async fn ledger(&self, id: &str) -> Result<Option<Ledger>>;

    /// A finished child gives its allowance back to its parent, with what it and its
    /// subtree consumed (its own tokens, its finished children's, and what its live
    /// children still hold). Once per child; `false` when there was nothing to do (not
    /// finished, no allowance, done already). A child whose parent gave back already
    /// changes what that parent consumed: the difference goes on up to the first
    /// ancestor that has not given back (at the latest the root), so the root's ledger
    /// counts every token of the tree once. Serialised per tree with spawns and
    /// re-openings ([`crate::SessionStore::retry`], [`crate::InboxStore::follow_up`]).
    async fn return_budget(&self, id: &str) -> Result<bool>;

    /// Finished children whose allowance was not given back (up to `limit`), for the
    /// sweeper.
    async fn unreturned_budgets(&self, limit: u32) -> Result<Vec<String>>;

    /// Usage per model over the sessions of the tree rooted at `root_id`.
    async fn tree_usage(&self, root_id: &str) -> Result<Vec<ModelUsage>>;

    /// Add to what `tenant` spent on UTC day `day` (`YYYY-MM-DD`).
    async fn add_tenant_spend(&self, tenant: &str, day: &str, spend: Spend) -> Result<()>;

    /// Let an LLM call of `hold.tenant` start under `budgets` (the tenant's, as of `now`):
    /// ordered per tenant on every worker by the tenant's one totals row (a call below
    /// every budget is one conditional update of it, whatever runs at once), refused with the first
    /// budget that the tenant's recorded spend in its period has reached, else with the
    /// first that this spend plus the unexpired holds of its other calls reaches (with
    /// [`HoldRefused::holds_expire`]: the caller waits for them to settle); else `hold`
    /// is stored (and the tenant's expired holds dropped). A call starts only while spend
    /// and holds are below the budget, so the tenant ends within it plus one call,
    /// however many run at once.
    async fn hold_tenant_spend(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: DateTime<Utc>,
    ) -> Result<Option<HoldRefused>>;

    /// The call of hold `id` ended having spent `spend`, counted on UTC day `day`: the
    /// hold goes and the spend is added, in one step (a hold already gone, expired or
    /// settled, only adds the spend).
    async fn settle_tenant_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<()>;

    /// [`BudgetStore::settle_tenant_hold`] only while hold `id` is still stored: `false`
    /// (and nothing counted) when it is gone. A settlement whose answer was lost may have
    /// committed; this is how it is tried again without counting its spend twice, up to
    /// the hold's expiry (after it, a recount may have dropped the hold, and the spend is
    /// not counted).
    async fn settle_tenant_hold_if_held(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<bool>;

    /// What `tenant` spent from day `from` to day `to`, both included.
    async fn tenant_spend(&self, tenant: &str, from: &str, to: &str) -> Result<Spend>;

    /// Store a tenant's budget (it overrides the configured one).
    async fn set_tenant_budget(&self, budget: &TenantBudget) -> Result<()>;

    /// The stored budgets (set through the admin API).
    async fn tenant_budgets(&self) -> Result<Vec<TenantBudget>>;
}

/// A tree's committed workspace: read by the API and the CLI, and by a worker that
/// materialises it; written by the checkpoints (see [`crate::Checkpoint::files`]) and by
/// the creation of a session (its input files, or a fork of another tree's).
#[async_trait]
pub trait WorkspaceStore: BlobStore + Send + Sync {
    /// Every committed file of the tree `root_id`, sorted by path.
    async fn workspace_files(&self, root_id: &str) -> Result<Vec<FileEntry>>;

    /// One committed file and its bytes; `None` when the tree holds no such path.
    async fn workspace_file(
        &self,
        root_id: &str,
        path: &str,
    ) -> Result<Option<(FileEntry, Vec<u8>)>>;
}

/// Where the items of a batch being created come from: the caller reads and checks them a
/// chunk at a time while the store writes, so a batch is never whole in memory.
#[async_trait]
pub trait BatchSource: Send {
    /// The next items (a chunk), `None` after the last. An error ends the creation with
    /// nothing written.
    async fn next_chunk(&mut self) -> Result<Option<Vec<BatchItem>>>;
}

/// Batches as objects of the API: a batch's row, and its sessions read by its id. A batch
/// is counted from its sessions when it is read (through the index of their `batch_id`),
/// never written to as they run.
#[async_trait]
pub trait BatchStore: Send + Sync {
    /// Create `batch` and one session per item of `items`, read a chunk at a time, all in
    /// one transaction: a refused item ([`BatchCreate::Refused`]: a `custom_id` repeated
    /// within the batch, an idempotency key that names a session already) or an error
    /// (of the store, or of `items`) leaves nothing written. Each session is created as
    /// [`SessionStore::create_sessions`] creates one, with the item's `custom_id`; its
    /// `sched` (batch id, cap, hold) is the caller's to set. The row records how many
    /// sessions the batch was created with.
    async fn create_batch(
        &self,
        batch: &NewBatch,
        items: &mut dyn BatchSource,
    ) -> Result<BatchCreate>;

    /// The batch `id`, of any tenant (the caller checks whose it is).
    async fn batch(&self, id: &str) -> Result<Option<BatchRow>>;

    /// Batches newest first (of `tenant`, or of every tenant), after `cursor` (a batch id
    /// of the previous page), at most `limit`.
    async fn list_batches(
        &self,
        tenant: Option<&str>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchRow>>;

    /// The sessions of the batches `ids`, grouped by batch, status, finish reason and model
    /// (one statement for all of them).
    async fn batch_tally(&self, ids: &[String]) -> Result<Vec<BatchTally>>;

    /// The sessions of batch `id` in id order, those after `after` (every one when
    /// `None`), at most `limit`, finished or not.
    async fn batch_outcomes(
        &self,
        id: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<BatchOutcome>>;

    /// Record that batch `id` is cancelled (its first cancel's time stays) and cancel at
    /// once up to `limit` of its sessions that are queued and never started (so have no
    /// sub-agents), as [`SessionStore::request_cancel`] cancels a queued one; the rows
    /// cancelled, none when none is left. The caller cancels the others one by one.
    async fn cancel_batch(&self, id: &str, limit: u32) -> Result<Vec<SessionRow>>;
}

/// Webhooks: a tenant's endpoints and the outbox of deliveries to them. The outbox rows
/// are written by the database itself (triggers on `sessions`, in the transaction of the
/// change they announce); these methods manage endpoints and drive deliveries. Every
/// "now" is the caller's, so the delivery loop's clock can be injected.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Add an endpoint unless its tenant has `max` already (false then).
    async fn create_webhook(&self, new: &NewWebhook, max: u32) -> Result<bool>;

    /// The endpoint `id`, of any tenant (the caller checks whose it is).
    async fn webhook(&self, id: &str) -> Result<Option<WebhookRow>>;

    /// A tenant's endpoints, oldest first.
    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookRow>>;

    /// Delete endpoint `id` and its deliveries; false when there was none.
    async fn delete_webhook(&self, id: &str) -> Result<bool>;

    /// Sign with a secret derived from `salt` from now on; the current one signs too
    /// until `old_until`. False when there is no such endpoint.
    async fn rotate_webhook(&self, id: &str, salt: &str, old_until: DateTime<Utc>) -> Result<bool>;

    /// Enable endpoint `id` again (forgetting its failure streak); false when none.
    async fn enable_webhook(&self, id: &str) -> Result<bool>;

    /// Disable endpoint `id` at `now` for `reason` and make its pending deliveries dead
    /// letters, as a failure streak does; false when none, or disabled already.
    async fn disable_webhook(&self, id: &str, now: DateTime<Utc>, reason: &str) -> Result<bool>;

    /// Endpoint `id`'s deliveries per state.
    async fn delivery_counts(&self, id: &str) -> Result<DeliveryCounts>;

    /// Endpoint `id`'s deliveries newest first, in `state` (any when `None`), after
    /// `cursor` (a delivery id), at most `limit`.
    async fn list_deliveries(
        &self,
        id: &str,
        state: Option<DeliveryState>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>>;

    /// Queue endpoint `id`'s dead letters again, due at `now` and retried for the full
    /// time from then; how many.
    async fn redrive_deliveries(&self, id: &str, now: DateTime<Utc>) -> Result<u64>;

    /// Take up to `limit` deliveries due at `now`, oldest first, each counted as an
    /// attempt and leased for `lease` (no other claimer takes it meanwhile; past it, one
    /// may, so a claimer that died does not lose the delivery).
    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>>;

    /// Record what the attempt of `delivery` (as claimed: fenced by its attempt count)
    /// did at `now`: delivered; or failed, due again at `rule.next_attempt_at` or dead
    /// when that is `None`. A failure on an endpoint failing continuously for
    /// `rule.disable_after` disables it and makes its pending deliveries dead letters.
    async fn record_attempt(
        &self,
        delivery: &DeliveryRow,
        now: DateTime<Utc>,
        outcome: &AttemptOutcome,
        rule: &RetryRule,
    ) -> Result<Recorded>;

    /// Settle up to `limit` of the batch checks the triggers left: a batch with no
    /// unfinished session left is announced (`batch.completed`, once per endpoint and
    /// batch) at `now`. How many announcements were written.
    async fn announce_batches(&self, now: DateTime<Utc>, limit: u32) -> Result<u64>;

    /// Delete up to `limit` deliveries delivered or dead before `before`.
    async fn prune_deliveries(&self, before: DateTime<Utc>, limit: u32) -> Result<u64>;
}

/// Schedules: a tenant's schedules and the history of their fires. The fire loops of any
/// number of schedulers claim due schedules with a lease (a token until a time); what a
/// claimer records is fenced by its token. Every "now" is the caller's, so the fire
/// loop's clock can be injected.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Add a schedule.
    async fn create_schedule(&self, new: &NewSchedule) -> Result<()>;

    /// The schedule `id`, of any tenant (the caller checks whose it is).
    async fn schedule(&self, id: &str) -> Result<Option<ScheduleRow>>;

    /// A tenant's schedules by id, after `after` (an id), at most `limit`.
    async fn list_schedules(
        &self,
        tenant: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>>;

    /// Delete schedule `id` and its history; false when there was none.
    async fn delete_schedule(&self, id: &str) -> Result<bool>;

    /// Pause schedule `id` (a buffered fire is dropped), or resume it with its next fire
    /// at `next_fire_at`; false when there is none.
    async fn set_schedule_paused(
        &self,
        id: &str,
        paused: bool,
        next_fire_at: DateTime<Utc>,
    ) -> Result<bool>;

    /// Lease up to `limit` schedules due at `now` (their next fire time passed, or a
    /// buffered fire waiting) and not leased by another claimer, to `token` until
    /// `until`.
    async fn claim_schedules(
        &self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
        limit: u32,
    ) -> Result<Vec<ScheduleRow>>;

    /// Lease schedule `id`, due or not (a trigger), to `token` until `until`; `None`
    /// when there is none or another claimer holds it.
    async fn claim_schedule(
        &self,
        id: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        token: &str,
    ) -> Result<Option<ScheduleRow>>;

    /// As the holder of lease `token` on schedule `id`: record `fires` (one row per fire
    /// time; a buffered one's row becomes what it did) and `advance`, and free the lease,
    /// in one transaction. False, with nothing written, when the lease is not held.
    async fn record_fires(
        &self,
        id: &str,
        token: &str,
        fires: &[FireRow],
        advance: &Advance,
    ) -> Result<bool>;

    /// Schedule `id`'s fires newest first, before fire time `before`, at most `limit`.
    async fn list_fires(
        &self,
        id: &str,
        before: Option<DateTime<Utc>>,
        limit: u32,
    ) -> Result<Vec<FireRow>>;
}
