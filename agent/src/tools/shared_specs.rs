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
//!
//! Before that, a registry's specs are looked up by the identity of its tools
//! ([`share_registry`]): a worker builds its tools once and every session's registry holds
//! the same tool objects, so a run start builds and hashes no schema at all when another
//! run offered the same tools.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use crate::admission::tools_len;
use crate::schema::ToolSpec;
use crate::tools::{Tool, ToolRegistry};

/// Entries the table holds before it first drops the dead ones.
const FIRST_PRUNE: usize = 64;

/// A set some run may still hold, with its [`tools_len`].
type Held = (Weak<[ToolSpec]>, usize);

/// The set some tools made. The weak references to the tools keep their allocations (not
/// the tools) alive, so the addresses that key the entry name no other tool meanwhile.
struct Made {
    tools: Vec<Weak<dyn Tool>>,
    specs: Weak<[ToolSpec]>,
    bytes: usize,
}

impl Made {
    fn alive(&self) -> bool {
        self.specs.strong_count() > 0 && self.tools.iter().all(|t| t.strong_count() > 0)
    }
}

#[derive(Default)]
struct Table {
    by_hash: HashMap<u64, Vec<Held>>,
    entries: usize,
    /// Drop dead entries once `entries` reaches this: twice what was alive at the last
    /// pruning, so pruning costs O(1) per share over time.
    prune_at: usize,
    /// By the addresses of the tools that made the set, in the registry's order.
    by_tools: HashMap<Vec<usize>, Made>,
    /// As `prune_at`, for `by_tools`.
    made_prune_at: usize,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        prune_at: FIRST_PRUNE,
        made_prune_at: FIRST_PRUNE,
        ..Table::default()
    })
});

/// The specs of `registry`'s tools as [`share`] gives them, built only when these very
/// tool objects have not made a set that some run still holds.
pub fn share_registry(registry: &ToolRegistry) -> (Arc<[ToolSpec]>, usize) {
    let key: Vec<usize> = registry
        .tools
        .values()
        .map(|t| Arc::as_ptr(t).cast::<()>() as usize)
        .collect();
    {
        let table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(made) = table.by_tools.get(&key)
            && let Some(specs) = made.specs.upgrade()
        {
            return (specs, made.bytes);
        }
    }
    // Built without the lock: a tool's spec is its own code.
    let (specs, bytes) = share(registry.specs());
    let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
    table.by_tools.insert(
        key,
        Made {
            tools: registry.tools.values().map(Arc::downgrade).collect(),
            specs: Arc::downgrade(&specs),
            bytes,
        },
    );
    if table.by_tools.len() >= table.made_prune_at {
        table.by_tools.retain(|_, made| made.alive());
        table.made_prune_at = next_prune(table.by_tools.len());
    }
    (specs, bytes)
}

/// `specs`, or an equal set of specs that another run holds already, and their
/// [`tools_len`].
fn share(specs: Vec<ToolSpec>) -> (Arc<[ToolSpec]>, usize) {
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
        self.prune_at = next_prune(self.entries);
    }
}

/// When a table with `alive` live entries after a pruning prunes next: at twice that, so
/// pruning costs O(1) per share over time.
fn next_prune(alive: usize) -> usize {
    alive.saturating_mul(2).max(FIRST_PRUNE)
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

    /// A tool that counts how often its schema is built.
    struct Counted {
        name: String,
        built: Arc<std::sync::atomic::AtomicUsize>,
    }

    #[async_trait::async_trait]
    impl Tool for Counted {
        fn name(&self) -> &str {
            &self.name
        }
        fn description(&self) -> &str {
            "counts"
        }
        fn parameters(&self) -> serde_json::Value {
            self.built
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            json!({"type": "object"})
        }
        async fn call(
            &self,
            _args: serde_json::Value,
            _ctx: &crate::tools::ToolContext,
        ) -> Result<crate::tools::ToolOutput, crate::tools::ToolError> {
            Ok(crate::tools::ToolOutput::ok("counted"))
        }
    }

    fn counted(name: &str) -> (Arc<dyn Tool>, Arc<std::sync::atomic::AtomicUsize>) {
        let built = Arc::default();
        let tool: Arc<dyn Tool> = Arc::new(Counted {
            name: name.into(),
            built: Arc::clone(&built),
        });
        (tool, built)
    }

    fn registry(tools: &[&Arc<dyn Tool>]) -> ToolRegistry {
        let mut r = ToolRegistry::new();
        for t in tools {
            r.register(Arc::clone(t));
        }
        r
    }

    #[test]
    fn the_same_tool_objects_build_their_specs_once_while_a_run_holds_them() {
        use std::sync::atomic::Ordering::Relaxed;
        let (a, a_built) = counted("shared_specs_reg_a");
        let (b, b_built) = counted("shared_specs_reg_b");
        let (first, first_bytes) = share_registry(&registry(&[&a, &b]));
        // Another session's registry, holding the same tool objects.
        let (second, second_bytes) = share_registry(&registry(&[&b, &a]));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(first_bytes, second_bytes);
        assert_eq!((a_built.load(Relaxed), b_built.load(Relaxed)), (1, 1));
        // Other objects that say the same are built once, then share by content.
        let (c, c_built) = counted("shared_specs_reg_a");
        let (third, _) = share_registry(&registry(&[&c, &b]));
        assert!(Arc::ptr_eq(&first, &third));
        assert_eq!((c_built.load(Relaxed), b_built.load(Relaxed)), (1, 2));
        // Once no run holds the set, the next run builds it again.
        drop((first, second, third));
        share_registry(&registry(&[&a, &b]));
        assert_eq!(a_built.load(Relaxed), 2);
    }

    #[test]
    fn entries_of_dropped_tools_are_pruned() {
        let mut held = Vec::new();
        for i in 0..FIRST_PRUNE * 4 {
            let (t, _) = counted(&format!("shared_specs_reg_churn_{i}"));
            // The specs outlive the tool (another run could hold the same content).
            held.push(share_registry(&registry(&[&t])).0);
        }
        let table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(
            table.by_tools.len() < FIRST_PRUNE * 2,
            "{} entries",
            table.by_tools.len()
        );
    }
}
