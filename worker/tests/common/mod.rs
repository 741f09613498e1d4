//! What the worker's integration tests share: a fresh database on the shared private
//! Postgres and a private Redis with the default queue.

use std::sync::Arc;

use agentq_core::WorkQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_testkit::{RedisServer, shared_postgres};

/// A migrated fresh database and a private Redis with the `default` queue; the server
/// lives as long as the returned handle.
pub async fn setup() -> (Arc<PgStore>, Arc<RedisQueue>, RedisServer) {
    let url = shared_postgres().unwrap().fresh_database().unwrap();
    let store = PgStore::connect(&url, 8).await.unwrap();
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
    queue.ensure_queue("default").await.unwrap();
    (Arc::new(store), Arc::new(queue), redis)
}
