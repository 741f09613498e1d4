//! Reads on a Redis Cluster: a cluster refuses a command over keys of two slots, so each
//! queue partition is read by a blocking reader of its own.
//!
//! A `read` reads without blocking first: for new entries one partition first, taken in
//! turn, and the others at once only if it did not fill the read (so a read of a busy
//! queue is one command). Only when all are empty does it block on every partition at
//! once, each on its own reader connection. The first partition to answer with entries
//! ends the read, and so does the block's end (the partitions' reads, which began a
//! little after it, get a moment to end by themselves); the reads still blocked are then
//! ended in Redis (`CLIENT UNBLOCK`) and their answers taken before the read returns: one
//! the server served meanwhile answers with its entries, which the read returns too. No read
//! outlives the call that started it, so a consumer that stops reading (a worker
//! draining) holds nothing taken after its last read; a read left blocked would take the
//! next entries of its partition into a pending list that only the reclaimer empties. A
//! `read` itself dropped mid-flight drops its readers, as on one server: a connection
//! closed ends its read in Redis, and what the server had served stays pending for the
//! consumer.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{BoxFuture, join_all};
use futures::stream::FuturesUnordered;
use redis::{RedisResult, Value};

use crate::queue::Delivery;
use agentq_error::Result;

use super::connection::RedisQueue;
use super::layout::Part;
use super::work::has_code;

type Read = BoxFuture<'static, (Part, RedisResult<Value>)>;

/// How long a read waits past its deadline for its partitions' reads to end by
/// themselves (each began a little after it), and then for the answers of those it had
/// to end. A node slower than that has its reads dropped: their connections close, which
/// ends them in Redis too.
const END_GRACE: Duration = Duration::from_millis(500);

impl RedisQueue {
    pub(super) async fn read_cluster(
        &self,
        queues: &[String],
        consumer: &str,
        count: usize,
        block: Option<Duration>,
        id: &str,
    ) -> Result<Vec<Delivery>> {
        let parts: Vec<Part> = queues
            .iter()
            .flat_map(|q| self.layout.all().map(move |p| (q.clone(), p)))
            .collect();
        let mut out = Vec::new();
        // Every partition without blocking first (and only that for `0` or a zero block).
        // For new entries, one partition of each queue first, taken in turn, and a queue's
        // others only when it did not fill the read (`count` is per queue): on a busy queue
        // a read is one command, not one per partition, and every partition still comes
        // first in its turn.
        if id == ">" {
            let turn = self.turn.fetch_add(1, Ordering::Relaxed);
            let mut firsts = Vec::new();
            let mut rests = Vec::new();
            for queue in queues {
                let mut own: Vec<Part> = parts.iter().filter(|p| p.0 == *queue).cloned().collect();
                let n = own.len();
                if n == 0 {
                    continue;
                }
                own.rotate_left(turn % n);
                let rest = own.split_off(1);
                firsts.extend(own.into_iter().map(|p| (p, count)));
                rests.push(rest);
            }
            self.read_now(&firsts, consumer, id, &mut out).await?;
            let mut more = Vec::new();
            for rest in rests {
                let Some((queue, _)) = rest.first() else {
                    continue;
                };
                let got = out.iter().filter(|d| d.queue == *queue).count();
                if got < count {
                    more.extend(rest.into_iter().map(|p| (p, count - got)));
                }
            }
            self.read_now(&more, consumer, id, &mut out).await?;
        } else {
            let all: Vec<(Part, usize)> = parts.iter().map(|p| (p.clone(), count)).collect();
            self.read_now(&all, consumer, id, &mut out).await?;
        }
        let block = block.filter(|b| !b.is_zero() && id == ">");
        match block {
            Some(block) if out.is_empty() => {
                self.block_cluster(parts, consumer, count, block).await
            }
            _ => Ok(out),
        }
    }

