//! The Postgres a process opens from `database_url`: one URL, the plain `PgStore` as
//! always (no routing on the way); several between commas, a `ShardedStore` over one
//! `PgStore` per URL, the control shard first (see docs/scale.md).

use std::future::Future;
use std::sync::Arc;

use anyhow::anyhow;

use agentq_core::Store;
use agentq_core::blob::s3::S3Blobs;
use agentq_core::pg::PgStore;
use agentq_core::sharded::ShardedStore;

use crate::stack::connect_error;

/// Every shard opened with `connect` (each its own pools), with the blob store's
/// objects when given.
pub(crate) async fn open_shards<F, Fut>(
    urls: &[String],
    objects: Option<Arc<S3Blobs>>,
    connect: F,
) -> anyhow::Result<Vec<PgStore>>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = agentq_core::Result<PgStore>>,
{
    if urls.is_empty() {
        return Err(anyhow!(
            "no database configured: set AGENTQ_DATABASE_URL (or database_url in agentq.toml)"
        ));
    }
    let mut shards = Vec::with_capacity(urls.len());
    for url in urls {
        let mut store = connect(url.clone())
            .await
            .map_err(|e| connect_error(e, "Postgres", url))?;
        if let Some(o) = &objects {
            store = store.with_objects(o.clone());
        }
        shards.push(store);
    }
    Ok(shards)
}

/// One store over `shards`: the store itself when there is one.
pub(crate) fn one_store(mut shards: Vec<PgStore>) -> anyhow::Result<Arc<dyn Store>> {
    if shards.len() == 1
        && let Some(store) = shards.pop()
    {
        return Ok(Arc::new(store));
    }
    Ok(Arc::new(ShardedStore::new(shards)?))
}
