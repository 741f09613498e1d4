//! The session model shared by every process: statuses, the stored row, what a claim
//! returns, and the completion message published when a session ends.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use agentq_agent::schema::Usage;
use agentq_agent::spec::{ExitReason, SessionSpec};
use agentq_agent::state::Outcome;

/// Lifecycle of a session. `waiting` and `awaiting_approval` hold no lease: the event
/// they wait for re-enqueues them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    Queued,
    Running,
    /// On children or a message.
    Waiting,
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl SessionStatus {
    #[inline]
    pub fn as_str(&self) -> &'static str {
        match self {
            SessionStatus::Queued => "queued",
            SessionStatus::Running => "running",
            SessionStatus::Waiting => "waiting",
            SessionStatus::AwaitingApproval => "awaiting_approval",
            SessionStatus::Completed => "completed",
            SessionStatus::Failed => "failed",
            SessionStatus::Cancelled => "cancelled",
        }
    }

    #[inline]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => SessionStatus::Queued,
            "running" => SessionStatus::Running,
            "waiting" => SessionStatus::Waiting,
            "awaiting_approval" => SessionStatus::AwaitingApproval,
            "completed" => SessionStatus::Completed,
            "failed" => SessionStatus::Failed,
            "cancelled" => SessionStatus::Cancelled,
            _ => return None,
        })
    }

    #[inline]
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            SessionStatus::Completed | SessionStatus::Failed | SessionStatus::Cancelled
        )
    }

    /// The terminal status a finish reason maps to: a normal end (or a yield) completes,
    /// a cancel cancels, every limit and error fails.
    pub fn for_exit(reason: ExitReason) -> Self {
        match reason {
            ExitReason::Stop | ExitReason::Yielded => SessionStatus::Completed,
            ExitReason::Interrupted => SessionStatus::Cancelled,
            ExitReason::MaxIterations
            | ExitReason::Timeout
            | ExitReason::Error
            | ExitReason::BudgetExhausted
            | ExitReason::Stuck => SessionStatus::Failed,
        }
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a queue entry was added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnqueueReason {
    New,
    Resume,
    Retry,
}

impl EnqueueReason {
    #[inline]
    pub fn as_str(&self) -> &'static str {
        match self {
            EnqueueReason::New => "new",
            EnqueueReason::Resume => "resume",
            EnqueueReason::Retry => "retry",
        }
    }

    #[inline]
    pub fn parse(s: &str) -> Self {
        match s {
            "resume" => EnqueueReason::Resume,
            "retry" => EnqueueReason::Retry,
            _ => EnqueueReason::New,
        }
    }
}

/// A session to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewSession {
    pub id: String,
    pub spec: SessionSpec,
    pub queue: String,
    pub parent_id: Option<String>,
    /// The tree's root; equals `id` for a session without a parent.
    pub root_id: String,
    pub depth: u32,
    pub idempotency_key: Option<String>,
    /// Hash of the request that came with `idempotency_key`: a repeat of the key with
    /// another request is a conflict, not the first session.
    pub idempotency_hash: Option<String>,
    /// Who owns the session (children inherit their parent's tenant).
    pub tenant: String,
    /// Scheduling: priority, batch, cap, and whether it waits for the dispatcher.
    #[serde(default)]
    pub sched: crate::scheduling::Placement,
    /// Files put in the tree's workspace with the session, over those of
    /// `workspace_from` (paths already checked against the path rules and the policy).
    #[serde(default)]
    pub files: Vec<crate::workspace::InputFile>,
    /// A session of the same tenant whose tree's committed files the new tree starts with
    /// (a copy: later changes of either tree do not reach the other). Another tenant's, or
    /// an unknown session, is `Error::NotFound` (of agentq-core).
    #[serde(default)]
    pub workspace_from: Option<String>,
}

impl NewSession {
    /// A root session with a fresh time-ordered id.
    pub fn root(spec: SessionSpec, queue: impl Into<String>) -> Self {
        let id = new_session_id();
        NewSession {
            root_id: id.clone(),
            id,
            spec,
            queue: queue.into(),
            parent_id: None,
            depth: 0,
            idempotency_key: None,
            idempotency_hash: None,
            tenant: crate::auth::DEFAULT_TENANT.to_string(),
            sched: crate::scheduling::Placement::default(),
            files: Vec::new(),
            workspace_from: None,
        }
    }

    /// The same session, owned by `tenant`.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }

    /// The same root session with an idempotency key, its id minted again in the key's
    /// partition (`crate::shard`): a retry of the same submit lands on the same shard,
    /// where the key finds the first one. Call after [`NewSession::with_tenant`].
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        let key = key.into();
        self.id = crate::shard::id_in(crate::shard::key_partition(&self.tenant, &key));
        self.root_id = self.id.clone();
        self.idempotency_key = Some(key);
        self
    }
}

