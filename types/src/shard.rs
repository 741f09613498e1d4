//! Where a session's tree lives when the store has several Postgres primaries: the
//! partition carried in every session id, so that any process finds a session's shard from
//! its id alone, without a lookup.
//!
//! A session id stays a UUID v7 in its usual text form; its last 10 bits (the low end of
//! the random part, below the counter that orders ids minted in the same millisecond) hold
//! a partition, 0 to [`PARTITIONS`] − 1. A root takes a random one (or, with an
//! idempotency key, one drawn from the tenant and the key, so that a retried submit lands
//! where the first one did); every other session of its tree takes the root's, and so does
//! a fork (it reads its origin's history in place) and a session that starts from another
//! tree's files. A partition maps to a shard as `partition % shards` ([`shard_of`]).
//!
//! With one shard nothing reads the partition. Ids minted before it existed carry random
//! low bits, which is why going from one shard to several needs a partition map that sends
//! every partition to the old shard first (see docs/scale.md).

use uuid::Uuid;

/// How many partitions ids are spread over: the most shards a deployment can have.
pub const PARTITIONS: u16 = 1024;

/// The bits of the id's last two bytes that hold the partition.
const MASK: u16 = PARTITIONS - 1;

/// The partition an id carries; `None` for a text that is no UUID.
pub fn partition_of(id: &str) -> Option<u16> {
    let uuid = Uuid::try_parse(id).ok()?;
    let b = uuid.as_bytes();
    Some(u16::from_be_bytes([b[14], b[15]]) & MASK)
}

/// A fresh time-ordered id carrying `partition` (taken modulo [`PARTITIONS`]).
pub fn id_in(partition: u16) -> String {
    let mut bytes = *Uuid::now_v7().as_bytes();
    let p = partition & MASK;
    let [hi, lo] = p.to_be_bytes();
    bytes[14] = (bytes[14] & !(MASK >> 8) as u8) | hi;
    bytes[15] = lo;
    Uuid::from_bytes(bytes).to_string()
}

/// A fresh id in the same partition as `id` (a child beside its root, a fork beside its
/// origin); a random one when `id` is no UUID.
pub fn id_beside(id: &str) -> String {
    match partition_of(id) {
        Some(p) => id_in(p),
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

/// FNV-1a: stable across builds and platforms (std's hasher promises neither), and the
/// inputs are the caller's own keys, so no adversary picks collisions that matter.
fn fnv1a(parts: &[&[u8]]) -> u64 {
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
        let ids: Vec<String> = (0..200).map(|i| id_in(1023 - (i % 1024))).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
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
