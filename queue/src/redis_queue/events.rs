//! Each session's event stream on Redis: [`EventStreams`] for [`RedisQueue`] (capped at
//! [`EVENTS_MAXLEN`], read live with blocking `XREAD`s on reader connections). On one
//! server a batch of appends is a few script calls ([`APPEND_SCRIPT`]). On a cluster a
//! session's stream lies in its event bucket's slot: appends go one pipeline of `XADD`s
//! per node (its commands over many buckets, which one script could not touch), and a
//! read over many sessions is one `XREAD` per bucket. When the sessions span more than
//! one bucket, a blocking read is repeated every [`CLUSTER_POLL`] instead (a blocking
//! read per bucket would hold a connection each, and a new entry in one bucket could not
//! end the others' waits).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::try_join_all;
use redis::Value;

use crate::queue::{EventRecord, EventStreams};
use agentq_error::{Error, Result};

use super::EVENTS_MAXLEN;
use super::connection::RedisQueue;
use super::reply::{event_record, parse_entries, stream_entries};

/// Sends of a batch of events on a cluster, the slot map read anew before each again.
const APPEND_ATTEMPTS: usize = 3;

/// The arguments of an event's `XADD`, and the bytes of all of them but its stream and
/// its data (the numbers at their longest).
const XADD_ARGS: usize = 13;
const XADD_FIXED_BYTES: usize = 4 + 6 + 1 + 20 + 1 + 3 + 20 + 5 + 20 + 4;

/// The script that appends a chunk of events on one server. Sent whole each time (the
/// server keeps it compiled, found by its digest), so a restarted server needs no reload.
const APPEND_SCRIPT: &str = include_str!("append_events.lua");
/// Events a script call appends at most, and the data it carries at most (past the first
/// event): a script holds the server while it runs.
const SCRIPT_EVENTS: usize = 64;
const SCRIPT_BYTES: usize = 256 * 1024;

/// How often a blocking read over many sessions looks again on a cluster.
pub const CLUSTER_POLL: Duration = Duration::from_millis(50);

impl RedisQueue {
    /// One `XREAD` over `from`'s streams (they must share a slot on a cluster).
    fn xread(
        &self,
        from: &[(String, String)],
        count: usize,
        block: Option<Duration>,
    ) -> redis::Cmd {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count.max(1));
        if let Some(b) = block {
            cmd.arg("BLOCK")
                .arg(u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
        }
        cmd.arg("STREAMS");
        for (session_id, _) in from {
            cmd.arg(self.layout.events(session_id));
        }
        for (_, after) in from {
            cmd.arg(after);
        }
        cmd
    }

    fn records(&self, from: &[(String, String)], reply: Value) -> Vec<EventRecord> {
        let by_stream: HashMap<String, &str> = from
            .iter()
            .map(|(s, _)| (self.layout.events(s), s.as_str()))
            .collect();
        stream_entries(reply)
            .into_iter()
            .filter_map(|(stream, entries)| Some((*by_stream.get(&stream)?, entries)))
            .flat_map(|(session_id, entries)| {
                entries
                    .into_iter()
                    .filter_map(move |e| event_record(session_id, e))
            })
            .collect()
    }

    /// On one server: the events in chunks of [`SCRIPT_EVENTS`] (or
    /// [`SCRIPT_BYTES`] of data), each one script call that appends them all, the chunks
    /// in one pipeline. An `XADD` per event answered each with its entry's id, and
    /// reading those answers was most of the worker's Redis work; a chunk is answered
    /// once. Chunked, a call holds the server (a script runs alone) a bounded time.
    async fn append_on_server(&self, events: &[EventRecord]) -> Result<()> {
        let mut pipe = redis::pipe();
        let mut rest = events;
        while !rest.is_empty() {
            let mut n = 0;
            let mut bytes = 0usize;
            for e in rest.iter().take(SCRIPT_EVENTS) {
                if n > 0 && bytes.saturating_add(e.data.len()) > SCRIPT_BYTES {
                    break;
                }
                bytes = bytes.saturating_add(e.data.len());
                n += 1;
            }
            let (chunk, after) = rest.split_at(n);
            pipe.add_command(self.append_script(chunk, bytes)).ignore();
            rest = after;
        }
        let _: () = pipe.query_async(&mut self.conn()).await?;
        Ok(())
    }

    /// The script call that appends `chunk` (`data_bytes` of data in all), sized up front.
    fn append_script(&self, chunk: &[EventRecord], data_bytes: usize) -> redis::Cmd {
        let keys: Vec<String> = chunk
            .iter()
            .map(|e| self.layout.events(&e.session_id))
            .collect();
        let bytes = keys
            .iter()
            .map(String::len)
            .fold(
                APPEND_SCRIPT.len().saturating_add(data_bytes),
                usize::saturating_add,
            )
            .saturating_add(chunk.len().saturating_mul(40));
        let mut cmd =
            redis::Cmd::with_capacity(chunk.len().saturating_mul(4).saturating_add(4), bytes);
        cmd.arg("EVAL").arg(APPEND_SCRIPT).arg(chunk.len());
        for key in keys {
            cmd.arg(key);
        }
        cmd.arg(EVENTS_MAXLEN);
        for e in chunk {
            cmd.arg(e.seq).arg(e.epoch).arg(&e.data);
        }
        cmd
    }

