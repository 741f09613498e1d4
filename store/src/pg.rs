//! The Postgres [`Store`]: owns the `sessions`, `session_specs`, `messages`, `inbox` and
//! `approvals` tables (`migrations/`), the lease protocol on them (claim, fenced
//! checkpoint, heartbeat, release), its connection pools and the embedded migrator.
//!
//! Every statement is runtime-checked (`sqlx::query` + `FromRow`), so the build needs no
//! database; `store/tests/pg_store.rs` runs each one against a real server. The statements
//! it shares with the SQLite store, and the mapping of rows to the model, are in
//! `crate::sql`; what only Postgres can express is here: the group commit and the
//! heartbeat as one array-driven statement each (`batch`), batched creation
//! (`create`), and deliveries and decisions as one statement under the row lock.
//!
//! Leases: a claim bumps `lease_epoch`; every later write of the worker is conditional on
//! `(lease_owner, lease_epoch)`, so a worker that was paused past its lease and replaced
//! finds out at its next write ([`Error::LeaseLost`]) and writes nothing. A checkpoint is
//! one statement (one round trip): the row's scalars plus only the new messages.
//!
//! Cancellation of a running session sets `cancel_requested`; the owner learns it from its
//! heartbeat. A claim does not refuse a session with the flag set (its previous owner may
//! have died before acting on it): the claimer sees `row.cancel_requested` and finishes
//! the session as interrupted.

mod batch;
mod budget;
mod create;
mod workspace;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::state::SessionState;

use crate::auth::{ApiKey, NewApiKey, Scope};
use crate::budget::{
    HoldRefused, Ledger, ModelUsage, SpawnLimits, Spawned, Spend, TenantBudget, TenantHold,
};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::{
    ApprovalRecorded, CancelResult, Claim, Delivered, InboxItem, Lease, ListFilter, NewSession,
    SessionRow, SessionStatus, Woken,
};
use crate::protocol::{InboxKind, InboxPayload};
use crate::rowconv::{WokenRow, check_applied, parse_status, to_i64, unique_as_conflict, woken};
use crate::scheduling::{ActiveCount, Candidate};
use crate::sql::escape::{escape_opt, escape_text, stored_ids, stored_json};
use crate::sql::record::{InboxRecord, KeyRecord, PendingRow, SessionRecord, StoredMessage};
use crate::sql::statements::{self, APPLIED_MIGRATIONS, POSTGRES as SQL};
use crate::sql::{outcome, read};
use crate::store::{
    BudgetStore, Committed, InboxStore, KeyStore, LeaseStatus, LeaseStore, QueueCreate, QueueStore,
    RetryResult, SessionStore, Store, SweepStore, checkpoint_alone,
};
use crate::wait::WaitReason;

/// Pooled connections idle at least this long are pinged before use.
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The migrations this binary was built with.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// The Postgres store. Cheap to clone (the pools are shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The group commit's and the heartbeat's own connections. They are kept apart so that
    /// a burst of claims or reads queued for the main pool never holds up the checkpoints
    /// that every session in flight waits on, nor the heartbeat that keeps its lease.
    /// They also run their statements with generic plans (see [`GENERIC_PLANS`]).
    writer: PgPool,
    /// Where the bytes of blobs live when not in the `blobs` table (see
    /// [`PgStore::with_objects`]).
    objects: Option<std::sync::Arc<crate::blob::s3::S3Blobs>>,
}

/// Writer connections [`PgStore::connect`] allows: two commits in flight (the worker's
/// default) and the heartbeat.
pub const DEFAULT_WRITER_CONNECTIONS: u32 = 3;

/// Session settings of the writer connections (and of a worker's main pool). The batched
/// checkpoint and the heartbeat look every row up by its key; planned afresh for each call
/// (Postgres's choice while a connection has run a statement fewer than five times, and
/// whenever the array lengths make a custom plan look cheaper) the checkpoint cost about a
/// millisecond of Postgres CPU per commit, about a third of Postgres's CPU per iteration. A
/// generic plan is made once per connection and made again whenever `sessions` or
/// `messages` is analyzed, so it follows the tables as they grow.
const GENERIC_PLANS: &str = "SET plan_cache_mode = force_generic_plan";

