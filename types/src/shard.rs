//! Where a session's tree lives when the store has several Postgres primaries: the
//! partition and the map generation carried in every session id, so that any process finds
//! a session's shard from its id and the shard map alone, without a lookup.
//!
//! A session id stays a UUID v7 in its usual text form; its last 14 bits (the low end of
//! the random part, below the counter that orders ids minted in the same millisecond) hold
//! a partition, 0 to [`PARTITIONS`] − 1, in the low 10 and a generation of the shard map,
//! 0 to [`GENERATIONS`] − 1, in the 4 above. A root takes a random partition (or, with an
//! idempotency key, one drawn from the tenant and the key, so that a retried submit lands
//! where the first one did) and the generation new ids are minted in
//! ([`set_mint_generation`]); every other session of its tree takes the root's partition
//! and generation, and so does a fork (it reads its origin's history in place) and a
//! session that starts from another tree's files.
//!
//! The [`ShardMap`] says, per generation, over how many shards its partitions spread
//! (`partition % shards`). Adding a shard adds a generation: the trees minted before keep
//! the shard they were written on, new roots spread over every shard. An id is read in the
//! generation its bits name only if it was minted at or after that generation began (its
//! UUID time); any other id is read in generation 0, which is how ids minted before the
//! map existed (random bits there) keep their place.
//!
//! With one shard nothing reads either.

use std::sync::atomic::{AtomicU8, Ordering};

use uuid::Uuid;

/// How many partitions ids are spread over: the most shards a deployment can have.
pub const PARTITIONS: u16 = 1024;

/// How many generations the shard map can have: how many times shards can be added.
pub const GENERATIONS: u8 = 16;

/// The bits of the id's last two bytes that hold the partition.
const MASK: u16 = PARTITIONS - 1;

/// Where the generation starts in the id's last two bytes, above the partition.
const GENERATION_SHIFT: u16 = 10;

/// The bits of the id's last two bytes that hold the partition and the generation.
const PLACE_MASK: u16 = (1 << (GENERATION_SHIFT + 4)) - 1;

/// The generation [`id_in`] mints new roots in; set by the sharded store from the map it
/// reads, 0 in a process that has none.
static MINT_GENERATION: AtomicU8 = AtomicU8::new(0);

/// Mint new roots in generation `g` from now on (taken modulo [`GENERATIONS`]).
pub fn set_mint_generation(g: u8) {
    MINT_GENERATION.store(g % GENERATIONS, Ordering::Relaxed);
}

/// The generation new roots are minted in.
pub fn mint_generation() -> u8 {
    MINT_GENERATION.load(Ordering::Relaxed)
}

/// What an id says of its place, read from it once.
struct Place {
    partition: u16,
    /// The generation its bits name (random in an id minted before the map).
    bits_generation: u8,
    minted_ms: i64,
}

impl Place {
    fn of(id: &str) -> Option<Self> {
        let uuid = Uuid::try_parse(id).ok()?;
        let b = uuid.as_bytes();
        let bits = u16::from_be_bytes([b[14], b[15]]);
        let mut ms = [0u8; 8];
        ms[2..].copy_from_slice(&b[..6]);
        Some(Self {
            partition: bits & MASK,
            bits_generation: place_generation(bits),
            minted_ms: i64::from_be_bytes(ms),
        })
    }

    fn bits(&self) -> u16 {
        place_bits(self.bits_generation, self.partition)
    }
}

fn place_generation(bits: u16) -> u8 {
    ((bits & PLACE_MASK) >> GENERATION_SHIFT) as u8
}

fn place_bits(g: u8, partition: u16) -> u16 {
    (u16::from(g % GENERATIONS) << GENERATION_SHIFT) | (partition & MASK)
}

/// A fresh root id: time-ordered, a random partition, the generation new roots are minted
/// in.
pub fn fresh_id() -> String {
    let g = mint_generation();
    mint(|random| place_bits(g, random))
}

/// When `id` was minted (its UUID time, Unix milliseconds); `None` for a text that is no
/// UUID.
pub fn minted_at_ms(id: &str) -> Option<i64> {
    Place::of(id).map(|p| p.minted_ms)
}

/// The partition an id carries; `None` for a text that is no UUID.
pub fn partition_of(id: &str) -> Option<u16> {
    Place::of(id).map(|p| p.partition)
}

/// A fresh time-ordered id carrying `partition` (taken modulo [`PARTITIONS`]) in the
/// generation new roots are minted in.
pub fn id_in(partition: u16) -> String {
    id_placed(mint_generation(), partition)
}

