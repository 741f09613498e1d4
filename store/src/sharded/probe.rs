//! What a test reads to check the routing: for each call about one session or tree, the
//! shard it was routed to and every shard it touched meanwhile. Off unless a probe is
//! given ([`super::ShardedStore::with_probe`]); the production path never enters it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;

tokio::task_local! {
    static TOUCHED: RefCell<BTreeSet<usize>>;
}

/// One call about one session: its method, the shard routed to, the shards touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    pub call: &'static str,
    pub shard: usize,
    pub touched: BTreeSet<usize>,
}

/// The record of calls about one session.
#[derive(Debug, Default)]
pub struct Probe {
    calls: Mutex<Vec<Routed>>,
}

impl Probe {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every call recorded so far.
    pub fn calls(&self) -> Vec<Routed> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The calls that touched another shard than theirs, or more than one.
    pub fn strays(&self) -> Vec<Routed> {
        self.calls()
            .into_iter()
            .filter(|c| c.touched != BTreeSet::from([c.shard]))
            .collect()
    }
}

/// Note that the call in scope (if any) touched shard `i`.
pub(super) fn touch(i: usize) {
    let _ = TOUCHED.try_with(|t| t.borrow_mut().insert(i));
}

/// Run `fut` as the call `call` routed to `shard`, and record what it touched.
pub(crate) async fn scoped<F: Future>(
    probe: &Probe,
    call: &'static str,
    shard: usize,
    fut: F,
) -> F::Output {
    let (out, touched) = TOUCHED
        .scope(RefCell::new(BTreeSet::new()), async {
            let out = fut.await;
            (out, TOUCHED.with(|t| t.borrow().clone()))
        })
        .await;
    if let Ok(mut calls) = probe.calls.lock() {
        calls.push(Routed {
            call,
            shard,
            touched,
        });
    }
    out
}
