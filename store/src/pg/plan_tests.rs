//! The statements every session in flight waits on (the heartbeat, the group commit, the
//! claims) read only the rows they name on a worker's connections (see
//! [`super::KEYED_PLANS`]), whatever `sessions` held when a connection planned them; where
//! its statistics say it is empty, from the worker's next heartbeat on, which has the
//! table analyzed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::{Encode, PgConnection, Postgres, Type};

use agentq_agent::state::Phase;

use crate::checkpoint::Checkpoint;
use crate::model::Lease;
use crate::sql::statements::POSTGRES as SQL;

use super::batch::{batch_statement, heartbeat_statement};
use super::params::Params;
use super::{PgStore, secs};

const OWNER: &str = "w1";
const TTL: Duration = Duration::from_secs(30);

/// Session `n`'s id (messages key their rows by uuid).
pub(super) fn key(n: u32) -> String {
    format!("00000000-0000-0000-0000-{n:012}")
}

pub(super) fn lease(id: &str) -> Lease {
    Lease {
        session_id: id.to_owned(),
        root_id: id.to_owned(),
        owner: OWNER.to_owned(),
        epoch: 1,
    }
}

/// A step of `id` under [`lease`]: one new message after the prompt.
pub(super) fn step(id: &str) -> Checkpoint {
    Checkpoint {
        lease: lease(id),
        from: 1,
        messages: vec![r#"{"role":"assistant","content":"ok"}"#.to_owned()],
        iteration: 1,
        input_tokens: 1,
        output_tokens: 1,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        reasoning_tokens: 0,
        web_search_requests: 0,
        drain_rounds: 0,
        free_iteration: false,
        phase: Phase::Act,
        started_at: None,
        turn_base: 0,
        not_started: "[]".to_owned(),
        bg_cursor: 0,
        msg_cursor: 0,
        finish: None,
        history_len: 2,
        files: Vec::new(),
        blobs: Vec::new(),
        model_used: None,
    }
}

/// A claim's parameters: its id or ids, the owner and the lease's length.
fn claim_args<'q>(ids: impl Encode<'q, Postgres> + Type<Postgres> + 'q) -> PgArguments {
    let mut p = Params::default();
    p.value(ids).unwrap();
    p.value(OWNER).unwrap();
    p.value(secs(TTL)).unwrap();
    p.into_args()
}

/// Each statement a worker runs with many keys (and its one-key form), for sessions
/// `ids` (leased sessions for the heartbeat and the commits; `queued` adds queued ones
/// for the claims): its name, its text and its parameters.
fn statements(ids: [u32; 2], queued: [u32; 2]) -> Vec<(&'static str, String, PgArguments)> {
    let ids = ids.map(key);
    let queued = queued.map(key);
    let leases = ids.each_ref().map(|id| lease(id));
    let steps = ids.each_ref().map(|id| step(id));
    let (beat, beat_args) = heartbeat_statement(OWNER, &leases, TTL).unwrap();
    let (group, group_args) = batch_statement(&[&steps[0], &steps[1]]).unwrap();
    let (lone, lone_args) = batch_statement(&[&steps[0]]).unwrap();
    let claims = claim_args(queued.to_vec());
    let claim = claim_args(queued[1].clone());
    vec![
        ("heartbeat", beat, beat_args),
        ("group commit", group.to_owned(), group_args),
        ("lone commit", lone.to_owned(), lone_args),
        ("group claim", SQL.claim_batch.clone(), claims),
        ("lone claim", SQL.claim.clone(), claim),
    ]
}

/// What this connection read of `sessions` since it last reported its counts to the
/// server: sequential scans, the rows they read, and the rows index scans fetched.
async fn reads(conn: &mut PgConnection) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables \
         WHERE relname = 'sessions'",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// A worker's store on a fresh database: one connection in each pool, so that every
/// statement on the writer pool runs on the connection that planned it.
async fn worker_store() -> PgStore {
    worker_store_with(1, 1).await
}

