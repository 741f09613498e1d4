//! What the routing modules share: items split by shard and their answers put back in
//! the caller's order, and lists from every shard merged into one page.

use std::collections::BTreeMap;

use super::ShardedStore;
use crate::error::{Error, Result};
use crate::store::Store;

impl<S: Store> ShardedStore<S> {
    /// The positions of `keys` per shard (shards without any left out), each group in
    /// the caller's order.
    pub(super) fn split<'k>(
        &self,
        keys: impl Iterator<Item = &'k str>,
    ) -> Vec<(usize, Vec<usize>)> {
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (pos, key) in keys.enumerate() {
            groups.entry(self.index(key)).or_default().push(pos);
        }
        groups.into_iter().collect()
    }
}

/// Put the answers of each group back at the positions the group came from. A shard that
/// answered for fewer items than it was given is a store bug, reported, not a success.
pub(super) fn reassemble<T>(len: usize, answers: Vec<(Vec<usize>, Vec<T>)>) -> Result<Vec<T>> {
    let mut slots: Vec<Option<T>> = (0..len).map(|_| None).collect();
    for (positions, values) in answers {
        if positions.len() != values.len() {
            return Err(Error::Conflict(format!(
                "a shard answered {} of {} items",
                values.len(),
                positions.len()
            )));
        }
        for (pos, v) in positions.into_iter().zip(values) {
            slots[pos] = Some(v);
        }
    }
    slots
        .into_iter()
        .map(|s| s.ok_or_else(|| Error::Conflict("a shard left an item unanswered".into())))
        .collect()
}

/// Each shard's answer to its part of a batch: a part whose shard is down (a retryable
/// failure) answered by `failed` (given the error and the part's positions), so that the
/// other shards' answers stand; any other failure, or every part failing, is the batch's.
pub(super) fn per_shard<T>(
    answers: Vec<(Vec<usize>, Result<Vec<T>>)>,
    failed: impl Fn(Error, &[usize]) -> Vec<T>,
) -> Result<Vec<(Vec<usize>, Vec<T>)>> {
    let parts = answers.len();
    let mut out = Vec::with_capacity(parts);
    let mut down = 0;
    for (positions, answer) in answers {
        match answer {
            Ok(values) => out.push((positions, values)),
            Err(e) if e.is_retryable() && parts > 1 => {
                down += 1;
                if down == parts {
                    return Err(e);
                }
                let values = failed(e, &positions);
                out.push((positions, values));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The answers of a part whose shard is down, for [`per_shard`]: that failure, for each
/// item of the part on its own.
pub(super) fn each_failed<T>(e: Error, positions: &[usize]) -> Vec<Result<T>> {
    let e = std::sync::Arc::new(e);
    positions
        .iter()
        .map(|_| Err(Error::Shared(e.clone())))
        .collect()
}

/// One page out of every shard's page (each sorted by `key`, ascending or descending):
/// merged in that order and cut at `limit`.
pub(super) fn merge_pages<T, K: Ord>(
    pages: Vec<Vec<T>>,
    key: impl Fn(&T) -> K,
    descending: bool,
    limit: usize,
) -> Vec<T> {
    let mut all: Vec<T> = pages.into_iter().flatten().collect();
    // Stable: equal keys (none for ids) keep the shard order.
    all.sort_by(|a, b| {
        let o = key(a).cmp(&key(b));
        if descending { o.reverse() } else { o }
    });
    all.truncate(limit);
    all
}

/// Rows grouped by `key` with `add` folding a later one into the first: for counts that
/// each shard made over its own sessions.
pub(super) fn fold<T, K: Ord>(
    rows: Vec<T>,
    key: impl Fn(&T) -> K,
    add: impl Fn(&mut T, T),
) -> Vec<T> {
    let mut out: BTreeMap<K, T> = BTreeMap::new();
    for row in rows {
        match out.entry(key(&row)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(row);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => add(o.get_mut(), row),
        }
    }
    out.into_values().collect()
}

/// A limit as a length.
pub(super) fn cap(limit: u32) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX)
}