/// A fresh time-ordered id carrying generation `g` and `partition` (each taken modulo
/// its count).
pub fn id_placed(g: u8, partition: u16) -> String {
    mint(|_| place_bits(g, partition))
}

/// A fresh UUID v7 whose place bits are `place` of its random ones.
fn mint(place: impl FnOnce(u16) -> u16) -> String {
    let mut bytes = *Uuid::now_v7().as_bytes();
    let random = u16::from_be_bytes([bytes[14], bytes[15]]);
    let [hi, lo] = (place(random) & PLACE_MASK).to_be_bytes();
    bytes[14] = (bytes[14] & !((PLACE_MASK >> 8) as u8)) | hi;
    bytes[15] = lo;
    Uuid::from_bytes(bytes).to_string()
}

/// A fresh id with the same partition and generation bits as `id` (a child beside its
/// root, a fork beside its origin); a random one when `id` is no UUID. The bits are
/// copied as they are: [`ShardMap::id_beside`] reads them first, for an anchor minted
/// before the map.
pub fn id_beside(id: &str) -> String {
    match Place::of(id) {
        Some(p) => mint(|_| p.bits()),
        None => Uuid::now_v7().to_string(),
    }
}

/// The partition of a submit with an idempotency key: the same for every retry of it.
pub fn key_partition(tenant: &str, key: &str) -> u16 {
    let h = fnv1a(&[tenant.as_bytes(), b"\0", key.as_bytes()]);
    (h % u64::from(PARTITIONS)) as u16
}

/// The shard of a partition among `shards` (at least 1).
pub fn shard_of(partition: u16, shards: usize) -> usize {
    usize::from(partition) % shards.max(1)
}

/// The shard that keeps `tenant`'s spend and holds (its ledger), among `shards`.
pub fn tenant_shard(tenant: &str, shards: usize) -> usize {
    (fnv1a(&[tenant.as_bytes()]) % shards.max(1) as u64) as usize
}

/// One generation of the shard map: new roots spread over `shards` shards, and ids minted
/// from `since_ms` (Unix milliseconds) on are read in it when their bits name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    pub shards: u16,
    pub since_ms: i64,
}

/// Where every id's tree lives: the map's generations, the first one first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    generations: Vec<Generation>,
}

/// Where an id is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Shard(usize),
    /// The id names a generation this map does not have: the map may be older than the
    /// id, so it is read again before the id is taken for one minted before the map.
    Unknown(u8),
}

impl ShardMap {
    /// One generation over `shards` shards: what a store without a recorded map reads.
    pub fn uniform(shards: usize) -> Self {
        let shards = u16::try_from(shards).unwrap_or(PARTITIONS);
        Self {
            generations: vec![Generation {
                shards: shards.clamp(1, PARTITIONS),
                since_ms: 0,
            }],
        }
    }

    /// A map of `generations`, checked: 1 to [`GENERATIONS`] of them, each over 1 to
    /// [`PARTITIONS`] shards, never fewer than the one before (a shard holds its trees
    /// for good) and each beginning after the one before.
    pub fn new(generations: Vec<Generation>) -> Result<Self, String> {
        if generations.is_empty() || generations.len() > usize::from(GENERATIONS) {
            return Err(format!(
                "a shard map has 1 to {GENERATIONS} generations, not {}",
                generations.len()
            ));
        }
        for (g, pair) in generations.windows(2).enumerate() {
            if pair[1].shards < pair[0].shards || pair[1].since_ms <= pair[0].since_ms {
                return Err(format!(
                    "generation {} of the shard map has fewer shards or begins no later than generation {g}",
                    g + 1
                ));
            }
        }
        if let Some(g) = generations
            .iter()
            .position(|g| g.shards == 0 || g.shards > PARTITIONS)
        {
            return Err(format!(
                "generation {g} of the shard map spans {} shards (1 to {PARTITIONS})",
                generations[g].shards
            ));
        }
        Ok(Self { generations })
    }

    pub fn generations(&self) -> &[Generation] {
        &self.generations
    }

    /// How many shards the map spans (its last generation's).
    pub fn shards(&self) -> usize {
        self.generations.last().map_or(1, |g| usize::from(g.shards))
    }

    /// The generation `id` is read in; `None` when its bits name one this map lacks.
    pub fn generation_of(&self, id: &str) -> Option<u8> {
        Place::of(id).map_or(Some(0), |p| self.generation_in(&p))
    }

    fn generation_in(&self, p: &Place) -> Option<u8> {
        let g = p.bits_generation;
        match self.generations.get(usize::from(g)) {
            _ if g == 0 => Some(0),
            Some(next) if p.minted_ms >= next.since_ms => Some(g),
            Some(_) => Some(0),
            None => None,
        }
    }