/// Connections the server can still accept from ordinary roles.
const HEADROOM: &str = "SELECT (current_setting('max_connections')::int \
    - current_setting('superuser_reserved_connections')::int \
    - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'))::bigint";

/// What a fresh backend's first claim and first reads would load: the session tables'
/// and their indexes' catalog entries (a simple query, planned and run on no row; the
/// nil uuid, so that no cast of the key can fail).
const WARM_UP: &str = "SELECT 1 FROM sessions s JOIN session_specs p ON p.root_id = s.root_id \
    AND p.id = s.id JOIN messages m ON m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
    WHERE s.id = '00000000-0000-0000-0000-000000000000' \
      AND s.root_id = '00000000-0000-0000-0000-000000000000'";

impl PgStore {
    /// Open a pool of `max_connections` for everything but checkpoints and heartbeats,
    /// and up to [`DEFAULT_WRITER_CONNECTIONS`] for those, opened only when first used (a
    /// scheduler or a CLI command never checkpoints).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let pool = Self::options(max_connections).connect(url).await?;
        let writer = Self::generic_plan_options(DEFAULT_WRITER_CONNECTIONS).connect_lazy(url)?;
        Ok(Self {
            pool,
            writer,
            objects: None,
        })
    }

    /// Open the pools, with `writers` connections for checkpoints and heartbeats (a
    /// worker's commits in flight, plus one for its heartbeat), opened up front: they are
    /// busy whenever sessions run, and the first commits after a start should not wait
    /// for a connection. Connections are checked before use, so after a database restart
    /// the pools replace dead connections by themselves; an acquire waits at most 5 s, so
    /// an outage surfaces as a (retryable) [`Error::Db`] instead of a hang.
    pub async fn connect_with_writers(
        url: &str,
        max_connections: u32,
        writers: u32,
    ) -> Result<Self> {
        Self::open(url, Self::options(max_connections), writers).await
    }

    /// A worker's store: [`PgStore::connect_with_writers`], with generic plans on the main
    /// pool too. Everything a worker runs there (claims, session and message reads, inbox
    /// and child writes) finds its rows by key, so a plan never depends on the values; and
    /// Postgres plans a statement afresh on each connection until it has run there five
    /// times, which across a worker's up to 64 connections is most claims of a burst
    /// (about 8 % of Postgres's CPU per iteration in `agentq bench`). Not for a store that
    /// also serves the API, whose listings filter on skewed columns (`status`).
    pub async fn connect_for_worker(url: &str, max_connections: u32, writers: u32) -> Result<Self> {
        Self::open(url, Self::generic_plan_options(max_connections), writers).await
    }

    async fn open(url: &str, main: PgPoolOptions, writers: u32) -> Result<Self> {
        let pool = main.connect(url).await?;
        let writers = writers.max(1);
        let writer = Self::generic_plan_options(writers)
            .min_connections(writers)
            .connect(url)
            .await?;
        Ok(Self {
            pool,
            writer,
            objects: None,
        })
    }

    fn generic_plan_options(max_connections: u32) -> PgPoolOptions {
        Self::options(max_connections).after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, GENERIC_PLANS).await?;
                Ok(())
            })
        })
    }

    fn options(max_connections: u32) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(5))
            // A liveness ping only for a connection that sat idle (maybe across a
            // Postgres restart): one in steady use proves itself with every statement,
            // and a ping on every acquire was ~8 % of a busy worker's CPU. A connection
            // that broke while in use fails its next statement, which callers retry.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
    }

    /// Open every connection the main pool may hold, and have each backend load the
    /// catalog entries of the session tables, so that a worker's first burst of sessions
    /// (right after a deploy, or when an autoscaler adds it under load) does not pay for
    /// Postgres backends starting under it. The connections close again after the pool's
    /// idle timeout (10 minutes) if nothing uses them. Takes at most half of the
    /// connections the server has left, so that on a server sized too small for every
    /// pool at once, the other workers and the schedulers can still connect.
    pub async fn open_all(&self) -> Result<()> {
        let (free,): (i64,) = sqlx::query_as(HEADROOM).fetch_one(&self.pool).await?;
        let n = self
            .pool
            .options()
            .get_max_connections()
            .min(u32::try_from(free / 2).unwrap_or(0))
            .max(self.pool.size());
        let conns = futures::future::try_join_all((0..n).map(|_| self.pool.acquire())).await?;
        futures::future::try_join_all(conns.into_iter().map(|mut c| async move {
            sqlx::Executor::execute(&mut *c, WARM_UP).await?;
            Ok::<_, sqlx::Error>(())
        }))
        .await?;
        Ok(())
    }

    /// A store on one pool for everything.
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            writer: pool.clone(),
            pool,
            objects: None,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The connections of checkpoints and heartbeats.
    pub fn writer_pool(&self) -> &PgPool {
        &self.writer
    }

    /// Apply the embedded migrations (idempotent; sqlx takes an advisory lock, so
    /// concurrent callers are safe).
    pub async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn get_record(&self, id: &str) -> Result<Option<SessionRecord>> {
        read::session(&self.pool, &SQL, id).await
    }

    /// After a fenced write matched nothing: did an earlier attempt of the same write
    /// commit? (See [`outcome::gave_up`].)
    async fn gave_up_lease(&self, lease: &Lease, want: fn(SessionStatus) -> bool) -> Result<bool> {
        let row: Option<outcome::LeaseRow> = sqlx::query_as(&SQL.lease_of)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(outcome::gave_up(row, lease, want))
    }
}

