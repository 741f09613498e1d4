//! `RedisQueue` on a private 3-master Redis Cluster, beyond the contract suite (which runs
//! there too, one partition per queue): queues split into partitions, each read by its
//! own blocking reader; no command a node refuses (`INFO commandstats`); a master killed
//! and restarted, and slots moved, while sessions flow.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use agentq_queue::queue::{Delivery, Queue};
use agentq_queue::redis_queue::RedisQueue;
use agentq_queue::{EventStreams, QueueHealth, Signals, WorkQueue};
use agentq_testkit::services::RedisCluster;
use agentq_types::config::RedisSection;
use agentq_types::model::EnqueueReason;

use crate::common::{Q, completion, queues, sessions};

/// A queue on `cluster` with `partitions` partitions per queue.
pub async fn connect(cluster: &RedisCluster, partitions: u32) -> RedisQueue {
    let settings = RedisSection {
        cluster: true,
        partitions: Some(partitions),
    };
    RedisQueue::connect_with(&cluster.url(), &settings)
        .await
        .expect("connect to the cluster")
}
