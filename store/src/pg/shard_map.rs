//! The shard map on Postgres: read from `shard_generations` (the control shard's is the
//! one that counts), and recorded over every shard by `agentq migrate`
//! ([`record_shard_map`]), which adds a generation when it is given one more shard.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use agentq_types::shard::{Generation, ShardMap};

use super::PgStore;
use crate::error::{Error, Result};
use crate::model::SessionRow;
use crate::shard_map::ShardStore;
use crate::sql::batches::POSTGRES as BATCH_SQL;
use crate::store::SessionStore;

const SELECT_GENERATIONS: &str =
    "SELECT generation, shards, since FROM shard_generations ORDER BY generation";

#[async_trait]
impl ShardStore for PgStore {
    async fn shard_generations(&self) -> Result<Vec<Generation>> {
        let rows: Vec<(i32, i32, DateTime<Utc>)> = sqlx::query_as(SELECT_GENERATIONS)
            .fetch_all(&self.pool)
            .await?;
        generations(rows)
    }

    async fn session_with_key(&self, tenant: &str, key: &str) -> Result<Option<SessionRow>> {
        let owner: Option<String> = sqlx::query_scalar(&BATCH_SQL.key_owner)
            .bind(tenant)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        match owner {
            Some(id) => self.get(&id).await,
            None => Ok(None),
        }
    }
}

fn generations(rows: Vec<(i32, i32, DateTime<Utc>)>) -> Result<Vec<Generation>> {
    rows.into_iter()
        .enumerate()
        .map(|(i, (g, shards, since))| {
            if usize::try_from(g).ok() != Some(i) {
                return Err(Error::Config(format!(
                    "the shard map has no generation {i} (found {g} in its place)"
                )));
            }
            let shards = u16::try_from(shards).map_err(|_| {
                Error::Config(format!(
                    "generation {g} of the shard map spans {shards} shards"
                ))
            })?;
            Ok(Generation {
                shards,
                since_ms: since.timestamp_millis(),
            })
        })
        .collect()
}

/// What [`record_shard_map`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapRecorded {
    /// The map now recorded.
    pub map: ShardMap,
    /// The generations this call added (none when the map already spanned the shards).
    pub added: Vec<u8>,
}

/// Record the shard map for `shards` (the control shard first, every one migrated) on the
/// control shard, as `agentq migrate` does after migrating them:
///
/// - no map yet: one generation over every shard, except when only the control shard
///   holds sessions (the data of one Postgres, now given more): then a first generation
///   over that one shard and a second over all, so that its trees stay where they are;
/// - a map over fewer shards: a generation over all, from now on (new trees spread over
///   every shard; the trees written before stay on theirs);
/// - a map over more shards: refused, naming `database_url` (a shard holds its trees for
///   good and cannot be left out).
///
/// The table is locked for the call, so two at once add one generation, not two.
pub async fn record_shard_map(shards: &[PgStore]) -> Result<MapRecorded> {
    let Some(control) = shards.first() else {
        return Err(Error::Config("no shard to record a shard map on".into()));
    };
    let n = i32::try_from(shards.len())
        .ok()
        .filter(|n| *n <= i32::from(agentq_types::shard::PARTITIONS))
        .ok_or_else(|| {
            Error::Config(format!(
                "database_url names {} shards; at most {} can be",
                shards.len(),
                agentq_types::shard::PARTITIONS
            ))
        })?;
    let mut tx = control.pool.begin().await?;
    sqlx::query("LOCK TABLE shard_generations IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let rows: Vec<(i32, i32, DateTime<Utc>)> = sqlx::query_as(SELECT_GENERATIONS)
        .fetch_all(&mut *tx)
        .await?;
    let had = rows.len();
    let wanted: Vec<i32> = match rows.last() {
        None => first_generations(shards, n).await?,
        Some((_, latest, _)) if *latest == n => Vec::new(),
        Some((_, latest, _)) if *latest < n => vec![n],
        Some((_, latest, _)) => {
            return Err(Error::Config(format!(
                "database_url names {n} shards, but the shard map spans {latest}: a shard holds its trees for good and cannot be left out"
            )));
        }
    };
    let mut added = Vec::with_capacity(wanted.len());
    for (k, count) in wanted.iter().enumerate() {
        let g = had.saturating_add(k);
        let generation = u8::try_from(g)
            .ok()
            .filter(|g| *g < agentq_types::shard::GENERATIONS)
            .ok_or_else(|| {
                Error::Config(format!(
                    "the shard map has {had} generations, the most there can be: no shard can be added"
                ))
            })?;
        // The first generation reads every id minted before the map; the next ones begin
        // now, in whole milliseconds (what an id's time holds), each after the one before.
        sqlx::query(
            "INSERT INTO shard_generations (generation, shards, since) \
             SELECT $1, $2, CASE WHEN $1 = 0 THEN to_timestamp(0) ELSE GREATEST( \
                 date_trunc('milliseconds', clock_timestamp()), \
                 (SELECT max(since) FROM shard_generations) + interval '1 millisecond') END",
        )
        .bind(i32::from(generation))
        .bind(count)
        .execute(&mut *tx)
        .await?;
        added.push(generation);
    }
    let rows: Vec<(i32, i32, DateTime<Utc>)> = sqlx::query_as(SELECT_GENERATIONS)
        .fetch_all(&mut *tx)
        .await?;
    let map = ShardMap::new(generations(rows)?).map_err(Error::Config)?;
    tx.commit().await?;
    Ok(MapRecorded { map, added })
}

/// The first map's generations: see [`record_shard_map`].
async fn first_generations(shards: &[PgStore], n: i32) -> Result<Vec<i32>> {
    let mut holding = Vec::with_capacity(shards.len());
    for s in shards {
        let any: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sessions)")
            .fetch_one(&s.pool)
            .await?;
        holding.push(any);
    }
    let only_control = holding.first() == Some(&true) && !holding.iter().skip(1).any(|h| *h);
    Ok(if n > 1 && only_control {
        vec![1, n]
    } else {
        vec![n]
    })
}
