//! The metric series one session run uses, kept by the run so that each use after the
//! first finds its series without the registry hashing its labels again: a run counts
//! every call, token kind, tool call and iteration under the same few label sets.

use std::sync::Mutex;

/// Label sets one run keeps at most per metric; past them a use goes to the registry, so
/// a model that names a new tool every call cannot grow the run's memory.
const MAX_KEPT: usize = 16;

/// One metric vector's series a run has used, found again by the values they were asked
/// for (a run's handful is searched faster than hashed).
pub(super) struct Series<M> {
    kept: Mutex<Vec<(Vec<String>, M)>>,
}

impl<M> Default for Series<M> {
    fn default() -> Self {
        Series {
            kept: Mutex::new(Vec::new()),
        }
    }
}

impl<M: Clone> Series<M> {
    /// `use_it` on the series `key` names, made by `make` the first time (`make` turns the
    /// key into the labels, which may read shared state: it runs once per key).
    pub(super) fn with<R>(
        &self,
        key: &[&str],
        make: impl FnOnce() -> M,
        use_it: impl FnOnce(&M) -> R,
    ) -> R {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, m)) = kept
            .iter()
            .find(|(k, _)| k.iter().map(String::as_str).eq(key.iter().copied()))
        {
            return use_it(m);
        }
        let m = make();
        let out = use_it(&m);
        if kept.len() < MAX_KEPT {
            kept.push((key.iter().map(|s| (*s).to_string()).collect(), m));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use prometheus::{IntCounterVec, Opts};

    /// A series found again is the registry's own (what it counts shows in the vector),
    /// the labels are worked out once per key, and keys past the bound still count.
    #[test]
    fn a_kept_series_counts_in_the_registry_and_the_bound_holds() {
        let vec = IntCounterVec::new(Opts::new("t", "t"), &["a"]).unwrap();
        let kept = Series::default();
        let mut made = 0;
        for _ in 0..3 {
            kept.with(
                &["x"],
                || {
                    made += 1;
                    vec.with_label_values(&["x"])
                },
                |c| c.inc(),
            );
        }
        assert_eq!(made, 1);
        assert_eq!(vec.with_label_values(&["x"]).get(), 3);
        for i in 0..(MAX_KEPT + 4) {
            let k = format!("k{i}");
            kept.with(&[&k], || vec.with_label_values(&[&k]), |c| c.inc());
            kept.with(&[&k], || vec.with_label_values(&[&k]), |c| c.inc());
            assert_eq!(vec.with_label_values(&[&k]).get(), 2, "{k}");
        }
        assert_eq!(kept.kept.lock().unwrap().len(), MAX_KEPT);
    }
}
