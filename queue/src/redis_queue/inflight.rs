//! What a cluster's blocking reads left running past the `read` that started them
//! brought, per consumer, until its next `read` (see `read.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;

use redis::Value;
use tokio::sync::Notify;

/// A queue partition: its queue's name and its number.
pub(super) type Part = (String, u32);

/// What reads left running past the `read` that started them bring, per consumer.
#[derive(Default)]
pub(crate) struct Inflight {
    consumers: Mutex<HashMap<String, Left>>,
    pub(super) arrived: Notify,
    /// Which partition a read of new entries looks at first (taken in turn).
    pub(super) turn: AtomicUsize,
}

#[derive(Default)]
struct Left {
    /// Replies not yet handed out.
    replies: Vec<(Part, Value)>,
    /// Partitions with a read still running.
    running: HashSet<Part>,
}

impl Inflight {
    pub(super) fn take(&self, consumer: &str) -> (Vec<(Part, Value)>, HashSet<Part>) {
        let mut all = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(left) = all.get_mut(consumer) else {
            return (Vec::new(), HashSet::new());
        };
        let replies = std::mem::take(&mut left.replies);
        let running = left.running.clone();
        if left.running.is_empty() {
            all.remove(consumer);
        }
        (replies, running)
    }

    pub(super) fn start(&self, consumer: &str, part: &Part) {
        let mut all = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(consumer.to_string())
            .or_default()
            .running
            .insert(part.clone());
    }

    pub(super) fn finish(&self, consumer: &str, part: Part, reply: Option<Value>) {
        {
            let mut all = self.consumers.lock().unwrap_or_else(|e| e.into_inner());
            let left = all.entry(consumer.to_string()).or_default();
            left.running.remove(&part);
            if let Some(v) = reply {
                left.replies.push((part, v));
            }
        }
        self.arrived.notify_waiters();
    }
}
