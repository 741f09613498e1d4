//! Reads on a Redis Cluster: a cluster refuses a command over keys of two slots, so each
//! queue partition is read by a blocking reader of its own.
//!
//! A `read` first takes what earlier reads of the consumer left (below), then reads
//! without blocking: for new entries one partition first, taken in turn, and the others
//! at once only if it did not fill the read (so a read of a busy queue is one command).
//! Only when all are empty does it block on every partition at once, each on its own
//! reader connection. The first partition to answer
//! with entries ends the read; the others are not dropped (a read dropped after Redis
//! served it would strand its entries in the consumer's pending list) but left running
//! to their end, and what they bring is kept for the consumer's next `read`
//! (`inflight.rs`); a partition still being read is not read again meanwhile. When the
//! block ends with nothing, the read waits a moment ([`END_GRACE`]) for its partitions'
//! reads, which began a little after it, so that none is normally left running. A `read`
//! itself dropped mid-flight drops its readers, as on one server: Redis stops serving a
//! read whose connection closed, and what it had served stays pending for the consumer.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{BoxFuture, join_all};
use futures::stream::FuturesUnordered;
use redis::{RedisResult, Value};

use crate::queue::Delivery;
use agentq_error::Result;

use super::connection::RedisQueue;
use super::inflight::Part;
use super::work::has_code;

type Read = BoxFuture<'static, (Part, RedisResult<Value>)>;

/// How long a read waits past its deadline for its partitions' reads to end. Each blocks
/// on its node as long as the read does here but began a little later, so they end a
/// moment after it; a read left running past its call would take entries enqueued after
/// the call returned and hold them until the consumer's next read, so the read waits that
/// moment rather than leave them running. Only a slow node's read is left running.
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
        let (left, running) = self.inflight.take(consumer);
        let mut out = self.deliveries_of(left).await;
        if id == ">" && !out.is_empty() {
            return Ok(out);
        }
        // A partition still being read is not read again for new entries meanwhile; its
        // pending ones (`0`) may be.
        let idle: Vec<Part> = parts
            .into_iter()
            .filter(|p| id != ">" || !running.contains(p))
            .collect();
        // Every partition without blocking first (and only that for `0` or a zero block).
        // For new entries, one partition of each queue first, taken in turn, and a queue's
        // others only when it did not fill the read (`count` is per queue): on a busy queue
        // a read is one command, not one per partition, and every partition still comes
        // first in its turn.
        if id == ">" {
            let turn = self.inflight.turn.fetch_add(1, Ordering::Relaxed);
            let mut firsts = Vec::new();
            let mut rests = Vec::new();
            for queue in queues {
                let mut own: Vec<Part> = idle.iter().filter(|p| p.0 == *queue).cloned().collect();
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
            let all: Vec<(Part, usize)> = idle.iter().map(|p| (p.clone(), count)).collect();
            self.read_now(&all, consumer, id, &mut out).await?;
        }
        // What a read left running brought is pending too: a `0` read sees it twice.
        let mut seen = HashSet::new();
        out.retain(|d| seen.insert((d.queue.clone(), d.entry_id.clone())));
        let block = block.filter(|b| !b.is_zero() && id == ">");
        match block {
            Some(block) if out.is_empty() => self.block_cluster(idle, consumer, count, block).await,
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
        let mut pending: HashSet<Part> = HashSet::new();
        for part in parts {
            // Connected before the deadline starts, so that no read begins late.
            let key = self.layout.stream(&part.0, part.1);
            let reader = self.readers.checkout_for(&key).await?;
            let cmd = self.xreadgroup(
                std::slice::from_ref(&part),
                consumer,
                count,
                Some(block),
                ">",
            );
            let readers = self.readers.clone();
            pending.insert(part.clone());
            reads.push(Box::pin(async move {
                let reply = readers.blocking_on(reader, &key, &cmd, block).await;
                (part, reply)
            }));
        }
        let deadline = tokio::time::Instant::now() + block;
        // Past the deadline, the reads still running get END_GRACE to end (see there).
        let mut until = deadline;
        let mut failure = None;
        loop {
            if until > deadline && reads.is_empty() {
                break;
            }
            let arrived = self.inflight.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            // What reads left running by an earlier call brought meanwhile.
            let (left, _) = self.inflight.take(consumer);
            let got = self.deliveries_of(left).await;
            if !got.is_empty() {
                self.leave_running(reads, pending, consumer);
                return Ok(got);
            }
            tokio::select! {
                Some((part, reply)) = reads.next(), if !reads.is_empty() => {
                    pending.remove(&part);
                    match reply {
                        Ok(v) => {
                            let got = self.deliveries(std::slice::from_ref(&part), v).await;
                            if !got.is_empty() {
                                self.leave_running(reads, pending, consumer);
                                return Ok(got);
                            }
                        }
                        Err(e) if has_code(&e, "NOGROUP") => self.heal(&part).await?,
                        Err(e) => failure = Some(e),
                    }
                }
                () = &mut arrived => {}
                () = tokio::time::sleep_until(until) => {
                    if until > deadline || reads.is_empty() {
                        break;
                    }
                    until = deadline + END_GRACE;
                }
            }
        }
        // Replies at the deadline itself are not lost either.
        self.leave_running(reads, pending, consumer);
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(Vec::new()),
        }
    }

    /// Let the reads still running finish on their own; what they bring waits for the
    /// consumer's next read.
    fn leave_running(
        &self,
        mut reads: FuturesUnordered<Read>,
        pending: HashSet<Part>,
        consumer: &str,
    ) {
        if reads.is_empty() {
            return;
        }
        for part in &pending {
            self.inflight.start(consumer, part);
        }
        let inflight = self.inflight.clone();
        let consumer = consumer.to_string();
        tokio::spawn(async move {
            while let Some((part, reply)) = reads.next().await {
                match reply {
                    Ok(v) => inflight.finish(&consumer, part, Some(v)),
                    Err(e) => {
                        tracing::debug!(error = %e, queue = %part.0, "a partition's read left running failed");
                        inflight.finish(&consumer, part, None);
                    }
                }
            }
        });
    }

    async fn deliveries_of(&self, replies: Vec<(Part, Value)>) -> Vec<Delivery> {
        let mut out = Vec::new();
        for (part, v) in replies {
            out.extend(self.deliveries(std::slice::from_ref(&part), v).await);
        }
        out
    }

    async fn heal(&self, part: &Part) -> Result<()> {
        tracing::warn!(queue = %part.0, partition = part.1, "consumer group missing (redis restarted?); re-creating");
        use crate::WorkQueue;
        self.ensure_queue(&part.0).await
    }
}
