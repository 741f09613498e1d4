//! The Postgres [`Store`]: owns the `sessions`, `session_specs`, `messages`, `inbox` and
//! `approvals` tables (`migrations/`), the lease protocol on them (claim, fenced
//! checkpoint, heartbeat, release), its connection pools and the embedded migrator.
//!
//! Every statement is runtime-checked (`sqlx::query` + `FromRow`), so the build needs no
//! database; `store/tests/it/pg_store.rs` runs each one against a real server. The statements
//! it shares with the SQLite store, and the mapping of rows to the model, are in
//! `crate::sql`; what only Postgres can express is here: the group commit and the
//! heartbeat as one array-driven statement each (`batch`), batched creation
//! (`create`), and deliveries and decisions as one statement under the row lock.
//!
//! Leases: a claim bumps `lease_epoch`; every later write of the worker is conditional on
//! `(lease_owner, lease_epoch)`, so a worker that was paused past its lease and replaced
//! finds out at its next write ([`crate::error::Error::LeaseLost`]) and writes nothing. A checkpoint is
//! one statement (one round trip): the row's scalars plus only the new messages.
//!
//! Cancellation of a running session sets `cancel_requested`; the owner learns it from its
//! heartbeat. A claim does not refuse a session with the flag set (its previous owner may
//! have died before acting on it): the claimer sees `row.cancel_requested` and finishes
//! the session as interrupted.
//!
//! This file owns the store itself (its pools, the migrator, the schema check); each
//! trait's implementation has its own module: `sessions` (rows, reads, changes from
//! outside a run), `leases` (claim, checkpoint, heartbeat, release, suspension), `inbox`
//! (deliveries, approvals, follow-ups), `sweep` (the sweeper's and the dispatcher's),
//! `keys`, `queues`, `budget`, `workspace` and `batches` (batches as objects of the API).

mod announce_rounds;
mod batch;
mod batches;
mod budget;
mod commit_conns;
#[cfg(test)]
mod commit_conns_tests;
mod create;
mod fork;
mod inbox;
mod keys;
mod leases;
mod params;
#[cfg(test)]
mod plan_tests;
mod queues;
mod report;
mod retention;
mod rounds;
mod schedules;
mod sessions;
mod shard_map;
mod sweep;
mod tenant_holds;
mod tenant_rounds;
mod webhooks;
mod workspace;

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Connection;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};

use crate::error::Result;
use crate::model::{Lease, SessionStatus};
use crate::rowconv::check_applied;
use crate::sql::record::SessionRecord;
use crate::sql::statements::{APPLIED_MIGRATIONS, POSTGRES as SQL};
use crate::sql::{outcome, read};
use crate::store::Store;

pub use shard_map::{MapRecorded, record_shard_map};

/// Pooled connections idle at least this long are pinged before use.
pub(crate) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The migrations this binary was built with.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// How long the first connection attempt may take before Postgres counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One connection attempt before a pool is opened: a server that is down is reported at
/// once with its address and cause, where a pool retries until its acquire timeout and
/// then says only that it timed out. Any other failure (a refused password, a missing
/// database) is the driver's own error.
async fn probe(url: &str) -> Result<()> {
    let options: PgConnectOptions = url.parse()?;
    let unreachable = |cause: String| crate::Error::Unreachable {
        service: "Postgres",
        address: format!("{}:{}", options.get_host(), options.get_port()),
        cause,
    };
    match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&options)).await {
        Err(_) => Err(unreachable(format!(
            "no answer within {} s",
            PROBE_TIMEOUT.as_secs()
        ))),
        Ok(Err(sqlx::Error::Io(e))) => Err(unreachable(crate::error::connect_cause(&e))),
        Ok(Err(e)) => Err(e.into()),
        Ok(Ok(conn)) => {
            // The server is there; how it closes this connection does not matter.
            let _ = conn.close().await;
            Ok(())
        }
    }
}

/// The Postgres store. Cheap to clone (the pools are shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// The heartbeat's own connection, and (`commits`) the group commit's. They are kept
    /// apart so that a burst of claims or reads queued for the main pool never holds up
    /// the checkpoints that every session in flight waits on, nor the heartbeat that keeps
    /// its lease. They also run their statements with generic plans of key lookups (see
    /// [`KEYED_PLANS`]).
    writer: PgPool,
    /// The group commit's connections, outside any pool (see [`commit_conns`]).
    commits: std::sync::Arc<commit_conns::CommitConnections>,
    /// Where the bytes of blobs live when not in the `blobs` table (see
    /// [`PgStore::with_objects`]).
    objects: Option<std::sync::Arc<crate::blob::s3::S3Blobs>>,
    /// Tenants' budget holds and settlements taken together (see [`tenant_rounds`]).
    rounds: std::sync::Arc<rounds::Rounds<tenant_rounds::Op>>,
    /// Marks of finished sessions announced, taken together (see [`announce_rounds`]).
    announced: std::sync::Arc<rounds::Rounds<announce_rounds::Mark>>,
    /// When the heartbeat may next analyze `sessions` (see `PgStore::analyze_sessions`).
    next_analysis: std::sync::Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

