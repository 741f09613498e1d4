//! The statements every session in flight waits on (the heartbeat, the group commit, the
//! claims) read only the rows they name on a worker's connections (see
//! [`super::KEYED_PLANS`]), whatever `sessions` held when a connection planned them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sqlx::PgConnection;
use sqlx::postgres::PgArguments;

use agentq_agent::state::Phase;

use crate::checkpoint::Checkpoint;
use crate::model::Lease;
use crate::sql::statements::POSTGRES as SQL;

use super::PgStore;
use super::batch::{batch_statement, heartbeat_statement};

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
    let claim_args = |ids: &dyn Fn(&mut PgArguments)| {
        let mut a = PgArguments::default();
        ids(&mut a);
        sqlx::Arguments::add(&mut a, OWNER).unwrap();
        sqlx::Arguments::add(&mut a, TTL.as_secs_f64()).unwrap();
        a
    };
    let claims = claim_args(&|a| sqlx::Arguments::add(a, queued.to_vec()).unwrap());
    let claim = claim_args(&|a| sqlx::Arguments::add(a, queued[1].as_str()).unwrap());
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

/// Sessions in the table when the statements run.
const SESSIONS: i64 = 2_000;

/// What each statement read of `sessions` (its name, the rows it answered, sequential
/// scans, rows they read, rows fetched by index), run for two sessions (one for the lone
/// forms) of [`SESSIONS`], on a worker's connection that planned it while the table was
/// empty: as a worker that started on a new installation (never analyzed) or on one
/// whose rows retention removed (`analyzed` empty) does, and keeps those plans until the
/// table is analyzed again, while a burst of sessions arrives.
async fn reads_of_plans_made_empty(analyzed: bool) -> Vec<(&'static str, usize, i64, i64, i64)> {
    let url = agentq_testkit::shared_postgres()
        .expect("shared postgres")
        .fresh_database()
        .expect("fresh database");
    let store = PgStore::connect_for_worker(&url, 1, 1).await.unwrap();
    store.migrate().await.unwrap();
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
    for sql in [
        burst.as_str(),
        "UPDATE sessions SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL \
         WHERE id LIKE '%1700' OR id LIKE '%1800'",
    ] {
        sqlx::query(sql).execute(store.pool()).await.unwrap();
    }
    let mut read = Vec::new();
    for (name, sql, args) in statements([7, 1500], [1700, 1800]) {
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