    /// On a cluster: one pipeline per node, however many buckets its events span (a batch
    /// of a worker's events spans most of them), at once; in order within each. Events a
    /// node refused (their slot moved since the slot map was read) go again, to the nodes
    /// a slot map read anew names, up to [`APPEND_ATTEMPTS`] times in all.
    async fn append_by_node(&self, events: &[EventRecord]) -> Result<()> {
        let mut left: Vec<&EventRecord> = events.iter().collect();
        let mut refusal = None;
        for _ in 0..APPEND_ATTEMPTS {
            if refusal.is_some() {
                self.readers.forget_slots();
            }
            let mut by_node: BTreeMap<String, Vec<&EventRecord>> = BTreeMap::new();
            for e in left {
                let node = self
                    .readers
                    .node_of(&self.layout.events(&e.session_id))
                    .await?;
                by_node.entry(node).or_default().push(e);
            }
            let sent = try_join_all(by_node.iter().map(|(node, group)| async move {
                let mut pipe = redis::pipe();
                for e in group {
                    self.xadd(&mut pipe, e);
                }
                let replies = self.readers.pipeline_on(node, &pipe, group.len()).await?;
                Ok::<_, Error>(group.iter().copied().zip(replies).collect::<Vec<_>>())
            }))
            .await?;
            left = Vec::new();
            for (e, reply) in sent.into_iter().flatten() {
                if let Err(why) = reply {
                    left.push(e);
                    refusal = Some(why);
                }
            }
            if left.is_empty() {
                return Ok(());
            }
        }
        match refusal {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// The command sized for its arguments up front: built argument by argument, its
    /// buffers grew several times per event, and every event of the worker passes here.
    fn xadd(&self, pipe: &mut redis::Pipeline, e: &EventRecord) {
        let key = self.layout.events(&e.session_id);
        let mut cmd = redis::Cmd::with_capacity(
            XADD_ARGS,
            XADD_FIXED_BYTES
                .saturating_add(key.len())
                .saturating_add(e.data.len()),
        );
        cmd.arg("XADD")
            .arg(key)
            .arg("MAXLEN")
            .arg("~")
            .arg(EVENTS_MAXLEN)
            .arg("*")
            .arg("seq")
            .arg(e.seq)
            .arg("epoch")
            .arg(e.epoch)
            .arg("data")
            .arg(&e.data);
        pipe.add_command(cmd);
    }

    /// `from` split by slot group (event bucket on a cluster, one group on a server).
    fn event_groups(&self, from: &[(String, String)]) -> Vec<Vec<(String, String)>> {
        let mut groups: BTreeMap<u32, Vec<(String, String)>> = BTreeMap::new();
        for one in from {
            groups
                .entry(self.layout.event_group(&one.0))
                .or_default()
                .push(one.clone());
        }
        groups.into_values().collect()
    }

    /// Sessions of several buckets read at once, one `XREAD` per bucket; polled while
    /// `block` lasts and nothing came.
    async fn read_each(
        &self,
        groups: &[Vec<(String, String)>],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let deadline = block.map(|b| tokio::time::Instant::now() + b);
        loop {
            let replies = try_join_all(groups.iter().map(|group| async move {
                let reply = self.query(&self.xread(group, count, None)).await?;
                Ok::<_, Error>(self.records(group, reply))
            }))
            .await?;
            let got: Vec<EventRecord> = replies.into_iter().flatten().collect();
            match deadline {
                Some(d) if got.is_empty() && tokio::time::Instant::now() < d => {
                    tokio::time::sleep_until(d.min(tokio::time::Instant::now() + CLUSTER_POLL))
                        .await;
                }
                _ => return Ok(got),
            }
        }
    }
}

#[async_trait]
impl EventStreams for RedisQueue {
    async fn append_events(&self, events: &[EventRecord]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        if self.layout.is_cluster() {
            return self.append_by_node(events).await;
        }
        self.append_on_server(events).await
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let block = block.filter(|b| !b.is_zero());
        let from = [(session_id.to_string(), after.to_string())];
        let cmd = self.xread(&from, count, block);
        let reply = match block {
            Some(b) => {
                self.blocking_query(&self.layout.events(session_id), &cmd, b)
                    .await?
            }
            None => self.query(&cmd).await?,
        };
        Ok(self.records(&from, reply))
    }

    async fn read_events_many(
        &self,
        from: &[(String, String)],
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let block = block.filter(|b| !b.is_zero());
        if from.is_empty() {
            if let Some(b) = block {
                tokio::time::sleep(b).await;
            }
            return Ok(Vec::new());
        }
        if let Some((_, after)) = from.iter().find(|(_, a)| a.as_str() == "$") {
            return Err(Error::invalid(
                "after",
                format!("{after:?}: read_events_many takes entry ids only"),
            ));
        }
        if self.layout.is_cluster() {
            let groups = self.event_groups(from);
            if groups.len() > 1 {
                return self.read_each(&groups, count, block).await;
            }
        }
        let cmd = self.xread(from, count, block);
        // One slot group: the first stream names the reader's node.
        let key = from
            .first()
            .map(|(s, _)| self.layout.events(s))
            .unwrap_or_default();
        let reply = match block {
            Some(b) => self.blocking_query(&key, &cmd, b).await?,
            None => self.query(&cmd).await?,
        };
        Ok(self.records(from, reply))
    }

    async fn last_events(&self, session_id: &str, count: usize) -> Result<Vec<EventRecord>> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(self.layout.events(session_id))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count.max(1));
        let reply = self.query(&cmd).await?;
        Ok(parse_entries(reply)
            .into_iter()
            .filter_map(|e| event_record(session_id, e))
            .collect())
    }

    async fn expire_events(&self, session_id: &str, ttl: Duration) -> Result<()> {
        let mut cmd = redis::cmd("PEXPIRE");
        cmd.arg(self.layout.events(session_id))
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self.query(&cmd).await?;
        Ok(())
    }
}