/// Whole seconds and fractions, for `make_interval(secs => …)`.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Append to an inbox under the session's row lock: the item's position is the bumped
/// `wake_seq`, so positions increase in commit order.
const DELIVER: &str = "
WITH p AS (
    SELECT root_id, id, queue, status, wake_seq FROM sessions WHERE id = $1 FOR UPDATE
), ins AS (
    INSERT INTO inbox (root_id, session_id, seq, kind, dedupe, payload)
    SELECT p.root_id, p.id, p.wake_seq + 1, $2, $3, $4 FROM p
    ON CONFLICT (root_id, session_id, dedupe) DO NOTHING
    RETURNING seq
), upd AS (
    UPDATE sessions s SET
        wake_seq = ins.seq,
        status = CASE WHEN s.status = ANY($5::text[]) THEN 'queued' ELSE s.status END,
        enqueued_at = CASE WHEN s.status = ANY($5::text[]) THEN NULL ELSE s.enqueued_at END,
        held = CASE WHEN s.status = ANY($5::text[]) THEN s.capped ELSE s.held END,
        updated_at = now()
    FROM ins WHERE s.id = $1
    RETURNING s.status, s.held
)
SELECT p.queue, p.status, (SELECT seq FROM ins), (SELECT status FROM upd),
       COALESCE((SELECT held FROM upd), false) FROM p";

const DECIDE: &str = "
WITH p AS (
    SELECT root_id, id, queue, status FROM sessions WHERE id = $1 FOR UPDATE
), ins AS (
    INSERT INTO approvals (root_id, session_id, tool_call_id, approve, reason)
    SELECT p.root_id, p.id, $2, $3, $4 FROM p
    WHERE p.status NOT IN ('completed', 'failed', 'cancelled')
    ON CONFLICT DO NOTHING
    RETURNING 1
), upd AS (
    UPDATE sessions s SET
        wake_seq = s.wake_seq + 1,
        status = CASE WHEN s.status = 'awaiting_approval' THEN 'queued' ELSE s.status END,
        enqueued_at = CASE WHEN s.status = 'awaiting_approval' THEN NULL ELSE s.enqueued_at END,
        held = CASE WHEN s.status = 'awaiting_approval' THEN s.capped ELSE s.held END,
        updated_at = now()
    FROM ins WHERE s.id = $1
    RETURNING s.status, s.held
)
SELECT p.queue, p.status, EXISTS (SELECT 1 FROM ins), (SELECT status FROM upd),
       COALESCE((SELECT held FROM upd), false) FROM p";

#[async_trait]
impl KeyStore for PgStore {
    async fn create_key(&self, key: &NewApiKey) -> Result<ApiKey> {
        let rec: KeyRecord = sqlx::query_as(&SQL.insert_key)
            .bind(&key.id)
            .bind(&key.tenant)
            .bind(Scope::join(&key.scopes))
            .bind(key.label.as_deref())
            .bind(&key.secret_hash)
            .bind(key.expires_at)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| unique_as_conflict(e, &format!("api key {}", key.id)))?;
        rec.into_key()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKey>> {
        let recs: Vec<KeyRecord> = sqlx::query_as(&SQL.list_keys).fetch_all(&self.pool).await?;
        recs.into_iter().map(KeyRecord::into_key).collect()
    }