    /// The shard of `id`'s tree (the control shard for an id that is no UUID: no session
    /// has one, so any shard answers "none" alike).
    pub fn route(&self, id: &str) -> Route {
        let Some(p) = Place::of(id) else {
            return Route::Shard(0);
        };
        match self.generation_in(&p) {
            Some(g) => Route::Shard(self.shard_in(g, p.partition)),
            None => Route::Unknown(p.bits_generation),
        }
    }

    /// [`ShardMap::route`], an id naming an unknown generation read in generation 0 (as
    /// one minted before the map, with random bits there).
    pub fn shard(&self, id: &str) -> usize {
        Place::of(id).map_or(0, |p| {
            self.shard_in(self.generation_in(&p).unwrap_or(0), p.partition)
        })
    }

    fn shard_in(&self, g: u8, partition: u16) -> usize {
        let shards = self.generations.get(usize::from(g)).map_or(1, |g| g.shards);
        shard_of(partition, usize::from(shards))
    }

    /// The generation to mint new roots in at `now_ms` by a process with `usable` shards:
    /// the last one begun that spans no more.
    pub fn minting(&self, now_ms: i64, usable: usize) -> u8 {
        let g = self
            .generations
            .iter()
            .rposition(|g| g.since_ms <= now_ms && usize::from(g.shards) <= usable)
            .unwrap_or(0);
        u8::try_from(g).unwrap_or(0)
    }

    /// The shard of `tenant`'s ledger: the first generation's, for good (a tenant's spend
    /// and holds never move).
    pub fn tenant_shard(&self, tenant: &str) -> usize {
        tenant_shard(tenant, self.shards_in(0))
    }

    fn shards_in(&self, g: usize) -> usize {
        self.generations.get(g).map_or(1, |g| usize::from(g.shards))
    }

    /// The shards `partition` was on in earlier generations than `g`, other than its
    /// shard in `g`: where a submit retried across a new generation may have landed first.
    pub fn earlier_shards(&self, g: u8, partition: u16) -> Vec<usize> {
        let now = self.shard_in(g, partition);
        let mut out: Vec<usize> = (0..usize::from(g).min(self.generations.len()))
            .map(|e| shard_of(partition, self.shards_in(e)))
            .filter(|s| *s != now)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A fresh id beside `anchor`: its partition, in the generation it is read in (so that
    /// an anchor minted before the map, with random generation bits, is not read anew).
    pub fn id_beside(&self, anchor: &str) -> String {
        match Place::of(anchor) {
            Some(p) => match self.generation_in(&p) {
                Some(g) => id_placed(g, p.partition),
                None => mint(|_| p.bits()),
            },
            None => Uuid::now_v7().to_string(),
        }
    }
}

/// FNV-1a of `parts` one after the other: stable across builds, platforms and processes
/// (std's hasher promises none of these), for keys the system made itself (ids, tenants),
/// so no adversary picks collisions that matter.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_id_carries_its_partition_and_stays_a_v7_uuid() {
        for p in [0, 1, 511, 1023] {
            let id = id_in(p);
            assert_eq!(partition_of(&id), Some(p));
            assert_eq!(Uuid::parse_str(&id).unwrap().get_version_num(), 7);
            assert_eq!(partition_of(&id_beside(&id)), Some(p));
        }
        assert_eq!(partition_of("not-a-uuid"), None);
    }

    #[test]
    fn ids_minted_in_a_row_still_sort_by_creation() {
        let ids: Vec<String> = (0..200)
            .map(|i| id_placed((i % 16) as u8, 1023 - (i % 1024)))
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }

    fn map(gens: &[(u16, i64)]) -> ShardMap {
        ShardMap::new(
            gens.iter()
                .map(|(shards, since_ms)| Generation {
                    shards: *shards,
                    since_ms: *since_ms,
                })
                .collect(),
        )
        .unwrap()
    }

    fn now_ms() -> i64 {
        chrono::Utc::now().timestamp_millis()
    }

    #[test]
    fn an_id_carries_its_generation_beside_its_partition() {
        for (g, p) in [(0, 0), (1, 1023), (15, 7), (3, 512)] {
            let id = id_placed(g, p);
            assert_eq!(partition_of(&id), Some(p));
            let every: Vec<(u16, i64)> = (0..16).map(|i| (1, i)).collect();
            let m = map(&every);
            assert_eq!(m.generation_of(&id), Some(g));
            assert_eq!(m.generation_of(&id_beside(&id)), Some(g));
        }
    }

