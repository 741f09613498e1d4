//! What a store answers as one shard among several: the shard map recorded on it (the
//! control shard's is the one read) and the session a tenant's idempotency key created on
//! it (a submit retried after a shard was added may have landed on its key's shard of an
//! earlier generation). The map itself, and how an id is read with it, is
//! `agentq_types::shard`.

use async_trait::async_trait;

use agentq_types::shard::Generation;

use crate::error::Result;
use crate::model::SessionRow;

#[async_trait]
pub trait ShardStore: Send + Sync {
    /// The shard map's generations recorded here, the first first; empty when none is
    /// (the embedded store never records one: it has one shard).
    async fn shard_generations(&self) -> Result<Vec<Generation>>;

    /// The session here whose submit by `tenant` carried idempotency `key`.
    async fn session_with_key(&self, tenant: &str, key: &str) -> Result<Option<SessionRow>>;
}
