//! The sharded [`Store`]: several Postgres primaries, each an unchanged [`crate::pg::PgStore`],
//! behind one store. It owns the routing and nothing else: a session's tree lives on the
//! shard its id's partition maps to (`agentq_types::shard`), so a call about one session
//! or tree goes to that shard alone; a batch call (group commit, heartbeats, marks) is split
//! by shard and its answers put back in the caller's order; a list or a count is asked of
//! every shard and merged. Rows that belong to no tree (API keys, queues, stored budgets,
//! schedules, webhook endpoints) live on the control shard (the first), endpoints also on
//! every shard whose triggers write their outbox; a tenant's spend and holds live on its
//! home shard (a hash of the tenant). No call spans shards in one transaction.
//!
//! Each trait's routing has its own module: `sessions` (sessions, leases, inboxes),
//! `sweep` (the sweeper's, reports, retention), `global` (keys, queues, budgets,
//! schedules), `hooks` (webhooks), `work` (workspaces, blobs, batches); `merge` holds the
//! splitting and merging they share, `probe` the record tests use to check that a call
//! about one session touched one shard.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::store::Store;

pub use probe::Probe;

/// Routes one call about the session or tree `$key` to its shard, recorded by the probe
/// when there is one.
macro_rules! by_id {
    ($self:ident, $name:literal, $key:expr, |$s:ident| $call:expr) => {{
        let i = $self.route($key).await?;
        match &$self.probe {
            None => {
                let $s = $self.on(i);
                $call.await
            }
            Some(p) => {
                let p = p.clone();
                $crate::sharded::probe::scoped(&p, $name, i, async {
                    let $s = $self.on(i);
                    $call.await
                })
                .await
            }
        }
    }};
}

mod global;
mod hooks;
mod merge;
pub mod probe;
mod routing;
mod sessions;
mod sweep;
mod work;

/// Several stores, one per Postgres primary; the first is the control shard.
pub struct ShardedStore<S = crate::pg::PgStore> {
    shards: Vec<S>,
    probe: Option<Arc<Probe>>,
    routing: routing::Routing,
    /// Which shard each claimed webhook delivery came from (its id does not say), so that
    /// its attempt is recorded there; forgotten once recorded.
    deliveries: Mutex<HashMap<String, usize>>,
}

impl<S> std::fmt::Debug for ShardedStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedStore")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl<S: Store> ShardedStore<S> {
    /// A store over `shards` (the control shard first, then the others in the order they
    /// were added: the shard map counts them so). It reads the shard map on its first call
    /// about a session; [`ShardedStore::open`] reads it first and checks it.
    pub fn new(shards: Vec<S>) -> Result<Self> {
        if shards.is_empty() {
            return Err(Error::Config(
                "a sharded store needs at least one shard".into(),
            ));
        }
        Ok(Self {
            routing: routing::Routing::new(shards.len()),
            shards,
            probe: None,
            deliveries: Mutex::new(HashMap::new()),
        })
    }

    /// [`ShardedStore::new`], the shard map read from the control shard and checked to
    /// span no more shards than given (a process started without a shard the map names
    /// would not find that shard's sessions). More shards than the map spans are served
    /// (their URLs given before `agentq migrate` adds them to the map); new trees go to
    /// them once it has.
    pub async fn open(shards: Vec<S>) -> Result<Self> {
        let store = Self::new(shards)?;
        let map = store.read_shard_map().await?;
        if map.shards() > store.shards.len() {
            return Err(Error::Config(format!(
                "the shard map spans {} shards, and database_url names {}: give it every shard, in the order they were added",
                map.shards(),
                store.shards.len()
            )));
        }
        Ok(store)
    }

    /// Read the shard map again this often instead of every 30 s (tests).
    pub fn with_map_reread(mut self, every: std::time::Duration) -> Self {
        self.routing.reread = every;
        self
    }

    /// Record which shards each call about one session touched (tests).
    pub fn with_probe(mut self, probe: Arc<Probe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// The shards, the control shard first.
    pub fn shards(&self) -> &[S] {
        &self.shards
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The shard of a session or tree id by the map as last read (the control shard for
    /// an id that is no UUID: no session has one, so any shard answers "none" alike). A
    /// call about one session goes through [`ShardedStore::route`], which reads the map
    /// again when the id asks for it and refuses a shard this store lacks; this is for the
    /// ids such a call let in (the sessions a batch call names were created or claimed so).
    pub fn index(&self, id: &str) -> usize {
        self.reachable(self.routing.map().shard(id))
    }

    /// Shard `i`, or the control shard when this store lacks it (a map over more shards
    /// than given: see [`ShardedStore::index`]).
    fn reachable(&self, i: usize) -> usize {
        if i < self.shards.len() { i } else { 0 }
    }

    /// The shard map as last read.
    pub fn shard_map(&self) -> Arc<agentq_types::shard::ShardMap> {
        self.routing.map()
    }

    /// Shard `i`, noted by the probe.
    fn on(&self, i: usize) -> &S {
        if self.probe.is_some() {
            probe::touch(i);
        }
        &self.shards[i]
    }

    /// Where rows of no tree live.
    fn control(&self) -> &S {
        self.on(0)
    }

    /// Where `tenant`'s spend and holds live.
    fn home(&self, tenant: &str) -> &S {
        self.on(self.reachable(self.routing.map().tenant_shard(tenant)))
    }

    /// `f` on every shard at once, the answers in shard order.
    async fn each<'a, T, F, Fut>(&'a self, f: F) -> Result<Vec<T>>
    where
        F: Fn(&'a S) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let calls = (0..self.shards.len()).map(|i| f(self.on(i)));
        futures::future::try_join_all(calls).await
    }

    /// [`ShardedStore::each`], the counts added.
    async fn sum<'a, F, Fut>(&'a self, f: F) -> Result<u64>
    where
        F: Fn(&'a S) -> Fut,
        Fut: Future<Output = Result<u64>> + 'a,
    {
        Ok(self.each(f).await?.into_iter().sum())
    }

    /// [`ShardedStore::each`], the lists concatenated.
    async fn concat<'a, T, F, Fut>(&'a self, f: F) -> Result<Vec<T>>
    where
        F: Fn(&'a S) -> Fut,
        Fut: Future<Output = Result<Vec<T>>> + 'a,
    {
        Ok(self.each(f).await?.into_iter().flatten().collect())
    }
}

#[async_trait]
impl<S: Store> Store for ShardedStore<S> {
    /// Every shard must be migrated far enough.
    async fn check_schema(&self) -> Result<()> {
        self.each(|s| s.check_schema()).await.map(|_| ())
    }
}

#[async_trait]
impl<S: Store> crate::shard_map::ShardStore for ShardedStore<S> {
    async fn shard_generations(&self) -> Result<Vec<agentq_types::shard::Generation>> {
        self.control().shard_generations().await
    }

    async fn session_with_key(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<crate::model::SessionRow>> {
        let found = self.each(|s| s.session_with_key(tenant, key)).await?;
        Ok(found.into_iter().flatten().next())
    }
}