    async fn revoke_key(&self, id: &str) -> Result<Option<ApiKey>> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.revoke_key)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        rec.map(KeyRecord::into_key).transpose()
    }

    async fn key(&self, id: &str) -> Result<Option<ApiKey>> {
        let rec: Option<KeyRecord> = sqlx::query_as(&SQL.key_by_id)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        rec.map(KeyRecord::into_key).transpose()
    }
}

#[async_trait]
impl BudgetStore for PgStore {
    async fn spawn_session(&self, new: &NewSession, limits: &SpawnLimits) -> Result<Spawned> {
        budget::spawn_session(&self.pool, new, limits).await
    }

    async fn ledger(&self, id: &str) -> Result<Option<Ledger>> {
        budget::ledger(&self.pool, id).await
    }

    async fn return_budget(&self, id: &str) -> Result<bool> {
        budget::return_budget(&self.pool, id).await
    }

    async fn unreturned_budgets(&self, limit: u32) -> Result<Vec<String>> {
        budget::unreturned(&self.pool, limit).await
    }

    async fn tree_usage(&self, root_id: &str) -> Result<Vec<ModelUsage>> {
        budget::tree_usage(&self.pool, root_id).await
    }

    async fn add_tenant_spend(&self, tenant: &str, day: &str, spend: Spend) -> Result<()> {
        budget::add_spend(&self.pool, tenant, day, spend).await
    }

    async fn tenant_spend(&self, tenant: &str, from: &str, to: &str) -> Result<Spend> {
        budget::spend(&self.pool, tenant, from, to).await
    }

    async fn hold_tenant_spend(
        &self,
        hold: &TenantHold,
        budgets: &[TenantBudget],
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<HoldRefused>> {
        budget::hold(&self.pool, hold, budgets, now).await
    }

    async fn settle_tenant_hold(
        &self,
        id: &str,
        tenant: &str,
        day: &str,
        spend: Spend,
    ) -> Result<()> {
        budget::settle_hold(&self.pool, id, tenant, day, spend).await
    }

    async fn set_tenant_budget(&self, b: &TenantBudget) -> Result<()> {
        budget::set_budget(&self.pool, b).await
    }

    async fn tenant_budgets(&self) -> Result<Vec<TenantBudget>> {
        budget::budgets(&self.pool).await
    }
}

#[async_trait]
impl Store for PgStore {
    async fn check_schema(&self) -> Result<()> {
        let applied: Option<Vec<i64>> = match sqlx::query_scalar(APPLIED_MIGRATIONS)
            .fetch_all(&self.pool)
            .await
        {
            Ok(v) => Some(v),
            // 42P01 undefined_table: never migrated.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => None,
            Err(e) => return Err(e.into()),
        };
        check_applied(&MIGRATOR, applied)
    }
}

#[async_trait]
impl SessionStore for PgStore {
    async fn create_session(&self, new: &NewSession) -> Result<(SessionRow, bool)> {
        let out = self.create_sessions(std::slice::from_ref(new)).await?;
        outcome::only_created(new, out)
    }

    async fn create_sessions(&self, new: &[NewSession]) -> Result<Vec<(SessionRow, bool)>> {
        create::create_sessions(&self.pool, new, self.objects.as_deref()).await
    }

