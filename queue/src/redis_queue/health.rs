//! What the scheduler and the probes ask Redis about a queue: [`QueueHealth`] for
//! [`RedisQueue`] (the marker that tells a Redis that lost its data, the group's stats,
//! a ping), over every partition of a queue.

use std::collections::HashMap;

use async_trait::async_trait;
use futures::future::try_join_all;
use redis::Value;

use crate::queue::{GROUP, QueueHealth, QueueStats};
use agentq_error::Result;

use super::connection::RedisQueue;
use super::reply::{value_items, value_pairs, value_string, value_u64};

impl RedisQueue {
    /// One partition's stream length, pending count and lag.
    async fn part_stats(&self, queue: &str, p: u32) -> Result<QueueStats> {
        let stream = self.layout.stream(queue, p);
        let mut exists = redis::cmd("EXISTS");
        exists.arg(&stream);
        // No stream yet: empty, and no group whose lag could be known (asked first, so
        // that Redis is not made to answer an error).
        if value_u64(&self.query(&exists).await?).unwrap_or(0) == 0 {
            return Ok(QueueStats::default());
        }
        let mut info = redis::cmd("XINFO");
        info.arg("GROUPS").arg(&stream);
        let groups = match self.query(&info).await {
            Ok(v) => v,
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
}

#[async_trait]
impl QueueHealth for RedisQueue {
    /// Lost when any partition's marker is gone.
    async fn check_lost(&self, queue: &str) -> Result<bool> {
        for p in self.layout.all() {
            let mut cmd = redis::cmd("EXISTS");
            cmd.arg(self.layout.marker(queue, p));
            let n: i64 = cmd.query_async(&mut self.conn()).await?;
            if n == 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn mark_queue(&self, queue: &str) -> Result<()> {
        for p in self.layout.all() {
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.layout.marker(queue, p)).arg("1");
            self.query(&cmd).await?;
        }
        Ok(())
    }

    /// The partitions' stats summed; the lag is known when every partition's is.
    async fn stats(&self, queue: &str) -> Result<QueueStats> {
        let parts = try_join_all(self.layout.all().map(|p| self.part_stats(queue, p))).await?;
        let mut total: Option<QueueStats> = None;
        // A partition without a stream adds nothing.
        for s in parts.iter().filter(|s| **s != QueueStats::default()) {
            let t = total.get_or_insert(QueueStats {
                lag: Some(0),
                ..QueueStats::default()
            });
            t.length = t.length.saturating_add(s.length);
            t.pending = t.pending.saturating_add(s.pending);
            t.lag = match (t.lag, s.lag) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
        }
        let total = total.unwrap_or_default();
        Ok(total)
    }

    async fn ping(&self) -> Result<()> {
        self.query(&redis::cmd("PING")).await?;
        Ok(())
    }
}
