//! The shard map a sharded store routes by. It is read from the control shard when the
//! store opens, again every [`REREAD`], and at once when an id names a generation the map
//! lacks and may be newer than the map: a process learns of an added shard from the map,
//! without a restart, provided `database_url` names it already. The generation new roots
//! are minted in follows the map read.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use agentq_types::shard::{Route, ShardMap, minted_at_ms, set_mint_generation};

use super::ShardedStore;
use crate::error::{Error, Result};
use crate::store::Store;

/// How often the map is read again: how soon after `agentq migrate` adds a shard new
/// roots start going to it. One small query on the control shard.
pub(super) const REREAD: Duration = Duration::from_secs(30);

/// How far apart two machines' clocks may be. An id minted this much before a read of the
/// map began, naming a generation the map lacks, was minted before the map existed: an id
/// is read in a generation only if minted after it began, so the read would have found it.
const CLOCK_MARGIN_MS: i64 = 1_000;

pub(super) struct Routing {
    map: RwLock<Arc<ShardMap>>,
    /// What `tried_ms` counts from.
    start: Instant,
    /// When the map was last read, or a read of it failed, in milliseconds since `start`;
    /// [`NEVER`] before the first.
    tried_ms: AtomicU64,
    /// When the last successful read of the map began, by this machine's clock (Unix
    /// milliseconds).
    read_began_ms: AtomicI64,
    /// How often the map is read again ([`REREAD`] but in tests).
    pub(super) reread: Duration,
    /// One read at a time.
    reading: tokio::sync::Mutex<()>,
}

const NEVER: u64 = u64::MAX;

impl Routing {
    /// Until it is read: one generation over every shard given.
    pub(super) fn new(shards: usize) -> Self {
        Self {
            map: RwLock::new(Arc::new(ShardMap::uniform(shards))),
            start: Instant::now(),
            tried_ms: AtomicU64::new(NEVER),
            read_began_ms: AtomicI64::new(i64::MIN),
            reread: REREAD,
            reading: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn map(&self) -> Arc<ShardMap> {
        match self.map.read() {
            Ok(m) => m.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn since_start_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NEVER - 1)
    }

    /// Whether the map is to be read again.
    fn due(&self) -> bool {
        let tried = self.tried_ms.load(Ordering::Relaxed);
        let every = u64::try_from(self.reread.as_millis()).unwrap_or(NEVER);
        tried == NEVER || self.since_start_ms().saturating_sub(tried) >= every
    }

    fn mark_tried(&self) {
        self.tried_ms
            .store(self.since_start_ms(), Ordering::Relaxed);
    }

    /// Whether `id`, naming a generation the map lacks, was minted before the map was
    /// read: then it was minted before the map existed and is read in generation 0.
    fn older_than_map(&self, id: &str) -> bool {
        let began = self.read_began_ms.load(Ordering::Acquire);
        minted_at_ms(id).is_some_and(|ms| ms.saturating_add(CLOCK_MARGIN_MS) < began)
    }

    fn set(&self, map: ShardMap, usable: usize, began_ms: i64) {
        let now = chrono::Utc::now().timestamp_millis();
        set_mint_generation(map.minting(now, usable));
        match self.map.write() {
            Ok(mut m) => *m = Arc::new(map),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(map),
        }
        self.read_began_ms.store(began_ms, Ordering::Release);
    }
}

impl<S: Store> ShardedStore<S> {
    /// Read the shard map from the control shard now. With none recorded, one generation
    /// over the shards given (as before maps were recorded). A map over more shards than
    /// this store has is kept: the ids it places beyond them are refused by
    /// [`ShardedStore::route`], and new roots are minted where this store reaches.
    pub async fn read_shard_map(&self) -> Result<Arc<ShardMap>> {
        // Not through `on`: a by-id call that reads the map on its way still touched one
        // shard for what it asked.
        let began_ms = chrono::Utc::now().timestamp_millis();
        let read = self.shards[0].shard_generations().await;
        self.routing.mark_tried();
        let generations = read?;
        let map = if generations.is_empty() {
            ShardMap::uniform(self.shards.len())
        } else {
            ShardMap::new(generations).map_err(Error::Config)?
        };
        self.routing.set(map, self.shards.len(), began_ms);
        Ok(self.routing.map())
    }

    /// The shard of a session or tree id, by the map as read; the map read again first
    /// when it is due, or when the id names a generation it lacks.
    pub(super) async fn route(&self, id: &str) -> Result<usize> {
        if self.routing.due()
            && let Ok(_one) = self.routing.reading.try_lock()
            && self.routing.due()
            && let Err(e) = self.read_shard_map().await
        {
            tracing::warn!(error = %e, "cannot read the shard map again; routing by the one read before");
        }
        let i = match self.routing.map().route(id) {
            Route::Shard(i) => i,
            Route::Unknown(_) if self.routing.older_than_map(id) => self.routing.map().shard(id),
            Route::Unknown(_) => {
                // Read after the id was minted, a map without its generation shows the id was
                // minted before the map (random bits there): generation 0.
                let _one = self.routing.reading.lock().await;
                if !self.routing.older_than_map(id) {
                    self.read_shard_map().await?;
                }
                self.routing.map().shard(id)
            }
        };
        if i < self.shards.len() {
            return Ok(i);
        }
        Err(Error::Config(format!(
            "session {id} lives on shard {i} (counting from 0) of the shard map, and database_url names {} shards: give every process every shard's URL",
            self.shards.len()
        )))
    }
}