    async fn get(&self, id: &str) -> Result<Option<SessionRow>> {
        self.get_record(id)
            .await?
            .map(SessionRecord::into_row)
            .transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<SessionRow>> {
        let rows: Vec<SessionRecord> = statements::list::<sqlx::Postgres>(filter)
            .build_query_as()
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(SessionRecord::into_row).collect()
    }

    async fn messages(&self, id: &str) -> Result<Vec<Message>> {
        read::history(&self.pool, &SQL, id).await
    }

    async fn fail(&self, id: &str, reason: &str) -> Result<Option<SessionRow>> {
        let failed: Option<SessionRecord> = sqlx::query_as(&SQL.fail)
            .bind(id)
            .bind(escape_text(reason))
            .fetch_optional(&self.pool)
            .await?;
        match failed {
            Some(rec) => rec.into_row().map(Some),
            // Missing, or finished already: leave it as it is.
            None => self.get(id).await,
        }
    }

    async fn retry(&self, id: &str, hold: bool) -> Result<RetryResult> {
        // Under the tree's lock: a retried sub-agent draws from its tree again, in the
        // transaction that queues it (`budget::reopen_in`).
        let mut tx = self.pool.begin().await?;
        let Some(root) = budget::lock_root(&mut tx, id).await? else {
            return Ok(RetryResult::NotFound);
        };
        let retried: Option<SessionRecord> = sqlx::query_as(&SQL.retry)
            .bind(id)
            .bind(hold)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(rec) = retried else {
            tx.rollback().await?;
            return Ok(outcome::not_retried(self.get(id).await?));
        };
        let row = rec.into_row()?;
        budget::reopen_in(&mut tx, &row, &root).await?;
        tx.commit().await?;
        Ok(RetryResult::Retried(Box::new(row)))
    }

    async fn request_cancel(&self, id: &str) -> Result<CancelResult> {
        let changed: Option<SessionRecord> = sqlx::query_as(&SQL.cancel)
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        match changed {
            Some(rec) => outcome::cancel_changed(rec),
            None => outcome::cancel_unchanged(id, self.get_record(id).await?),
        }
    }

    async fn ping(&self) -> Result<()> {
        // Both pools (the writers' once it has connections): after an outage, each gives
        // up its dead connections as it is used.
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        if self.writer.size() > 0 {
            sqlx::query("SELECT 1").execute(&self.writer).await?;
        }
        Ok(())
    }

    async fn count_unfinished(&self) -> Result<Vec<(SessionStatus, u64)>> {
        read::unfinished(&self.pool).await
    }
}

#[async_trait]
impl LeaseStore for PgStore {
    async fn claim(
        &self,
        id: &str,
        owner: &str,
        ttl: Duration,
        max_attempts: u32,
    ) -> Result<Claim> {
        let claimed: Option<SessionRecord> = sqlx::query_as(&SQL.claim)
            .bind(id)
            .bind(owner)
            .bind(secs(ttl))
            .fetch_optional(&self.pool)
            .await?;
        let Some(rec) = claimed else {
            return outcome::claim_refused(self.get_record(id).await?);
        };
        if outcome::exhausted(&rec, max_attempts) {
            return outcome::exhausted_claim(rec);
        }
        // A second statement, after the claim committed: from here on the previous holder
        // is fenced off, so this read sees everything it will ever have written. The
        // claimed row is the latest version (the claim waited for any write in flight).
        let messages: Vec<StoredMessage> = if rec.has_stored_history() {
            sqlx::query_as(&SQL.claim_history)
                .bind(&rec.root_id)
                .bind(&rec.id)
                .fetch_all(&self.pool)
                .await?
        } else {
            Vec::new()
        };
        outcome::acquired(rec, owner, messages)
    }

    async fn checkpoint(&self, lease: &Lease, state: &SessionState, from: usize) -> Result<()> {
        checkpoint_alone(self, lease, state, from).await
    }

    async fn checkpoint_batch(&self, batch: &[&Checkpoint]) -> Result<Vec<Result<Committed>>> {
        self.commit_batch(batch).await
    }

