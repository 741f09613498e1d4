//! Where a queue's entries live: [`Layout`] names the keys of each partition of a queue
//! and finds a session's partition, and carries the partition in the entry ids it hands
//! out, so that an ack names its stream without a lookup.
//!
//! One server with one partition keeps the layout of earlier releases
//! (`agentq:queue:<queue>`, `agentq:marker:<queue>`, the shared `agentq:dead`). Otherwise
//! every key of partition `p` carries the hash tag `{<queue>:<p>}`:
//! `agentq:queue:{<queue>:<p>}`, `agentq:marker:{<queue>:<p>}` and
//! `agentq:dead:{<queue>:<p>}`, so that a cluster keeps them in one slot and a dead letter
//! (its `XADD` and `XACK` in one `MULTI`) never spans two. With more than one partition an
//! entry id is `<p>/<stream id>`. On a cluster a session's event stream is tagged with its
//! event bucket (`agentq:events:{ev:<b>}<session>`, one of [`EVENT_BUCKETS`]), so that
//! appends and reads over many sessions are one command per bucket, not per session.

use std::collections::BTreeMap;

use crate::queue::{DEAD_STREAM, events_stream, queue_stream};

/// Event buckets of a cluster: slots that hold every session's event stream. Enough to
/// spread the streams over as many nodes; few enough that a read over every followed
/// session is a few commands.
pub const EVENT_BUCKETS: u32 = 64;

/// A stable hash of a session id (FNV-1a, the same in every process and release).
fn fnv(session_id: &str) -> u64 {
    agentq_types::shard::fnv1a(&[session_id.as_bytes()])
}

/// A queue partition: its queue's name and its number.
pub(super) type Part = (String, u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    cluster: bool,
    tagged: bool,
    partitions: u32,
}

impl Layout {
    pub(super) fn new(cluster: bool, partitions: u32) -> Layout {
        let partitions = partitions.max(1);
        Layout {
            cluster,
            tagged: cluster || partitions > 1,
            partitions,
        }
    }

    pub(super) fn all(&self) -> impl Iterator<Item = u32> + use<> {
        0..self.partitions
    }

    /// The partition of a session: a stable hash of its id modulo the partitions.
    pub(super) fn partition_of(&self, session_id: &str) -> u32 {
        u32::try_from(fnv(session_id) % u64::from(self.partitions)).unwrap_or(0)
    }

    /// The slot group of a session's event stream: its event bucket on a cluster, the
    /// same for every session on one server (where any keys go together).
    pub(super) fn event_group(&self, session_id: &str) -> u32 {
        if self.cluster {
            u32::try_from(fnv(session_id) % u64::from(EVENT_BUCKETS)).unwrap_or(0)
        } else {
            0
        }
    }

    fn tag(&self, queue: &str, p: u32) -> Option<String> {
        self.tagged.then(|| format!("{{{queue}:{p}}}"))
    }

    pub(super) fn stream(&self, queue: &str, p: u32) -> String {
        match self.tag(queue, p) {
            Some(tag) => queue_stream(&tag),
            None => queue_stream(queue),
        }
    }

    pub(super) fn marker(&self, queue: &str, p: u32) -> String {
        format!(
            "agentq:marker:{}",
            self.tag(queue, p).as_deref().unwrap_or(queue)
        )
    }

    pub(super) fn dead(&self, queue: &str, p: u32) -> String {
        match self.tag(queue, p) {
            Some(tag) => format!("{DEAD_STREAM}:{tag}"),
            None => DEAD_STREAM.to_string(),
        }
    }

    /// A session's event stream: `agentq:events:{ev:<bucket>}<session>` on a cluster (the
    /// bucket's slot whatever the id holds), the earlier `agentq:events:<session>` on one
    /// server.
    pub(super) fn events(&self, session_id: &str) -> String {
        if self.cluster {
            let bucket = self.event_group(session_id);
            events_stream(&format!("{{ev:{bucket}}}{session_id}"))
        } else {
            events_stream(session_id)
        }
    }

    pub(super) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The id handed out for stream entry `id` of partition `p`.
    pub(super) fn entry_id(&self, p: u32, id: String) -> String {
        if self.partitions > 1 {
            format!("{p}/{id}")
        } else {
            id
        }
    }

    /// The partition and stream id of a handed-out id; `None` for an id this layout did
    /// not hand out.
    pub(super) fn split_id<'a>(&self, id: &'a str) -> Option<(u32, &'a str)> {
        if self.partitions == 1 {
            return Some((0, id));
        }
        let (p, rest) = id.split_once('/')?;
        let p: u32 = p.parse().ok()?;
        (p < self.partitions).then_some((p, rest))
    }

    /// Handed-out ids grouped by partition (ids of no partition dropped, with a warning).
    pub(super) fn by_partition(&self, ids: &[String]) -> BTreeMap<u32, Vec<String>> {
        let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for id in ids {
            match self.split_id(id) {
                Some((p, raw)) => out.entry(p).or_default().push(raw.to_string()),
                None => tracing::warn!(%id, "not an entry id of this queue's layout; ignored"),
            }
        }
        out
    }
}
