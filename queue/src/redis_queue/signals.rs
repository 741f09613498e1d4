//! News on Redis: [`Signals`] for [`RedisQueue`] (completions published on pub/sub and
//! recorded on the completion stream; worker signals on the cancel channel).

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use redis::Cmd;

use crate::queue::{CANCEL_CHANNEL, COMPLETIONS_STREAM, DONE_CHANNEL, Signals, done_channel};
use agentq_error::Result;
use agentq_types::model::Completion;
use agentq_types::protocol::WorkerSignal;

use super::HISTORY_MAXLEN;
use super::connection::{RedisQueue, Target};
use super::subscription::subscribe;

impl RedisQueue {
    /// Where subscriptions connect: the server, or each seed node of a cluster in turn
    /// (a `PUBLISH` on any node reaches the subscribers of all of them).
    fn subscribers(&self) -> Vec<redis::Client> {
        match &self.target {
            Target::Single(client) => vec![client.clone()],
            Target::Cluster { seeds, .. } => seeds.clone(),
        }
    }

    /// `PUBLISH`es, in one pipeline. On a cluster they go to the first seed node that
    /// answers: the node that subscriptions connect to first. A cluster passes a message on
    /// to its other nodes later, so a message published on another node could reach a
    /// subscription made after it was published; on the subscriptions' own node, it
    /// cannot.
    async fn publish(&self, commands: &[&Cmd]) -> Result<()> {
        let mut pipe = redis::pipe();
        for cmd in commands {
            pipe.add_command((*cmd).clone());
        }
        let Target::Cluster { addrs, .. } = &self.target else {
            pipe.exec_async(&mut self.conn()).await?;
            return Ok(());
        };
        let mut failure = None;
        for node in addrs {
            match self.readers.pipeline_on(node, &pipe, commands.len()).await {
                Ok(replies) => {
                    replies
                        .into_iter()
                        .collect::<redis::RedisResult<Vec<_>>>()?;
                    return Ok(());
                }
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl Signals for RedisQueue {
    async fn publish_completion(&self, completion: &Completion) -> Result<()> {
        let json = serde_json::to_string(completion)?;
        let mut per_session = redis::cmd("PUBLISH");
        per_session
            .arg(done_channel(&completion.session_id))
            .arg(&json);
        let mut all = redis::cmd("PUBLISH");
        all.arg(DONE_CHANNEL).arg(&json);
        let mut record = redis::cmd("XADD");
        record
            .arg(COMPLETIONS_STREAM)
            .arg("MAXLEN")
            .arg("~")
            .arg(HISTORY_MAXLEN)
            .arg("*")
            .arg("session_id")
            .arg(&completion.session_id)
            .arg("data")
            .arg(&json);
        if self.is_cluster() {
            // The record goes to its key's slot; the two PUBLISHes to the subscriptions'
            // node (a PUBLISH reaches the subscribers of every node).
            let publishes = [&per_session, &all];
            let (published, recorded) = tokio::join!(self.publish(&publishes), self.query(&record));
            published?;
            recorded?;
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.add_command(per_session)
            .ignore()
            .add_command(all)
            .ignore()
            .add_command(record)
            .ignore();
        pipe.exec_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn publish_signal(&self, signal: &WorkerSignal) -> Result<()> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(CANCEL_CHANNEL).arg(signal.encode());
        self.publish(&[&cmd]).await
    }

    async fn subscribe_signals(&self) -> Result<BoxStream<'static, WorkerSignal>> {
        let raw = subscribe(self.subscribers(), CANCEL_CHANNEL.to_string()).await?;
        Ok(raw.map(|msg| WorkerSignal::decode(&msg)).boxed())
    }

    async fn subscribe_completion(
        &self,
        session_id: &str,
    ) -> Result<BoxStream<'static, Completion>> {
        let raw = subscribe(self.subscribers(), done_channel(session_id)).await?;
        Ok(raw
            .filter_map(|payload| async move {
                match serde_json::from_str::<Completion>(&payload) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(error = %e, "ignoring malformed completion message");
                        None
                    }
                }
            })
            .boxed())
    }
}
