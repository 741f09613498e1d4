//! What the store's test binaries share: a fresh store of each backend, the
//! `contract_tests!` macro that runs one case against both, the database clock tests move
//! instead of sleeping ([`clock`]), the tables they count ([`rows`]), and the session steps
//! the cases are written in ([`steps`]).

// Each binary uses its own part of what is here.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod clock;
pub mod rows;
pub mod steps;

use std::time::Duration;

use agentq_store::pg::PgStore;
use agentq_store::sharded::{Probe, ShardedStore};
use agentq_store::sqlite::SqliteStore;

pub use clock::{Backend, Clock};
pub use rows::Rows;
pub use steps::*;
pub use steps::{files, tree};

/// A lease no test outlives.
pub const TTL: Duration = Duration::from_secs(30);
/// A lease a test lets expire, by moving the clock past it ([`Clock::pass`]). Long
/// enough that it never expires on its own while a test runs on a loaded machine.
pub const SHORT_TTL: Duration = Duration::from_secs(5);

/// A migrated store on a fresh database of the testkit's shared Postgres.
pub async fn pg_store() -> PgStore {
    let url = agentq_testkit::migrated_database(
        agentq_testkit::shared_postgres().expect("shared postgres"),
    )
    .expect("a fresh migrated database");
    let store = PgStore::connect(&url, 8).await.expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// A sharded store over two migrated Postgres stores, each on a fresh database of its own
/// shared server, with the probe that records which shards each call about one session
/// touched.
pub async fn sharded_store() -> (ShardedStore, std::sync::Arc<Probe>) {
    let shards = pg_shards(2).await;
    let probe = std::sync::Arc::new(Probe::new());
    let store = ShardedStore::new(shards)
        .expect("shards")
        .with_probe(probe.clone());
    (store, probe)
}

/// `n` migrated Postgres stores, each on a fresh database of the shared server of its
/// index (at most 3).
pub async fn pg_shards(n: usize) -> Vec<PgStore> {
    let mut shards = Vec::new();
    for i in 0..n {
        let url = agentq_testkit::migrated_database(
            agentq_testkit::shared_postgres_shard(i).expect("shared postgres shard"),
        )
        .expect("a fresh migrated database");
        let store = PgStore::connect(&url, 8).await.expect("connect");
        store.migrate().await.expect("migrate");
        shards.push(store);
    }
    shards
}

/// Every call about one session went to its shard and touched no other.
pub fn assert_one_shard_per_call(probe: &Probe) {
    let strays = probe.strays();
    assert!(
        strays.is_empty(),
        "calls that touched other shards: {strays:?}"
    );
}

/// A migrated store on a file in a temporary directory (kept while the store is used).
pub async fn sqlite_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("agentq.db"))
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    (dir, store)
}

/// One `#[tokio::test]` per backend per case: `pg::<case>`, `sqlite::<case>` and
/// `sharded::<case>` (two Postgres shards, every call about one session checked to touch
/// one shard), each case an `async fn(&dyn Store)` (or `&dyn Backend`) of the invoking
/// module.
macro_rules! contract_tests {
    ($($case:ident),* $(,)?) => {
        mod pg {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = $crate::common::pg_store().await;
                    super::$case(&store).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (_dir, store) = $crate::common::sqlite_store().await;
                    super::$case(&store).await;
                    store.close().await;
                }
            )*
        }
        mod sharded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let (store, probe) = $crate::common::sharded_store().await;
                    super::$case(&store).await;
                    $crate::common::assert_one_shard_per_call(&probe);
                }
            )*
        }
    };
}
pub(crate) use contract_tests;
