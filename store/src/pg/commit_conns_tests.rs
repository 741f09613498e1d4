//! The group commit's own connections ([`super::commit_conns`]) against a real server:
//! each commit leaves a live connection with keyed plans behind, and none that a failure,
//! a dropped commit or a restart made unusable is used again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::checkpoint::Checkpoint;

use super::PgStore;
use super::plan_tests::{add_leased, key, step, worker_store_with};

/// A worker's store on a fresh database, with `sessions` leased sessions: two commit
/// connections (three writer connections, one of them the heartbeat's).
async fn store(sessions: i64) -> PgStore {
    let store = worker_store_with(2, 3).await;
    add_leased(store.pool(), sessions).await;
    store
}

/// The backends of this test's database, other than the asking one, by pid.
async fn backends(pool: &PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND backend_type = 'client backend' ORDER BY pid",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn commit(store: &PgStore, cp: &Checkpoint) -> crate::error::Result<()> {
    let mut answers = store.commit_batch(&[cp]).await?;
    answers.remove(0).map(|_| ())
}

/// The next step of session `n` after `steps` of them were committed.
fn step_of(n: u32, steps: i32) -> Checkpoint {
    let mut cp = step(&key(n));
    cp.from += steps;
    cp.history_len += steps;
    cp
}

#[tokio::test]
async fn a_commit_connection_is_reused_with_keyed_plans() {
    let store = store(1).await;
    assert_eq!(store.commits.idle_count(), 2, "opened up front");
    let before = idle_backends(&store).await;
    for steps in 0..3 {
        commit(&store, &step_of(1, steps)).await.unwrap();
    }
    // The same two connections: none opened, none lost.
    assert_eq!(idle_backends(&store).await, before);
    let mut conn = store.commits.take().await.unwrap();
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(mode, "force_generic_plan");
    store.commits.give_back(conn);
}

/// The backends of the idle commit connections, by pid.
async fn idle_backends(store: &PgStore) -> Vec<i32> {
    let mut conns = Vec::new();
    while store.commits.idle_count() > 0 {
        conns.push(store.commits.take().await.unwrap());
    }
    let mut pids = Vec::new();
    for mut c in conns {
        pids.push(
            sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut c)
                .await
                .unwrap(),
        );
        store.commits.give_back(c);
    }
    pids.sort_unstable();
    pids
}

#[tokio::test]
async fn a_connection_whose_statement_failed_is_closed_and_the_next_commit_opens_another() {
    let store = store(1).await;
    // A value Postgres refuses (a NUL in text): the statement fails on its connection.
    let mut bad = step_of(1, 0);
    bad.not_started = "\0".to_owned();
    let err = commit(&store, &bad).await.unwrap_err();
    assert!(err.is_data(), "{err}");
    assert_eq!(
        store.commits.idle_count(),
        1,
        "the failed one is not given back"
    );
    commit(&store, &step_of(1, 0)).await.unwrap();
    commit(&store, &step_of(1, 1)).await.unwrap();
    assert_eq!(store.commits.idle_count(), 1);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        n, 2,
        "each good step's message once, the refused one's none"
    );
}

#[tokio::test]
async fn a_connection_idle_past_the_ping_age_whose_backend_died_is_replaced() {
    let store = store(1).await;
    // Both idle connections' backends gone (as after a restart), and both idle long
    // enough to be pinged before use.
    let killed = idle_backends(&store).await;
    let mut conns = Vec::new();
    while store.commits.idle_count() > 0 {
        conns.push(store.commits.take().await.unwrap());
    }
    for pid in &killed {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(store.pool())
            .await
            .unwrap();
    }
    let long_ago = Instant::now()
        .checked_sub(super::PING_IF_IDLE_FOR * 2)
        .unwrap();
    for c in conns {
        store.commits.put_idle_since(c, long_ago);
    }
    // The commit succeeds at its first attempt, on a new connection.
    commit(&store, &step_of(1, 0)).await.unwrap();
    let now = idle_backends(&store).await;
    assert_eq!(now.len(), 1, "the dead ones are not kept");
    assert!(!killed.contains(&now[0]), "a new backend");
}

#[tokio::test]
async fn a_commit_dropped_while_its_statement_runs_does_not_give_its_connection_back() {
    let store = store(1).await;
    // Another transaction holds the session's row: the commit's statement waits on it.
    let mut blocker = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(key(1))
        .execute(&mut *blocker)
        .await
        .unwrap();
    let cp = step_of(1, 0);
    {
        let commit = commit(&store, &cp);
        tokio::pin!(commit);
        // Poll the commit until its statement waits on the lock, then drop it.
        loop {
            tokio::select! {
                biased;
                r = &mut commit => panic!("the commit ended while the row was locked: {r:?}"),
                waiting = lock_waiters(store.pool()) => if waiting > 0 { break },
            }
        }
    }
    assert_eq!(
        store.commits.idle_count(),
        1,
        "the dropped commit's connection is gone"
    );
    blocker.rollback().await.unwrap();
    // The session's next commit of the same step works, on the connection left.
    commit(&store, &cp).await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// Backends of this database waiting on a lock.
async fn lock_waiters(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn commits_beyond_the_kept_connections_close_theirs_after() {
    let store = store(4).await;
    let before = backends(store.pool()).await.len();
    // Four commits at once, held on their rows so that all four are in flight together.
    let mut blocker = store.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sessions FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let cps: Vec<Checkpoint> = (1..=4).map(|n| step_of(n, 0)).collect();
    let commits = futures::future::join_all(cps.iter().map(|cp| commit(&store, cp)));
    tokio::pin!(commits);
    loop {
        tokio::select! {
            biased;
            _ = &mut commits => panic!("commits ended while their rows were locked"),
            waiting = lock_waiters(store.pool()) => if waiting == 4 { break },
        }
    }
    blocker.rollback().await.unwrap();
    for r in commits.await {
        r.unwrap();
    }
    assert_eq!(store.commits.idle_count(), 2, "two kept");
    // The two opened for the burst are closed (by a task of their own).
    let deadline = Instant::now() + Duration::from_secs(30);
    while backends(store.pool()).await.len() != before {
        assert!(
            Instant::now() < deadline,
            "the extra connections were not closed"
        );
        tokio::task::yield_now().await;
    }
}
