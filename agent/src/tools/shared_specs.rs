//! The tool specs runs offer, shared across the runs of a process: every session that
//! offers the same tools holds one copy of their names, descriptions and schemas.
//!
//! A run builds its specs when it starts and keeps them until it ends, so a worker with
//! tens of thousands of sessions in flight held as many copies of the same few schemas
//! (a schema is a tree of small allocations). A run's specs are looked up here by their
//! content and replaced by the copy another run holds, with what they add to a call's
//! input estimate ([`crate::admission::tools_len`], counted when the set is first seen);
//! the table keeps only weak references, so a set of specs no run offers any more is freed
//! with its last run.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use crate::admission::tools_len;
use crate::schema::ToolSpec;

/// Entries the table holds before it first drops the dead ones.
const FIRST_PRUNE: usize = 64;

/// A set some run may still hold, with its [`tools_len`].
type Held = (Weak<[ToolSpec]>, usize);

#[derive(Default)]
struct Table {
    by_hash: HashMap<u64, Vec<Held>>,
    entries: usize,
    /// Drop dead entries once `entries` reaches this: twice what was alive at the last
    /// pruning, so pruning costs O(1) per share over time.
    prune_at: usize,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        prune_at: FIRST_PRUNE,
        ..Table::default()
    })
});

/// `specs`, or an equal set of specs that another run holds already, and their
/// [`tools_len`].
pub fn share(specs: Vec<ToolSpec>) -> (Arc<[ToolSpec]>, usize) {
    let key = content_hash(&specs);
    // The table is only ever left consistent: a panic elsewhere cannot poison its meaning.
    let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(held) = table.by_hash.get(&key).and_then(|list| {
        list.iter()
            .filter_map(|(w, bytes)| Some((w.upgrade()?, *bytes)))
            .find(|(held, _)| **held == *specs)
    }) {
        return held;
    }
    let bytes = tools_len(&specs);
    let shared: Arc<[ToolSpec]> = specs.into();
    table
        .by_hash
        .entry(key)
        .or_default()
        .push((Arc::downgrade(&shared), bytes));
    table.entries = table.entries.saturating_add(1);
    if table.entries >= table.prune_at {
        table.prune();
    }
    (shared, bytes)
}

impl Table {
    fn prune(&mut self) {
        self.by_hash.retain(|_, list| {
            list.retain(|(w, _)| w.strong_count() > 0);
            !list.is_empty()
        });
        self.entries = self.by_hash.values().map(Vec::len).sum();
        self.prune_at = self.entries.saturating_mul(2).max(FIRST_PRUNE);
    }
}

/// A hash of what `specs` say, their schemas hashed as the JSON they encode to (a `Value`
/// has no `Hash`), without building that JSON.
fn content_hash(specs: &[ToolSpec]) -> u64 {
    let mut h = DefaultHasher::new();
    for s in specs {
        s.name.hash(&mut h);
        s.description.hash(&mut h);
        // Writing into a hasher cannot fail, and a `Value` always encodes.
        let _ = serde_json::to_writer(HashWriter(&mut h), &s.parameters);
    }
    h.finish()
}

struct HashWriter<'a>(&'a mut DefaultHasher);

impl io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(name: &str, max: u64) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("{name} does things"),
            parameters: json!({"type": "object", "properties": {"n": {"maximum": max}}}),
        }
    }

    #[test]
    fn equal_specs_share_one_copy_and_different_ones_do_not() {
        let set = || vec![spec("shared_specs_a", 1), spec("shared_specs_b", 2)];
        let (a, a_bytes) = share(set());
        let (b, b_bytes) = share(set());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((a_bytes, b_bytes), (tools_len(&set()), tools_len(&set())));
        // A schema that differs only deep inside is another set.
        let (c, c_bytes) = share(vec![spec("shared_specs_a", 1), spec("shared_specs_b", 3)]);
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(c[1], spec("shared_specs_b", 3));
        assert_eq!(c_bytes, tools_len(&c));
        // Order is part of what a run offers.
        let (d, _) = share(vec![spec("shared_specs_b", 2), spec("shared_specs_a", 1)]);
        assert!(!Arc::ptr_eq(&a, &d));
    }

    #[test]
    fn a_set_no_run_holds_is_freed_and_its_entry_dropped() {
        let (first, _) = share(vec![spec("shared_specs_gone", 7)]);
        let weak = Arc::downgrade(&first);
        drop(first);
        assert!(
            weak.upgrade().is_none(),
            "the table must not keep specs alive"
        );
        // Enough distinct sets to make the table prune at least once.
        for i in 0..(FIRST_PRUNE as u64 * 4) {
            drop(share(vec![spec("shared_specs_churn", i)]));
        }
        // Without pruning the table would hold every one of them.
        let table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(table.entries < FIRST_PRUNE, "{} entries", table.entries);
    }
}
