//! Rows counted in a table of either backend (their schemas are level, as
//! `schema_parity.rs` checks): what a case checks the store wrote beyond what its reads
//! show, such as a retried write stored once or a prompt kept only in the spec.

use async_trait::async_trait;

use agentq_store::pg::PgStore;
use agentq_store::sharded::ShardedStore;
use agentq_store::sqlite::SqliteStore;

/// A backend whose tables a test can count.
#[async_trait]
pub trait Rows: Sync {
    /// How many rows `table` holds.
    async fn rows(&self, table: &str) -> i64;
}

/// The same statement on each backend's pool.
macro_rules! rows_by_count {
    ($($store:ty),*) => {
        $(
            #[async_trait]
            impl Rows for $store {
                async fn rows(&self, table: &str) -> i64 {
                    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
                        .fetch_one(self.pool())
                        .await
                        .unwrap()
                }
            }
        )*
    };
}

rows_by_count!(PgStore, SqliteStore);

/// The rows of every shard.
#[async_trait]
impl Rows for ShardedStore {
    async fn rows(&self, table: &str) -> i64 {
        let mut n = 0;
        for shard in ShardedStore::shards(self) {
            n += shard.rows(table).await;
        }
        n
    }
}
