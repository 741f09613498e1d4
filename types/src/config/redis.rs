//! `[redis]` (how the queue reaches Redis: one server or a Redis Cluster, and how many
//! partitions each queue is split into) and `[limiter]` (what the fleet's rate limiter
//! does while Redis cannot be reached), each field with its default.

use serde::{Deserialize, Serialize};

use super::section::section;

/// Partitions of each queue on a Redis Cluster when `partitions` is not set.
pub const CLUSTER_PARTITIONS: u32 = 8;
/// The most partitions a queue may have (each is a blocking reader per worker).
pub const MAX_PARTITIONS: u32 = 256;

section! {
    /// `[redis]`: the queue's Redis deployment (`redis_url` says where).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct RedisSection {
        /// `redis_url` names the seed nodes of a Redis Cluster (one or more URLs,
        /// comma-separated), not one server.
        pub cluster: bool = false,
        /// How many partitions each queue is split into, a session's found from its id;
        /// each is one stream, read by its own blocking reader. Unset: 1 on one server
        /// (the layout of earlier releases), [`CLUSTER_PARTITIONS`] on a cluster. Every
        /// process of a deployment must agree.
        pub partitions: Option<u32> = None,
    }
}

impl RedisSection {
    /// The partitions each queue is split into.
    pub fn partitions(&self) -> u32 {
        self.partitions
            .unwrap_or(if self.cluster { CLUSTER_PARTITIONS } else { 1 })
    }
}

/// What the rate limiter does with a call under a configured rule (`[[limits]]`) while
/// Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnavailable {
    /// The call waits (the session retries after a short wait, as for a full window):
    /// a `concurrency = 1` rule never lets two calls run because Redis was down.
    #[default]
    Closed,
    /// The call goes, with a warning and the limiter's error metric: an outage never
    /// slows sessions, and the rules are not kept while it lasts.
    Open,
}

section! {
    /// `[limiter]`: the fleet's rate limiter itself (the rules are `[[limits]]`).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct LimiterSection {
        /// A call under a configured rule while Redis cannot be reached: `closed` waits,
        /// `open` goes. Calls on keys no rule names go either way (what the provider
        /// announced is only learned, and the provider still refuses what it must).
        pub on_unavailable: OnUnavailable = OnUnavailable::Closed,
    }
}
