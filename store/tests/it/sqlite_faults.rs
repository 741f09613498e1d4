//! The embedded store under faults of its file: a write that fails (the file full) leaves
//! the writer able to write once the cause is gone; `ping` (what `/readyz` asks) says
//! when the store cannot write; a corrupt file is refused when it is opened.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sqlx::ConnectOptions;

use agentq_agent::spec::SessionSpec;
use agentq_error::Error;
use agentq_store::SessionStore;
use agentq_store::sqlite::SqliteStore;
use agentq_types::model::NewSession;

async fn open(dir: &tempfile::TempDir) -> SqliteStore {
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// Cap the writer connection's file at its current size: the next write that needs a
/// new page fails with `SQLITE_FULL`, as on a full disk.
async fn fill_up(store: &SqliteStore) {
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(store.pool())
        .await
        .unwrap();
    sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
        .execute(store.pool())
        .await
        .unwrap();
}

/// Lift the cap again (the disk was freed).
async fn free_up(store: &SqliteStore) {
    sqlx::query("PRAGMA max_page_count = 1073741823")
        .execute(store.pool())
        .await
        .unwrap();
}

fn big(i: usize) -> NewSession {
    NewSession::root(
        SessionSpec::new(format!("{i} {}", "x".repeat(64 * 1024))),
        "default",
    )
}

/// Writes until one fails; its error.
async fn write_until_full(store: &SqliteStore) -> agentq_error::Error {
    for i in 0..1000 {
        if let Err(e) = store.create_session(&big(i)).await {
            return e;
        }
    }
    panic!("the capped file took 1000 writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_does_not_wedge_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    fill_up(&store).await;
    let e = write_until_full(&store).await;
    assert!(e.to_string().contains("full"), "{e}");
    assert!(e.is_retryable(), "a full file is an outage: {e:?}");
    free_up(&store).await;
    // The next writes go through, batched or not.
    for i in 0..3 {
        store.create_session(&big(i)).await.unwrap();
    }
    store.create_sessions(&[big(7), big(8)]).await.unwrap();
    store.close().await;
}

/// While another process holds the file's write lock, writes fail (after the busy
/// timeout), and `ping`, what `/readyz` asks, fails too; once the lock is gone it
/// succeeds again, and so do writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_fails_while_the_store_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    store.ping().await.unwrap();

    let mut other = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("agentq.db"))
        .connect()
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let e = store.create_session(&big(0)).await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");
    let e = store.ping().await.unwrap_err();
    assert!(e.is_retryable(), "{e:?}");

    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    store.ping().await.unwrap();
    store.create_session(&big(1)).await.unwrap();
    // Healthy again: `ping` only reads, even while another process holds the lock.
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), store.ping())
        .await
        .unwrap()
        .unwrap();
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    store.close().await;
}

/// After the file filled up, `ping` says the store cannot write until a write works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_recovers_with_the_writer_after_a_full_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir).await;
    fill_up(&store).await;
    write_until_full(&store).await;
    free_up(&store).await;
    store.ping().await.unwrap();
    store.create_session(&big(0)).await.unwrap();
    store.close().await;
}

/// A file damaged in the middle (pages overwritten) is refused when it is opened, with a
/// message that says so and names the file; so is a file that is not a database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_file_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentq.db");
    let store = open(&dir).await;
    for i in 0..40 {
        store.create_session(&big(i)).await.unwrap();
    }
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(store.pool())
        .await
        .unwrap();
    // Everything into the main file, so that the damage below is what a reader sees.
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(store.pool())
        .await
        .unwrap();
    store.close().await;

    let mut bytes = std::fs::read(&path).unwrap();
    let page = usize::try_from(page_size).unwrap();
    let pages = bytes.len() / page;
    assert!(pages > 20, "{pages} pages");
    // Two of the pages in the middle (table and index b-tree pages among them).
    for p in [pages / 3, pages / 2] {
        bytes[p * page..(p + 1) * page].fill(0x5a);
    }
    std::fs::write(&path, &bytes).unwrap();
    match SqliteStore::open(&path).await {
        Err(e @ Error::Corrupt { .. }) => {
            let message = e.to_string();
            assert!(message.contains("corrupt"), "{message}");
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }

    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, vec![0x42; 8192]).unwrap();
    match SqliteStore::open(&junk).await {
        Err(e @ Error::Corrupt { .. }) => {
            assert!(e.to_string().contains(&junk.display().to_string()), "{e}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}