/// Writer connections [`PgStore::connect`] allows: two commits in flight (the worker's
/// default) and the heartbeat.
pub const DEFAULT_WRITER_CONNECTIONS: u32 = 3;

/// The commits' share of `writers` writer connections: all but the heartbeat's one.
fn commit_connections(writers: u32) -> usize {
    usize::try_from(writers.saturating_sub(1).max(1)).unwrap_or(1)
}

/// Session settings of the writer connections (and of a worker's main pool), whose
/// statements all look their rows up by key.
///
/// Generic plans: planned afresh for each call (Postgres's choice while a connection has
/// run a statement fewer than five times, and whenever the array lengths make a custom
/// plan look cheaper) the checkpoint cost about a millisecond of Postgres CPU per commit,
/// about a third of Postgres's CPU per iteration. A generic plan is made once per
/// connection and made again whenever `sessions` or `messages` is analyzed.
///
/// No sequential scan and no merge join: a plan is made with the table's size at that
/// moment, and a worker's connections make theirs at its start, when `sessions` may be
/// empty (a new installation, or one whose rows retention removed) and about to take a
/// burst of thousands. Planned on an empty table, the heartbeat scanned the whole table
/// once per lease until the next `ANALYZE` (4.5 s for 237 leases of 20,000 sessions, three
/// times the lease's length). With these off, a key lookup (each statement names its rows
/// by key, in a `LATERAL` subquery where it names many) can only be an index probe, and a
/// sequential scan is still made where a statement has no index to use (no worker's
/// statement on `sessions` or `messages` is such). Statistics that say the table is
/// empty while it is not are the heartbeat's to mend (`PgStore::analyze_sessions`).
pub(crate) const KEYED_PLANS: &str = "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), \
    set_config('enable_seqscan', 'off', false), set_config('enable_mergejoin', 'off', false)";

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
        probe(url).await?;
        let pool = Self::options(max_connections).connect(url).await?;
        let writer = Self::keyed_plan_options(1).connect_lazy(url)?;
        let commits = commit_conns::CommitConnections::new(
            writer.connect_options(),
            commit_connections(DEFAULT_WRITER_CONNECTIONS),
        );
        Ok(Self {
            pool,
            writer,
            commits: std::sync::Arc::new(commits),
            objects: None,
            rounds: Default::default(),
            announced: Default::default(),
            next_analysis: Default::default(),
        })
    }

    /// Open the pools, with `writers` connections for checkpoints and heartbeats (a
    /// worker's commits in flight, plus one for its heartbeat), opened up front: they are
    /// busy whenever sessions run, and the first commits after a start should not wait
    /// for a connection. Connections are checked before use, so after a database restart
    /// the pools replace dead connections by themselves; an acquire waits at most 5 s, so
    /// an outage surfaces as a (retryable) [`crate::error::Error::Db`] instead of a hang.
    pub async fn connect_with_writers(
        url: &str,
        max_connections: u32,
        writers: u32,
    ) -> Result<Self> {
        Self::open(url, Self::options(max_connections), writers).await
    }

    /// A worker's store: [`PgStore::connect_with_writers`], with keyed plans on the main
    /// pool too. Everything a worker runs there (claims, session and message reads, inbox
    /// and child writes) finds its rows by key, so a plan never depends on the values; and
    /// Postgres plans a statement afresh on each connection until it has run there five
    /// times, which across a worker's up to 64 connections is most claims of a burst
    /// (about 8 % of Postgres's CPU per iteration in `agentq bench`). Not for a store that
    /// also serves the API, whose listings filter on skewed columns (`status`).
    pub async fn connect_for_worker(url: &str, max_connections: u32, writers: u32) -> Result<Self> {
        Self::open(url, Self::keyed_plan_options(max_connections), writers).await
    }

    async fn open(url: &str, main: PgPoolOptions, writers: u32) -> Result<Self> {
        probe(url).await?;
        let pool = main.connect(url).await?;
        let writer = Self::keyed_plan_options(1)
            .min_connections(1)
            .connect(url)
            .await?;
        let commits = commit_conns::CommitConnections::new(
            writer.connect_options(),
            commit_connections(writers),
        );
        commits.fill().await?;
        Ok(Self {
            pool,
            writer,
            commits: std::sync::Arc::new(commits),
            objects: None,
            rounds: Default::default(),
            announced: Default::default(),
            next_analysis: Default::default(),
        })
    }

    fn keyed_plan_options(max_connections: u32) -> PgPoolOptions {
        Self::options(max_connections).after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(conn, KEYED_PLANS).await?;
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
            commits: std::sync::Arc::new(commit_conns::CommitConnections::new(
                pool.connect_options(),
                commit_connections(DEFAULT_WRITER_CONNECTIONS),
            )),
            pool,
            objects: None,
            rounds: Default::default(),
            announced: Default::default(),
            next_analysis: Default::default(),
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The connections of heartbeats (checkpoints have their own, outside any pool).
    pub fn writer_pool(&self) -> &PgPool {
        &self.writer
    }

    /// Close the pools and the commits' idle connections now, rather than whenever the
    /// last handle goes, so that their connections are free for others at once.
    pub async fn close(&self) {
        self.pool.close().await;
        self.writer.close().await;
        self.commits.close().await;
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
