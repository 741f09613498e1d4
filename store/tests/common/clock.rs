//! The database clock, moved by tests instead of waited for. Postgres' statements compare
//! against its `now()`, SQLite's against a "now" the store binds; neither can be paused,
//! so a test makes time pass for the store by moving every stored point in time that a
//! statement compares with "now" back by the same amount, as if that much time had gone
//! by: lease expiries, queue entries, creation and finish times, approval deadlines and
//! wake-ups (`sessions`), tenant holds' expiry, blobs' last touch, workers' liveness and
//! the finish of sessions not announced yet. Relations between
//! them (an entry added before a lease expired) are kept. `started_at`, which a resumed
//! state carries, is not a deadline and stays.

use std::time::Duration;

use async_trait::async_trait;

use agentq_store::pg::PgStore;
use agentq_store::sharded::ShardedStore;
use agentq_store::sqlite::SqliteStore;
use agentq_store::store::Store;

use super::rows::Rows;

/// The columns of `sessions` moved; each `col = col - d` leaves a NULL as it is.
const SESSION_TIMES: [&str; 6] = [
    "lease_expires_at",
    "enqueued_at",
    "created_at",
    "finished_at",
    "approval_deadline",
    "wake_at",
];

/// `table` and its columns moved, after `sessions`.
const OTHER_TIMES: [(&str, &str); 4] = [
    ("tenant_holds", "expires_at"),
    ("blobs", "touched_at"),
    ("workers", "expires_at"),
    ("unannounced", "finished_at"),
];

/// A backend whose clock a test can move.
#[async_trait]
pub trait Clock: Sync {
    /// Let `by` pass for the store: every deadline it keeps is `by` nearer (or further
    /// behind), without waiting.
    async fn pass(&self, by: Duration);

    /// How many shards the store spreads sessions over: the sweeper's limits hold per
    /// shard.
    fn shards(&self) -> usize {
        1
    }
}

/// A store under test whose clock the test moves and whose tables it counts.
pub trait Backend: Store + Clock + Rows {}

impl<T: Store + Clock + Rows> Backend for T {}

/// `UPDATE table SET c = c - <by>, …` with `by` as the dialect spells a length of time.
fn shift(table: &str, columns: &[&str], by: &str) -> String {
    let set: Vec<String> = columns
        .iter()
        .map(|c| format!("{c} = {c} - {by}"))
        .collect();
    format!("UPDATE {table} SET {}", set.join(", "))
}

/// Every statement that moves the clock, with `by` for the length of time.
fn statements(by: &str) -> Vec<String> {
    let mut all = vec![shift("sessions", &SESSION_TIMES, by)];
    all.extend(OTHER_TIMES.iter().map(|(t, c)| shift(t, &[c], by)));
    all
}

#[async_trait]
impl Clock for PgStore {
    async fn pass(&self, by: Duration) {
        for sql in statements("make_interval(secs => $1)") {
            sqlx::query(&sql)
                .bind(by.as_secs_f64())
                .execute(self.pool())
                .await
                .unwrap();
        }
    }
}

/// Time passes for every shard alike.
#[async_trait]
impl Clock for ShardedStore {
    async fn pass(&self, by: Duration) {
        for shard in ShardedStore::shards(self) {
            shard.pass(by).await;
        }
    }

    fn shards(&self) -> usize {
        self.len()
    }
}

#[async_trait]
impl Clock for SqliteStore {
    /// SQLite's times are unix microseconds.
    async fn pass(&self, by: Duration) {
        let us = i64::try_from(by.as_micros()).unwrap();
        for sql in statements("$1") {
            sqlx::query(&sql)
                .bind(us)
                .execute(self.pool())
                .await
                .unwrap();
        }
    }
}