/// Time-ordered (UUID v7) so that ids sort by creation and index well, in a random
/// partition of the shard map's current generation (`crate::shard`).
pub fn new_session_id() -> String {
    crate::shard::fresh_id()
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRow {
    pub id: String,
    pub root_id: String,
    pub parent_id: Option<String>,
    pub depth: u32,
    pub queue: String,
    pub status: SessionStatus,
    pub finish_reason: Option<ExitReason>,
    pub spec: SessionSpec,
    pub iteration: u32,
    pub usage: Usage,
    pub result: Option<String>,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_epoch: i64,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Claims since the session last ran cleanly; too many means its entry keeps
    /// killing workers.
    pub attempts: u32,
    /// Times a worker took it over from one that died holding it (its lease expired).
    #[serde(default)]
    pub takeovers: u32,
    /// The model its worker chose: the spec's, or that worker's default when the spec
    /// names none. `None` until a worker has checkpointed it.
    #[serde(default)]
    pub model_used: Option<String>,
    pub cancel_requested: bool,
    pub idempotency_key: Option<String>,
    /// Hash of the request that came with the idempotency key (`None` on rows from
    /// before request hashes were stored).
    #[serde(default)]
    pub idempotency_hash: Option<String>,
    /// The tenant that owns the session.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Bumped by everything that may wake the session (child results, messages,
    /// approvals). A run that suspends passes the value it saw at its claim: anything
    /// newer sends the session straight back to the queue.
    #[serde(default)]
    pub wake_seq: i64,
    /// While awaiting approval: when an unanswered request counts as denied.
    #[serde(default)]
    pub approval_deadline: Option<DateTime<Utc>>,
    /// Inbox position of the last `enqueue` message started as a follow-up turn.
    #[serde(default)]
    pub followup_cursor: u64,
    /// Calls of the latest response that a run held for a human decision and that have
    /// not run since (the loop's `not_started`). Only meaningful while the session is
    /// unfinished: see [`SessionRow::may_hold_calls`].
    #[serde(default)]
    pub held_calls: Vec<String>,
    /// While `waiting` or `awaiting_approval`: what for (see [`crate::wait`]).
    #[serde(default)]
    pub wait_reason: Option<crate::wait::WaitReason>,
    /// While waiting for a rate limit: when the sweeper puts it back on the queue.
    #[serde(default)]
    pub wake_at: Option<DateTime<Utc>>,
    /// 0 (lowest) to 9; the dispatcher hands out higher priorities first.
    #[serde(default = "crate::scheduling::default_priority")]
    pub priority: u8,
    /// The batch request that created the session, if any.
    #[serde(default)]
    pub batch_id: Option<String>,
    /// Times it was redriven after a failure (`POST /v1/sessions/{id}/retry`).
    #[serde(default)]
    pub retries: u32,
    /// Queued without a stream entry: it waits in the store for the dispatcher.
    #[serde(default)]
    pub held: bool,
    /// Of a tenant or batch with a cap on running sessions (or a sub-agent of such a
    /// tree): each time it is queued again it is held for the dispatcher, which keeps it
    /// within the cap.
    #[serde(default)]
    pub capped: bool,
    /// Set by a claim: whether the session's tree had committed files then. A claim of a
    /// tree without any (most sessions) need not read its manifest, which would double
    /// the statements of a first claim. `false` on every other read.
    #[serde(default)]
    pub has_workspace: bool,
    /// A fork's origin (`POST /v1/sessions/{id}/fork`): the session whose first
    /// `fork_at` messages begin this one's history, read from there, never copied.
    #[serde(default)]
    pub forked_from: Option<String>,
    #[serde(default)]
    pub fork_at: Option<u32>,
}

impl SessionRow {
    /// Whether the session may have calls waiting for a decision, so that a reader looks
    /// them up (`InboxStore::pending_approvals`). A finished session holds none,
    /// whatever its last run recorded (a cancel closes held calls without a decision).
    pub fn may_hold_calls(&self) -> bool {
        !self.held_calls.is_empty() && !self.status.is_terminal()
    }
}

fn default_tenant() -> String {
    crate::auth::DEFAULT_TENANT.to_string()
}

/// Whether a session whose row shows `wake_seq` may have inbox items past `cursor`: every
/// item's position is the `wake_seq` it set, so nothing is past the cursor unless
/// `wake_seq` is.
#[inline]
pub fn inbox_past(wake_seq: i64, cursor: u64) -> bool {
    u64::try_from(wake_seq).map_or(true, |w| w > cursor)
}

/// One item of a session's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxItem {
    pub seq: u64,
    pub kind: String,
    pub payload: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// What delivering an inbox item did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// False when an item with the same dedupe key was there already.
    pub inserted: bool,
    /// The item's position (the existing one's when not inserted: 0).
    pub seq: u64,
    /// The session went from a waiting status to `queued`: the caller must enqueue it.
    pub woken: bool,
    /// The session went from a waiting status to `queued` held for the dispatcher (it is
    /// [`SessionRow::capped`]): nothing to enqueue.
    pub held: bool,
    pub queue: String,
    /// The session's status before the delivery.
    pub status: SessionStatus,
}