    async fn heartbeat(&self, leases: &[Lease], ttl: Duration) -> Result<Vec<LeaseStatus>> {
        self.extend_leases(leases, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let done = sqlx::query(&SQL.release)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(&lease.owner)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if done > 0
            || self
                .gave_up_lease(lease, |s| s == SessionStatus::Queued)
                .await?
        {
            return Ok(());
        }
        Err(Error::LeaseLost(lease.session_id.clone()))
    }

    async fn suspend(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let reason = match status {
            SessionStatus::AwaitingApproval => WaitReason::Approval,
            _ => WaitReason::Children,
        };
        self.suspend_with(lease, status, seen_wake, approval_deadline, reason, None)
            .await
    }

    async fn suspend_for(
        &self,
        lease: &Lease,
        seen_wake: i64,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        self.suspend_with(
            lease,
            SessionStatus::Waiting,
            seen_wake,
            None,
            reason,
            wake_at,
        )
        .await
    }
}

impl PgStore {
    async fn suspend_with(
        &self,
        lease: &Lease,
        status: SessionStatus,
        seen_wake: i64,
        approval_deadline: Option<DateTime<Utc>>,
        reason: WaitReason,
        wake_at: Option<DateTime<Utc>>,
    ) -> Result<SessionRow> {
        let rec: Option<SessionRecord> = sqlx::query_as(&SQL.suspend)
            .bind(&lease.root_id)
            .bind(&lease.session_id)
            .bind(lease.epoch)
            .bind(status.as_str())
            .bind(seen_wake)
            .bind(approval_deadline)
            .bind(&lease.owner)
            .bind(reason.as_str())
            .bind(wake_at)
            .fetch_optional(&self.pool)
            .await?;
        match rec {
            Some(r) => r.into_row(),
            None => Err(Error::LeaseLost(lease.session_id.clone())),
        }
    }
}

#[async_trait]
impl InboxStore for PgStore {
    async fn deliver(
        &self,
        session_id: &str,
        kind: InboxKind,
        dedupe: &str,
        payload: &InboxPayload,
        wake: &[SessionStatus],
    ) -> Result<Option<Delivered>> {
        let wake: Vec<&str> = wake.iter().map(SessionStatus::as_str).collect();
        let row: Option<(String, String, Option<i64>, Option<String>, bool)> =
            sqlx::query_as(DELIVER)
                .bind(session_id)
                .bind(kind.as_str())
                .bind(dedupe)
                .bind(stored_json(&payload.to_value()?)?)
                .bind(&wake)
                .fetch_optional(&self.pool)
                .await?;
        let Some((queue, old, seq, new, held)) = row else {
            return Ok(None);
        };
        let queued = new.as_deref() == Some(SessionStatus::Queued.as_str());
        outcome::delivered(queue, parse_status(&old)?, seq, queued, held).map(Some)
    }

    async fn inbox(
        &self,
        session_id: &str,
        kinds: &[InboxKind],
        after: u64,
    ) -> Result<Vec<InboxItem>> {
        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let rows: Vec<InboxRecord> = sqlx::query_as(&SQL.inbox)
            .bind(session_id)
            .bind(&kinds)
            .bind(to_i64(after, "after")?)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(InboxRecord::into_item).collect()
    }

    async fn decide_approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
        approve: bool,
        reason: Option<&str>,
    ) -> Result<ApprovalRecorded> {
        let row: Option<(String, String, bool, Option<String>, bool)> = sqlx::query_as(DECIDE)
            .bind(session_id)
            .bind(escape_text(tool_call_id).as_ref())
            .bind(approve)
            .bind(escape_opt(reason))
            .fetch_optional(&self.pool)
            .await?;
        let Some((queue, old, inserted, new, held)) = row else {
            return Ok(ApprovalRecorded::NotFound);
        };
        let old = parse_status(&old)?;
        let woken = old == SessionStatus::AwaitingApproval
            && new.as_deref() == Some(SessionStatus::Queued.as_str());
        Ok(outcome::approval_recorded(
            queue, old, inserted, woken, held,
        ))
    }

    async fn approval(
        &self,
        session_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(bool, Option<String>)>> {
        read::approval(&self.pool, &SQL, session_id, tool_call_id).await
    }

    async fn pending_approvals(&self, session_id: &str, held: &[String]) -> Result<Vec<ToolCall>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<PendingRow> = sqlx::query_as(&SQL.pending_approvals)
            .bind(session_id)
            .bind(stored_ids(held))
            .fetch_all(&self.pool)
            .await?;
        Ok(outcome::pending_approvals(rows, held))
    }

