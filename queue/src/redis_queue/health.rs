//! What the scheduler and the probes ask Redis about a queue: [`QueueHealth`] for
//! [`RedisQueue`] (the marker that tells a Redis that lost its data, the group's stats,
//! a ping).

use std::collections::HashMap;

use async_trait::async_trait;
use redis::Value;

use crate::queue::{GROUP, QueueHealth, QueueStats, queue_stream};
use agentq_error::Result;

use super::connection::RedisQueue;
use super::reply::{value_items, value_pairs, value_string, value_u64};

#[async_trait]
impl QueueHealth for RedisQueue {
    async fn check_lost(&self, queue: &str) -> Result<bool> {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(marker_key(queue));
        let n: i64 = cmd.query_async(&mut self.conn()).await?;
        Ok(n == 0)
    }

    async fn mark_queue(&self, queue: &str) -> Result<()> {
        let mut cmd = redis::cmd("SET");
        cmd.arg(marker_key(queue)).arg("1");
        self.query(&cmd).await?;
        Ok(())
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let stream = queue_stream(queue);
        let mut info = redis::cmd("XINFO");
        info.arg("GROUPS").arg(&stream);
        let groups = match self.query(&info).await {
            Ok(v) => v,
            // No stream yet: empty, and no group whose lag could be known.
            Err(e) if e.to_string().contains("no such key") => {
                return Ok(QueueStats::default());
            }
            Err(e) => return Err(e.into()),
        };
        let mut stats = QueueStats::default();
        for group in value_items(groups) {
            let fields: HashMap<String, Value> = value_pairs(group)
                .into_iter()
                .filter_map(|(k, v)| Some((value_string(&k)?, v)))
                .collect();
            if fields.get("name").and_then(value_string).as_deref() != Some(GROUP) {
                continue;
            }
            stats.pending = fields.get("pending").and_then(value_u64).unwrap_or(0);
            stats.lag = fields.get("lag").and_then(value_u64);
        }
        let mut xlen = redis::cmd("XLEN");
        xlen.arg(&stream);
        stats.length = value_u64(&self.query(&xlen).await?).unwrap_or(0);
        Ok(stats)
    }

    async fn ping(&self) -> Result<()> {
        self.query(&redis::cmd("PING")).await?;
        Ok(())
    }
}

/// A key that exists while Redis still holds everything the scheduler enqueued: a Redis
/// that comes back empty has lost it, and the stream alone cannot tell (workers re-create
/// missing streams and groups on their own).
fn marker_key(queue: &str) -> String {
    format!("agentq:marker:{queue}")
}