/// A worker's store on a fresh database, migrated, with `connections` in its main pool
/// and `writers` writer connections.
pub(super) async fn worker_store_with(connections: u32, writers: u32) -> PgStore {
    let url = agentq_testkit::migrated_database(
        agentq_testkit::shared_postgres().expect("shared postgres"),
    )
    .expect("a fresh migrated database");
    let store = PgStore::connect_for_worker(&url, connections, writers)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// Sessions `key(1)` to `key(n)`, running under [`lease`].
pub(super) async fn add_leased(pool: &sqlx::PgPool, n: i64) {
    sqlx::query(
        "INSERT INTO sessions (id, root_id, queue, status, lease_owner, lease_epoch, \
             lease_expires_at, history_len) \
         SELECT k, k, 'q', 'running', 'w1', 1, now() + interval '1 hour', 1 \
         FROM generate_series(1, $1) g, \
             LATERAL (SELECT '00000000-0000-0000-0000-' || lpad(g::text, 12, '0') AS k) k",
    )
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// Sessions in the table when the statements run.
const SESSIONS: i64 = 2_000;

/// The sessions of [`SESSIONS`] the statements run for: leased ones, and queued ones for
/// the claims.
const LEASED: [u32; 2] = [7, 1500];
const QUEUED: [u32; 2] = [1700, 1800];

/// What a statement read of `sessions`: its name, the rows it answered, sequential scans,
/// rows they read, rows fetched by index.
type Read = (&'static str, usize, i64, i64, i64);

/// What each statement read of `sessions` ([`Read`]) and how its plan reaches the rows
/// ([`index_lookups`]), run for two sessions (one for the lone
/// forms) of [`SESSIONS`], on a worker's connection that planned it while the table was
/// empty, as a worker that started on a new installation (never analyzed) or on one
/// whose rows retention removed (analyzed empty) does, and keeps those plans until the
/// table is analyzed again, while a burst of sessions arrives; with
/// [`Statistics::EmptyThenBeat`], after the worker's next heartbeat.
async fn reads_of_plans_made_empty(empty: Statistics) -> (Vec<Read>, Vec<(Lookup, bool)>) {
    let store = worker_store().await;
    // No analysis during the test, which would have the plans made again.
    let mut setup = vec!["ALTER TABLE sessions SET (autovacuum_enabled = false)"];
    if empty != Statistics::None {
        setup.push("ANALYZE sessions");
    }
    for sql in setup {
        sqlx::query(sql).execute(store.pool()).await.unwrap();
    }
    let mut conn = store.writer_pool().acquire().await.unwrap();
    for (name, sql, args) in statements([9001, 9002], [9003, 9004]) {
        sqlx::query_with(&sql, args)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let mut lookups = index_lookups(&mut conn).await;

    add_leased(store.pool(), SESSIONS).await;
    sqlx::query(
        "UPDATE sessions SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = ANY($1)",
    )
    .bind(QUEUED.map(key).to_vec())
    .execute(store.pool())
    .await
    .unwrap();
    if empty == Statistics::EmptyThenBeat {
        // The heartbeat needs the writer pool's one connection.
        drop(conn);
        let leases = LEASED.map(|n| lease(&key(n)));
        let beat = store.extend_leases(OWNER, &leases, TTL).await.unwrap();
        assert!(beat.iter().all(|l| l.held), "{beat:?}");
        conn = store.writer_pool().acquire().await.unwrap();
        lookups = index_lookups(&mut conn).await;
    }
    let mut read = Vec::new();
    for (name, sql, args) in statements(LEASED, QUEUED) {
        sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
        // The counts go on until the backend reports them: what this statement added.
        let before = reads(&mut conn).await;
        let rows = sqlx::query_with(&sql, args)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .len();
        let after = reads(&mut conn).await;
        sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
        read.push((
            name,
            rows,
            after.0 - before.0,
            after.1 - before.1,
            after.2 - before.2,
        ));
    }
    (read, lookups)
}

/// An index scan of `sessions` in a plan: the statement's name, the index, and the
/// condition the scan starts from (`None` for a pass over the whole index).
type Lookup = (&'static str, String, Option<String>);

/// The scans of `sessions`' indexes in the plans this connection makes now for each of
/// [`statements`] (prepared anew, as a worker's connection plans each statement at its
/// first run), each with whether its condition names the index's first column: if not,
/// the scan reads the whole index, whatever it finds.
async fn index_lookups(conn: &mut PgConnection) -> Vec<(Lookup, bool)> {
    let first: HashMap<String, String> = sqlx::query_as(
        "SELECT i.relname::text, a.attname::text FROM pg_index x \
         JOIN pg_class i ON i.oid = x.indexrelid \
         JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0] \
         WHERE x.indrelid = 'sessions'::regclass",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let mut lookups = Vec::new();
    for (n, (name, sql, _)) in statements([9001, 9002], [9003, 9004])
        .into_iter()
        .enumerate()
    {
        // The generic plan, which takes no values: every parameter NULL.
        let nulls = vec!["NULL"; parameters(&sql)].join(", ");
        let plan = explained(conn, &format!("lookup_{n}"), &sql, &nulls, false).await;
        let mut scans = Vec::new();
        index_scans(&plan, &mut scans);
        for (index, cond) in scans {
            let Some(column) = first.get(&index) else {
                continue;
            };
            let keyed = cond.as_deref().is_some_and(|c| names(c, column));
            lookups.push(((name, index, cond), keyed));
        }
    }
    lookups
}

/// The number of parameters `sql` takes (its highest `$n`).
pub(super) fn parameters(sql: &str) -> usize {
    sql.split('$')
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

/// Every index scan below `node`: its index and its condition.
fn index_scans(node: &Value, out: &mut Vec<(String, Option<String>)>) {
    if let Some(index) = node["Index Name"].as_str() {
        let cond = node["Index Cond"].as_str().map(str::to_owned);
        out.push((index.to_owned(), cond));
    }
    for child in node["Plans"].as_array().into_iter().flatten() {
        index_scans(child, out);
    }
}

/// Whether an index condition compares `column` (`EXPLAIN` writes it bare, or cast).
fn names(cond: &str, column: &str) -> bool {
    [format!("({column} "), format!("(({column})")]
        .iter()
        .any(|at| cond.contains(at.as_str()))
}

/// Each statement's rows answered: two (one for the lone forms), every one found, locked
/// and updated.
const ANSWERED: [usize; 5] = [2, 2, 1, 2, 1];

/// What `sessions`' statistics said when a worker's connection planned its statements.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Statistics {
    /// Never analyzed: a new installation.
    None,
    /// Analyzed empty: one whose rows retention removed.
    Empty,
    /// Analyzed empty, then a heartbeat after the sessions came.
    EmptyThenBeat,
}

/// That every statement of `read` answered its rows, scanned nothing and fetched at most
/// `most` rows by index; that every index scan with a condition has one on the index's
/// first column; and, unless `passes`, that every index scan has a condition.
fn assert_read((read, lookups): &(Vec<Read>, Vec<(Lookup, bool)>), most: i64, passes: bool) {
    for ((name, rows, scans, scanned, fetched), want) in read.iter().zip(ANSWERED) {
        assert_eq!(*rows, want, "{name} answered {rows} rows: {read:?}");
        assert_eq!((*scans, *scanned), (0, 0), "{name} scanned: {read:?}");
        assert!(*fetched <= most, "{name} fetched {fetched} rows: {read:?}");
    }
    assert!(!lookups.is_empty());
    for (lookup, keyed) in lookups {
        let pass = lookup.2.is_none();
        assert!(
            *keyed || (passes && pass),
            "a pass over a whole index: {lookup:?} in {lookups:#?}"
        );
    }
}

/// On a new installation every statement reads its rows by key and nothing else. Planned
/// as joins, the heartbeat, the group commit and the group claim each scanned the table.
#[tokio::test]
async fn plans_made_on_a_new_installation_read_only_the_rows_named() {
    assert_read(&reads_of_plans_made_empty(Statistics::None).await, 8, false);
}

/// Where the table was analyzed empty, the planner takes every index as one page and
/// one row: until the statistics change, an update joined to the rows it names passes
/// over a whole index once (the commits', the group claim's), but no statement scans
/// the table, and every lookup goes through an index that starts with the key. Planned
/// as joins, the heartbeat scanned the whole table once per lease, and the group claim
/// five times for two sessions; with the listings' indexes usable for a key (before
/// migration 0033), every lookup passed over `sessions_status_id_idx`, the index made
/// last, which Postgres takes where all look alike.
#[tokio::test]
async fn plans_made_on_a_table_analyzed_empty_never_scan_it() {
    assert_read(
        &reads_of_plans_made_empty(Statistics::Empty).await,
        SESSIONS + 8,
        true,
    );
}

/// A worker's heartbeat that finds the table's statistics empty while it holds leases
/// has it analyzed, and its connections make their plans again: every statement then
/// reads its rows by key and nothing else. Without it, each commit and group claim
/// passed over a whole index (2,000 rows fetched for two).
#[tokio::test]
async fn a_heartbeat_has_plans_made_on_empty_statistics_made_again() {
    assert_read(
        &reads_of_plans_made_empty(Statistics::EmptyThenBeat).await,
        8,
        false,
    );
}

/// The heartbeat analyzes the table at most once per [`super::batch::ANALYSIS_EVERY`]:
/// statistics an analysis could not change (the role does not own the table) are not
/// analyzed again on every beat.
#[tokio::test]
async fn a_heartbeat_analyzes_the_table_at_most_once_in_a_while() {
    let store = worker_store().await;
    let pool = store.pool();
    sqlx::query("ALTER TABLE sessions SET (autovacuum_enabled = false)")
        .execute(pool)
        .await
        .unwrap();
    add_leased(pool, 2).await;
    let leases = [lease(&key(1)), lease(&key(2))];
    let emptied = "UPDATE pg_class SET reltuples = 0 WHERE oid = 'sessions'::regclass";
    let tuples = "SELECT reltuples FROM pg_class WHERE oid = 'sessions'::regclass";
    sqlx::query(emptied).execute(pool).await.unwrap();
    store.extend_leases(OWNER, &leases, TTL).await.unwrap();
    let analyzed: f32 = sqlx::query_scalar(tuples).fetch_one(pool).await.unwrap();
    assert_eq!(analyzed, 2.0);

    sqlx::query(emptied).execute(pool).await.unwrap();
    store.extend_leases(OWNER, &leases, TTL).await.unwrap();
    let again: f32 = sqlx::query_scalar(tuples).fetch_one(pool).await.unwrap();
    assert_eq!(again, 0.0, "analyzed again at the next beat");
}

/// Rows of `sessions` a plan's nodes read (returned or filtered out), and rows any
/// join compared and dropped, over all their loops (`EXPLAIN` gives each per loop).
fn rows_read(node: &Value) -> f64 {
    let n = |key: &str| node[key].as_f64().unwrap_or(0.0);
    let own = if node["Relation Name"] == "sessions" {
        n("Actual Rows") + n("Rows Removed by Filter") + n("Rows Removed by Index Recheck")
    } else {
        0.0
    };
    let joined = n("Rows Removed by Join Filter");
    let this = (own + joined) * n("Actual Loops");
    let below: f64 = node["Plans"]
        .as_array()
        .map(|plans| plans.iter().map(rows_read).sum())
        .unwrap_or(0.0);
    this + below
}

/// The plan of `statement` (prepared as `name`) on `args` (a literal: `EXPLAIN` takes no
/// parameters of its own). With `run`, as it ran, in a transaction rolled back after it;
/// without, the plan alone.
async fn explained(
    conn: &mut PgConnection,
    name: &str,
    statement: &str,
    args: &str,
    run: bool,
) -> Value {
    sqlx::query(&format!("PREPARE {name} AS {statement}"))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let options = if run {
        "ANALYZE, FORMAT JSON"
    } else {
        "FORMAT JSON"
    };
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let plan: Value = sqlx::query_scalar(&format!("EXPLAIN ({options}) EXECUTE {name}({args})"))
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
    sqlx::query(&format!("DEALLOCATE {name}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    plan[0]["Plan"].clone()
}

/// A claim, alone or in a group, reads its own sessions' rows, whatever the backlog
/// and whatever the statistics say: here 2,000 sessions, all finished when the table
/// was analyzed (so the planner expects few runnable rows), then all queued again, on a
/// worker's connection. As a join, the group claim read the whole backlog, once per id.
#[tokio::test]
async fn a_claim_reads_only_its_own_rows() {
    let store = worker_store().await;
    for sql in [
        "INSERT INTO sessions (id, root_id, queue, status, finished_at) \
         SELECT 's' || g, 's' || g, 'q', 'completed', now() FROM generate_series(1, 2000) g",
        "ANALYZE sessions",
        "UPDATE sessions SET status = 'queued', finished_at = NULL",
    ] {
        sqlx::query(sql).execute(store.pool()).await.unwrap();
    }
    let mut conn = store.writer_pool().acquire().await.unwrap();
    let group = explained(
        &mut conn,
        "group_claim",
        &SQL.claim_batch,
        "'{s7, s1500, s42, s7, absent}'::text[], 'w1', 30",
        true,
    )
    .await;
    assert_eq!(group["Actual Rows"].as_f64(), Some(3.0), "{group:#}");
    // Each of the four distinct ids is looked up, and each of the three claimed is
    // read twice more (locked, updated): ten rows, a few more as `EXPLAIN` rounds each
    // loop's rows up; never the other 1,997.
    let read = rows_read(&group);
    assert!(read <= 20.0, "read {read} rows of sessions: {group:#}");

    let lone = explained(&mut conn, "claim", &SQL.claim, "'s9', 'w1', 30", true).await;
    assert_eq!(lone["Actual Rows"].as_f64(), Some(1.0), "{lone:#}");
    let read = rows_read(&lone);
    assert!(read <= 2.0, "read {read} rows of sessions: {lone:#}");
}
