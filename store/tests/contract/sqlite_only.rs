//! What only the SQLite store has: its file settings, the in-memory store and what an
//! embedded process requeues at a start, and two stores on one file.

use std::time::{Duration, Instant};

use agentq_error::Error;
use agentq_store::sqlite::SqliteStore;
use agentq_store::{SessionStore, Store};

use crate::common::{TTL, acquire, create};

#[tokio::test]
async fn check_schema_on_new_and_migrated_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested.db");
    let store = SqliteStore::open(&path).await.unwrap();
    assert!(path.exists());
    match store.check_schema().await {
        Err(Error::SchemaBehind { current, required }) => {
            assert_eq!(current, None);
            assert!(required >= 1);
        }
        other => panic!("expected SchemaBehind, got {other:?}"),
    }
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
    store.ping().await.unwrap();

    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(sync, 1, "NORMAL");
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(fk, 1);
    store.close().await;

    // Reopening an existing file keeps everything.
    let store = SqliteStore::open(&path).await.unwrap();
    store.check_schema().await.unwrap();
    store.close().await;
}

#[tokio::test]
async fn memory_store_works_and_runnable_sessions() {
    let store = SqliteStore::memory().await.unwrap();
    store.migrate().await.unwrap();
    let a = create(&store, "a").await;
    let b = create(&store, "b").await;
    let c = create(&store, "c").await;
    let (_lease, _) = acquire(&store, &b, "w", TTL).await;
    store.request_cancel(&c).await.unwrap();
    let runnable = store.runnable_sessions().await.unwrap();
    let mut want = vec![(a, "default".to_string()), (b, "default".to_string())];
    want.sort();
    assert_eq!(runnable, want);
}

/// Another process holding the write lock for a moment (here: a second store on the
/// same file) makes writes wait (busy timeout), not fail.
#[tokio::test]
async fn two_stores_on_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let one = SqliteStore::open(&path).await.unwrap();
    one.migrate().await.unwrap();
    let two = SqliteStore::open(&path).await.unwrap();
    let id = create(&one, "shared").await;
    let mut tx = two.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("UPDATE sessions SET updated_at = updated_at")
        .execute(&mut *tx)
        .await
        .unwrap();
    let held = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.commit().await.unwrap();
    });
    let t = Instant::now();
    let (lease, _) = acquire(&one, &id, "w", TTL).await;
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    held.await.unwrap();
    // The other store sees the claim at once.
    assert_eq!(
        two.get(&id).await.unwrap().unwrap().lease_owner.as_deref(),
        Some("w")
    );
    assert_eq!(lease.epoch, 1);
}
