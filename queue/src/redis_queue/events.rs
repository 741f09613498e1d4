//! Each session's event stream on Redis: [`EventStreams`] for [`RedisQueue`] (capped at
//! [`EVENTS_MAXLEN`], read live with blocking `XREAD`s on reader connections).

use std::time::Duration;

use async_trait::async_trait;

use crate::queue::{EventRecord, EventStreams, events_stream};
use agentq_error::{Error, Result};

use super::EVENTS_MAXLEN;
use super::connection::RedisQueue;
use super::reply::{event_record, parse_entries, stream_entries};

#[async_trait]
impl EventStreams for RedisQueue {
    async fn append_events(&self, events: &[EventRecord]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for e in events {
            pipe.cmd("XADD")
                .arg(events_stream(&e.session_id))
                .arg("MAXLEN")
                .arg("~")
                .arg(EVENTS_MAXLEN)
                .arg("*")
                .arg("seq")
                .arg(e.seq)
                .arg("epoch")
                .arg(e.epoch)
                .arg("data")
                .arg(&e.data)
                .ignore();
        }
        let _: () = pipe.query_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn read_events(
        &self,
        session_id: &str,
        after: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<EventRecord>> {
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count.max(1));
        let block = block.filter(|b| !b.is_zero());
        if let Some(b) = block {
            cmd.arg("BLOCK")
                .arg(u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
        }
        cmd.arg("STREAMS").arg(events_stream(session_id)).arg(after);
        let reply = match block {
            Some(b) => self.blocking_query(&cmd, b).await?,
            None => self.query(&cmd).await?,
        };
        Ok(stream_entries(reply)
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .filter_map(|e| event_record(session_id, e))
            .collect())
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
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(count.max(1));
        if let Some(b) = block {
            cmd.arg("BLOCK")
                .arg(u64::try_from(b.as_millis()).unwrap_or(u64::MAX));
        }
        cmd.arg("STREAMS");
        for (session_id, _) in from {
            cmd.arg(events_stream(session_id));
        }
        for (_, after) in from {
            cmd.arg(after);
        }
        let reply = match block {
            Some(b) => self.blocking_query(&cmd, b).await?,
            None => self.query(&cmd).await?,
        };
        let prefix = events_stream("");
        Ok(stream_entries(reply)
            .into_iter()
            .filter_map(|(stream, entries)| {
                let session_id = stream.strip_prefix(prefix.as_str())?.to_string();
                Some((session_id, entries))
            })
            .flat_map(|(session_id, entries)| {
                entries
                    .into_iter()
                    .filter_map(move |e| event_record(&session_id, e))
            })
            .collect())
    }

    async fn last_events(&self, session_id: &str, count: usize) -> Result<Vec<EventRecord>> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(events_stream(session_id))
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
        cmd.arg(events_stream(session_id))
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self.query(&cmd).await?;
        Ok(())
    }
}