    /// `parts` read at once without blocking, each up to its count of entries; what they
    /// hold goes to `out`.
    async fn read_now(
        &self,
        parts: &[(Part, usize)],
        consumer: &str,
        id: &str,
        out: &mut Vec<Delivery>,
    ) -> Result<()> {
        let now = join_all(parts.iter().map(|(part, count)| async move {
            let cmd = self.xreadgroup(std::slice::from_ref(part), consumer, *count, None, id);
            (part.clone(), self.query(&cmd).await)
        }))
        .await;
        for (part, reply) in now {
            match reply {
                Ok(v) => out.extend(self.deliveries(std::slice::from_ref(&part), v).await),
                Err(e) if has_code(&e, "NOGROUP") => self.heal(&part).await?,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Block on every partition in `parts` at once; see the module docs.
    async fn block_cluster(
        &self,
        parts: Vec<Part>,
        consumer: &str,
        count: usize,
        block: Duration,
    ) -> Result<Vec<Delivery>> {
        let mut reads: FuturesUnordered<Read> = FuturesUnordered::new();
        // The node and connection of each read still blocked, to end it.
        let mut blocked: HashMap<Part, Option<(String, i64)>> = HashMap::new();
        for part in parts {
            // Connected before the deadline starts, so that no read begins late.
            let key = self.layout.stream(&part.0, part.1);
            let reader = self.readers.checkout_for(&key).await?;
            blocked.insert(part.clone(), reader.0.blocked_as());
            let cmd = self.xreadgroup(
                std::slice::from_ref(&part),
                consumer,
                count,
                Some(block),
                ">",
            );
            let readers = self.readers.clone();
            reads.push(Box::pin(async move {
                let reply = readers.blocking_on(reader, &key, &cmd, block).await;
                (part, reply)
            }));
        }
        // Past the deadline the reads still blocked get END_GRACE to end by themselves:
        // each began a little after it, and ending them costs a command per node.
        let deadline = tokio::time::Instant::now() + block;
        let mut until = deadline;
        let mut out = Vec::new();
        let mut failure = None;
        while out.is_empty() && !reads.is_empty() {
            tokio::select! {
                Some((part, reply)) = reads.next() => {
                    blocked.remove(&part);
                    self.take_reply(part, reply, &mut out, &mut failure).await?;
                }
                () = tokio::time::sleep_until(until) => {
                    if until > deadline {
                        break;
                    }
                    until = deadline + END_GRACE;
                }
            }
        }
        if !reads.is_empty() {
            self.end_reads(&blocked).await;
            let rest = async {
                while let Some((part, reply)) = reads.next().await {
                    self.take_reply(part, reply, &mut out, &mut failure).await?;
                }
                Ok::<(), agentq_error::Error>(())
            };
            match tokio::time::timeout(END_GRACE, rest).await {
                Ok(done) => done?,
                Err(_) => tracing::debug!(
                    reads = reads.len(),
                    "blocking reads did not end when asked; their connections are dropped"
                ),
            }
        }
        match failure {
            Some(e) if out.is_empty() => Err(e.into()),
            _ => Ok(out),
        }
    }

    /// A partition's answer: its entries to `out`, a missing group re-created, any other
    /// failure kept in `failure` (it fails the read only if nothing was read).
    async fn take_reply(
        &self,
        part: Part,
        reply: RedisResult<Value>,
        out: &mut Vec<Delivery>,
        failure: &mut Option<redis::RedisError>,
    ) -> Result<()> {
        match reply {
            Ok(v) => out.extend(self.deliveries(std::slice::from_ref(&part), v).await),
            Err(e) if has_code(&e, "NOGROUP") => self.heal(&part).await?,
            Err(e) => *failure = Some(e),
        }
        Ok(())
    }

    /// Ask each node to end the reads still blocked on it. A read not ended (a node that
    /// failed to answer) ends at its block, or when its connection is dropped.
    async fn end_reads(&self, blocked: &HashMap<Part, Option<(String, i64)>>) {
        let mut by_node: HashMap<&str, Vec<i64>> = HashMap::new();
        for (node, id) in blocked.values().flatten() {
            by_node.entry(node.as_str()).or_default().push(*id);
        }
        let asked = join_all(
            by_node
                .iter()
                .map(|(node, ids)| async move { (*node, self.readers.unblock(node, ids).await) }),
        )
        .await;
        for (node, result) in asked {
            if let Err(e) = result {
                tracing::debug!(error = %e, node, "cannot end blocking reads on a node");
            }
        }
    }

    async fn heal(&self, part: &Part) -> Result<()> {
        tracing::warn!(queue = %part.0, partition = part.1, "consumer group missing (redis restarted?); re-creating");
        use crate::WorkQueue;
        self.ensure_queue(&part.0).await
    }
}
