//! The statements every session in flight waits on (the heartbeat, the group commit, the
//! claims) read only the rows they name on a worker's connections (see
//! [`super::KEYED_PLANS`]), whatever `sessions` held when a connection planned them and
//! whatever its statistics say.

#![allow(clippy::unwrap_used, clippy::expect_used)]

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
fn key(n: u32) -> String {
    format!("00000000-0000-0000-0000-{n:012}")
}

fn lease(id: &str) -> Lease {
    Lease {
        session_id: id.to_owned(),
        root_id: id.to_owned(),
        owner: OWNER.to_owned(),
        epoch: 1,
    }
}

/// A step of `id` under [`lease`]: one new message after the prompt.
fn step(id: &str) -> Checkpoint {
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
        ("group commit", group, group_args),
        ("lone commit", lone, lone_args),
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
    let url = agentq_testkit::shared_postgres()
        .expect("shared postgres")
        .fresh_database()
        .expect("fresh database");
    let store = PgStore::connect_for_worker(&url, 1, 1).await.unwrap();
    store.migrate().await.unwrap();
    store
}

/// Sessions in the table when the statements run.
const SESSIONS: i64 = 2_000;

/// The sessions of [`SESSIONS`] the statements run for: leased ones, and queued ones for
/// the claims.
const LEASED: [u32; 2] = [7, 1500];
const QUEUED: [u32; 2] = [1700, 1800];

/// What each statement read of `sessions` (its name, the rows it answered, sequential
/// scans, rows they read, rows fetched by index), run for two sessions (one for the lone
/// forms) of [`SESSIONS`], on a worker's connection that planned it while the table was
/// empty: as a worker that started on a new installation (never analyzed) or on one
/// whose rows retention removed (`analyzed` empty) does, and keeps those plans until the
/// table is analyzed again, while a burst of sessions arrives.
async fn reads_of_plans_made_empty(analyzed: bool) -> Vec<(&'static str, usize, i64, i64, i64)> {
    let store = worker_store().await;
    // No analysis during the test, which would have the plans made again.
    let mut setup = vec!["ALTER TABLE sessions SET (autovacuum_enabled = false)"];
    if analyzed {
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

    let burst = format!(
        "INSERT INTO sessions (id, root_id, queue, status, lease_owner, lease_epoch, \
             lease_expires_at, history_len) \
         SELECT k, k, 'q', 'running', 'w1', 1, now() + interval '1 hour', 1 \
         FROM generate_series(1, {SESSIONS}) g, \
             LATERAL (SELECT '00000000-0000-0000-0000-' || lpad(g::text, 12, '0') AS k) k"
    );
    sqlx::query(&burst).execute(store.pool()).await.unwrap();
    sqlx::query(
        "UPDATE sessions SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = ANY($1)",
    )
    .bind(QUEUED.map(key).to_vec())
    .execute(store.pool())
    .await
    .unwrap();
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
    read
}

/// Each statement's rows answered: two (one for the lone forms), every one found, locked
/// and updated.
const ANSWERED: [usize; 5] = [2, 2, 1, 2, 1];

/// That every statement of `read` answered its rows, scanned nothing and fetched at most
/// `most` rows by index.
fn assert_read(read: &[(&str, usize, i64, i64, i64)], most: i64) {
    for ((name, rows, scans, scanned, fetched), want) in read.iter().zip(ANSWERED) {
        assert_eq!(*rows, want, "{name} answered {rows} rows: {read:?}");
        assert_eq!((*scans, *scanned), (0, 0), "{name} scanned: {read:?}");
        assert!(*fetched <= most, "{name} fetched {fetched} rows: {read:?}");
    }
}

/// On a new installation every statement reads its rows by key and nothing else. Planned
/// as joins, the heartbeat, the group commit and the group claim each scanned the table.
#[tokio::test]
async fn plans_made_on_a_new_installation_read_only_the_rows_named() {
    assert_read(&reads_of_plans_made_empty(false).await, 8);
}

/// Where the table was analyzed empty, the planner takes every path to it as free: until
/// the next analysis it may pass over an index (the update's join once, a lookup on an
/// index's second column once per row), but no statement scans the table. Planned as
/// joins, the heartbeat scanned the whole table once per lease, and the group claim five
/// times for two sessions.
#[tokio::test]
async fn plans_made_on_a_table_analyzed_empty_never_scan_it() {
    assert_read(&reads_of_plans_made_empty(true).await, SESSIONS + 8);
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

/// The plan `statement` (prepared as `name`) ran on `args` (a literal: `EXPLAIN`
/// takes no parameters of its own), in a transaction rolled back after it.
async fn explained(conn: &mut PgConnection, name: &str, statement: &str, args: &str) -> Value {
    sqlx::query(&format!("PREPARE {name} AS {statement}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
    let plan: Value = sqlx::query_scalar(&format!(
        "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})"
    ))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
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
    )
    .await;
    assert_eq!(group["Actual Rows"].as_f64(), Some(3.0), "{group:#}");
    // Each of the four distinct ids is looked up, and each of the three claimed is
    // read twice more (locked, updated): ten rows, a few more as `EXPLAIN` rounds each
    // loop's rows up; never the other 1,997.
    let read = rows_read(&group);
    assert!(read <= 20.0, "read {read} rows of sessions: {group:#}");

    let lone = explained(&mut conn, "claim", &SQL.claim, "'s9', 'w1', 30").await;
    assert_eq!(lone["Actual Rows"].as_f64(), Some(1.0), "{lone:#}");
    let read = rows_read(&lone);
    assert!(read <= 2.0, "read {read} rows of sessions: {lone:#}");
}