    #[test]
    fn ids_minted_before_the_map_stay_in_generation_0_whatever_their_bits() {
        // Ids of an older build: random bits where the generation is.
        let legacy: Vec<String> = (0..400).map(|_| Uuid::now_v7().to_string()).collect();
        let m = map(&[(2, 0), (3, now_ms() + 3_600_000)]);
        for id in &legacy {
            let p = partition_of(id).unwrap();
            assert_eq!(m.generation_of(id).unwrap_or(0), 0, "{id}");
            assert_eq!(m.shard(id), usize::from(p) % 2, "{id}");
            // A child beside it stays on its shard, even once the new generation began.
            let child = m.id_beside(id);
            let later = map(&[(2, 0), (3, 1)]);
            assert_eq!(later.shard(&child), m.shard(id), "{id}");
        }
    }

    #[test]
    fn a_new_generation_spreads_new_roots_over_every_shard_and_keeps_the_old_ones() {
        let m = map(&[(2, 0), (3, 1)]);
        let old: Vec<String> = (0..64).map(|p| id_placed(0, p)).collect();
        let new: Vec<String> = (0..64).map(|p| id_placed(1, p)).collect();
        for (i, id) in old.iter().enumerate() {
            assert_eq!(m.shard(id), i % 2);
        }
        let on: std::collections::BTreeSet<usize> = new.iter().map(|id| m.shard(id)).collect();
        assert_eq!(on, [0, 1, 2].into());
        assert_eq!(m.shards(), 3);
        // A generation's bits on an id minted before it began: read in generation 0.
        let early = map(&[(2, 0), (3, now_ms() + 3_600_000)]);
        assert_eq!(early.generation_of(&id_placed(1, 5)), Some(0));
        assert_eq!(early.shard(&id_placed(1, 5)), 1);
    }

    #[test]
    fn a_generation_the_map_lacks_is_unknown_until_read_again() {
        let old = map(&[(2, 0)]);
        let id = id_placed(1, 5);
        assert_eq!(old.route(&id), Route::Unknown(1));
        assert_eq!(old.shard(&id), 1);
        assert_eq!(map(&[(2, 0), (3, 1)]).route(&id), Route::Shard(2));
        assert_eq!(old.route("not-a-uuid"), Route::Shard(0));
    }

    #[test]
    fn new_roots_are_minted_in_the_last_generation_begun_that_the_process_can_reach() {
        let m = map(&[(2, 0), (3, 100), (4, 200)]);
        assert_eq!(m.minting(50, 4), 0);
        assert_eq!(m.minting(150, 4), 1);
        assert_eq!(m.minting(250, 4), 2);
        assert_eq!(m.minting(250, 3), 1);
        assert_eq!(m.minting(250, 1), 0);
    }

    #[test]
    fn a_ledger_and_a_retried_key_find_their_first_shards() {
        let m = map(&[(2, 0), (3, 1)]);
        for t in ["acme", "beta", "gamma"] {
            assert_eq!(m.tenant_shard(t), tenant_shard(t, 2));
        }
        // Partition 4: shard 0 in generation 0, 1 in generation 1.
        assert_eq!(m.earlier_shards(1, 4), vec![0]);
        // Partition 6: shard 0 in both.
        assert!(m.earlier_shards(1, 6).is_empty());
        assert!(m.earlier_shards(0, 4).is_empty());
    }

    #[test]
    fn a_map_that_loses_a_shard_or_goes_back_in_time_is_refused() {
        let generation = |shards, since_ms| Generation { shards, since_ms };
        assert!(ShardMap::new(vec![]).is_err());
        assert!(ShardMap::new(vec![generation(3, 0), generation(2, 5)]).is_err());
        assert!(ShardMap::new(vec![generation(2, 5), generation(3, 5)]).is_err());
        assert!(ShardMap::new(vec![generation(0, 0)]).is_err());
        assert!(ShardMap::new(vec![generation(1025, 0)]).is_err());
        assert!(ShardMap::new((0..17).map(|i| generation(1, i)).collect()).is_err());
        assert!(ShardMap::new(vec![generation(1, 0), generation(1, 5)]).is_ok());
    }

    #[test]
    fn a_key_picks_the_same_partition_every_time() {
        assert_eq!(key_partition("t", "k"), key_partition("t", "k"));
        assert!(key_partition("t", "k") < PARTITIONS);
        assert_eq!(shard_of(1023, 2), 1);
        assert_eq!(shard_of(7, 1), 0);
        assert!(tenant_shard("acme", 3) < 3);
    }
}