/// A session a waker sent back to the queue: the caller enqueues it, unless it is `held`
/// for the dispatcher ([`SessionRow::capped`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Woken {
    pub id: String,
    pub queue: String,
    pub held: bool,
}

/// What recording an approval decision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalRecorded {
    /// Recorded; `woken` when the session went back to the queue (enqueue it), `held`
    /// when it went back held for the dispatcher (nothing to enqueue).
    Recorded {
        woken: bool,
        held: bool,
        queue: String,
    },
    /// A decision for that call existed already.
    AlreadyDecided,
    /// The session is finished.
    Finished(SessionStatus),
    NotFound,
}

/// The `agentq` key of a child's `spec.metadata`: how its parent spawned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct SpawnInfo {
    pub label: String,
    /// The parent suspends until the child finishes, and gets its answer as the
    /// `spawn_agent` result.
    pub wait: bool,
    pub tool_call_id: String,
}

impl SpawnInfo {
    pub fn of(spec: &agentq_agent::spec::SessionSpec) -> Option<SpawnInfo> {
        spec.metadata
            .get("agentq")
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }
}

/// Proof of ownership: every write a worker makes is conditional on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    pub session_id: String,
    pub root_id: String,
    pub owner: String,
    pub epoch: i64,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The caller owns the session now; here is its state to resume from.
    Acquired {
        lease: Lease,
        state: Box<agentq_agent::state::SessionState>,
        row: Box<SessionRow>,
    },
    /// Already finished, with settle steps not marked done (its worker may have died
    /// between its end and its announcement): nothing to run; settle it again (tell its
    /// family, start a follow-up, publish its completion) and ack the entry.
    Terminal(Box<SessionRow>),
    /// Already finished and settled (announced): nothing to run or publish; ack the entry.
    /// A duplicate entry of a finished session must not publish its completion again.
    Settled,
    /// Another worker holds a live lease.
    Busy,
    /// Not runnable now (waiting on a child or an approval).
    NotRunnable(SessionStatus),
    /// Claimed too many times without finishing: the caller should dead-letter it.
    Exhausted(Box<SessionRow>),
    NotFound,
}

/// The message published on `agentq:done`, `agentq:done:<id>` and `agentq:completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub session_id: String,
    pub status: SessionStatus,
    pub finish_reason: Option<ExitReason>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub iterations: u32,
    pub usage: CompletionUsage,
    pub parent_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompletionUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Completion {
    pub fn from_row(row: &SessionRow) -> Self {
        Completion {
            session_id: row.id.clone(),
            status: row.status,
            finish_reason: row.finish_reason,
            result: row.result.clone(),
            error: row.error.clone(),
            iterations: row.iteration,
            usage: CompletionUsage {
                input_tokens: row.usage.input_tokens,
                output_tokens: row.usage.output_tokens,
            },
            parent_id: row.parent_id.clone(),
        }
    }
}

/// Filter for listing sessions.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only sessions of this tenant; `None` lists every tenant (the admin's view).
    pub tenant: Option<String>,
    pub status: Option<SessionStatus>,
    pub parent_id: Option<String>,
    /// Only the sessions one `POST /v1/sessions/batch` request created (or joined).
    pub batch_id: Option<String>,
    /// Only sessions that finished for this reason.
    pub finish_reason: Option<ExitReason>,
    /// Only sessions waiting (`waiting` or `awaiting_approval`) for this.
    pub wait_reason: Option<crate::wait::WaitReason>,
    /// Only sessions of this queue.
    pub queue: Option<String>,
    /// Only sessions created at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only sessions created before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only sessions whose id starts with this, or whose prompt holds it (case-insensitive:
    /// any letter on Postgres, ASCII letters on SQLite). Matched literally: `%`, `_` and
    /// `\` are no wildcards.
    pub text: Option<String>,
    pub limit: u32,
    /// Return sessions with an id strictly below this one (ids are time-ordered; newest
    /// first), or strictly above it with [`ListFilter::oldest_first`].
    pub cursor: Option<String>,
    /// Oldest first (ascending ids) instead of newest first.
    pub oldest_first: bool,
}

/// Outcome of a cancel request.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelResult {
    /// It was queued (or waiting) and is now cancelled without running.
    CancelledNow(Box<SessionRow>),
    /// It is running: the owner must be told to stop.
    Requested(Box<SessionRow>),
    AlreadyFinished(Box<SessionRow>),
    NotFound,
}

/// Re-exported so the store can turn an outcome into a terminal row.
pub fn outcome_status(o: &Outcome) -> SessionStatus {
    SessionStatus::for_exit(o.reason)
}