    async fn follow_up(
        &self,
        session_id: &str,
        text: &str,
        consume: Option<u64>,
    ) -> Result<Option<SessionRow>> {
        let mut tx = self.pool.begin().await?;
        // Under the tree's lock: a re-opened sub-agent draws from its tree again, in the
        // transaction that queues it (`budget::reopen_in`).
        let Some(root) = budget::lock_root(&mut tx, session_id).await? else {
            return Ok(None);
        };
        let rec: Option<SessionRecord> = sqlx::query_as(&SQL.follow_up)
            .bind(session_id)
            .bind(to_i64(consume.unwrap_or(0), "consume")?)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(rec) = rec else {
            tx.rollback().await?;
            return Ok(None);
        };
        // The update bumped `history_len`, so the new message's seq is one less.
        let (root_id, id, seq) = (rec.root_id.clone(), rec.id.clone(), rec.history_len);
        let row = rec.into_row()?;
        budget::reopen_in(&mut tx, &row, &root).await?;
        sqlx::query(&SQL.follow_up_message)
            .bind(&root_id)
            .bind(&id)
            .bind(stored_json(&Message::user(text))?)
            .bind(seq.map(|n| n - 1))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}

#[async_trait]
impl QueueStore for PgStore {
    async fn create_queue(&self, name: &str, limit: usize) -> Result<QueueCreate> {
        let mut tx = self.pool.begin().await?;
        // Schedulers creating queues at once take turns, so the count they check holds.
        sqlx::query("LOCK TABLE queues IN SHARE ROW EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await?;
        let exists: i64 = sqlx::query_scalar(&SQL.queue_exists)
            .bind(name)
            .fetch_one(&mut *tx)
            .await?;
        if exists > 0 {
            return Ok(QueueCreate::Exists);
        }
        let added = sqlx::query(&SQL.insert_queue)
            .bind(name)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(if added > 0 {
            QueueCreate::Created
        } else {
            QueueCreate::Full
        })
    }

    async fn stored_queues(&self) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(&SQL.stored_queues)
            .fetch_all(&self.pool)
            .await?)
    }
}

#[async_trait]
impl SweepStore for PgStore {
    async fn mark_enqueued(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query(&SQL.mark_enqueued)
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn reset_enqueued(&self, queue: &str) -> Result<u64> {
        let n = sqlx::query(&SQL.reset_enqueued)
            .bind(queue)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n)
    }

    async fn forget_expired_entries(&self, grace: Duration, limit: u32) -> Result<u64> {
        let n = sqlx::query(&SQL.forget_expired)
            .bind(secs(grace))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n)
    }

    async fn unenqueued(&self, age: Duration, limit: u32) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(&SQL.unenqueued)
            .bind(secs(age))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?)
    }

    async fn expire_workspaces(&self, ttl: Duration, limit: u32) -> Result<u64> {
        self.expire_trees(ttl, limit).await
    }

    async fn collect_blobs(&self, grace: Duration, limit: u32) -> Result<u64> {
        self.collect(grace, limit).await
    }

    async fn wake_expired_approvals(&self, limit: u32) -> Result<Vec<Woken>> {
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_expired)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(woken(rows))
    }

    async fn wake_due(&self, limit: u32) -> Result<Vec<Woken>> {
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_due)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(woken(rows))
    }

    async fn wake_budget_waiters(&self, tenant: &str, limit: u32) -> Result<Vec<Woken>> {
        let rows: Vec<WokenRow> = sqlx::query_as(&SQL.wake_budget)
            .bind(tenant)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(woken(rows))
    }

    async fn waiting_by_reason(&self) -> Result<Vec<(WaitReason, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&SQL.waiting_by_reason)
            .fetch_all(&self.pool)
            .await?;
        Ok(crate::rowconv::tally(rows))
    }

    async fn held_by_queue(&self) -> Result<Vec<(String, u64)>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&SQL.held_by_queue)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(q, n)| (q, u64::try_from(n).unwrap_or(0)))
            .collect())
    }

    async fn dispatch_load(&self) -> Result<Vec<ActiveCount>> {
        let rows: Vec<outcome::LoadRow> = sqlx::query_as(&SQL.dispatch_load)
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(outcome::LoadRow::into_count).collect()
    }

    async fn held(&self, queue: &str, per_group: u32, limit: u32) -> Result<Vec<Candidate>> {
        let rows: Vec<outcome::HeldRow> = sqlx::query_as(&SQL.held)
            .bind(queue)
            .bind(i64::from(per_group))
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(outcome::HeldRow::into_candidate)
            .collect()
    }

    async fn any_held(&self, queue: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(&SQL.any_held)
            .bind(queue)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn release_held(&self, ids: &[String]) -> Result<Vec<String>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar(&SQL.release_held)
            .bind(ids)
            .fetch_all(&self.pool)
            .await?)
    }
}
