//! News on Redis: [`Signals`] for [`RedisQueue`] (completions published on pub/sub and
//! recorded on the completion stream; worker signals on the cancel channel).

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::queue::{CANCEL_CHANNEL, COMPLETIONS_STREAM, DONE_CHANNEL, Signals, done_channel};
use agentq_error::Result;
use agentq_types::model::Completion;
use agentq_types::protocol::WorkerSignal;

use super::HISTORY_MAXLEN;
use super::connection::RedisQueue;
use super::subscription::subscribe;

#[async_trait]
impl Signals for RedisQueue {
    async fn publish_completion(&self, completion: &Completion) -> Result<()> {
        let json = serde_json::to_string(completion)?;
        let mut pipe = redis::pipe();
        pipe.cmd("PUBLISH")
            .arg(done_channel(&completion.session_id))
            .arg(&json)
            .ignore()
            .cmd("PUBLISH")
            .arg(DONE_CHANNEL)
            .arg(&json)
            .ignore()
            .cmd("XADD")
            .arg(COMPLETIONS_STREAM)
            .arg("MAXLEN")
            .arg("~")
            .arg(HISTORY_MAXLEN)
            .arg("*")
            .arg("session_id")
            .arg(&completion.session_id)
            .arg("data")
            .arg(&json)
            .ignore();
        pipe.exec_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn publish_signal(&self, signal: &WorkerSignal) -> Result<()> {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(CANCEL_CHANNEL).arg(signal.encode());
        self.query(&cmd).await?;
        Ok(())
    }

    async fn subscribe_signals(&self) -> Result<BoxStream<'static, WorkerSignal>> {
        let raw = subscribe(self.client.clone(), CANCEL_CHANNEL.to_string()).await?;
        Ok(raw.map(|msg| WorkerSignal::decode(&msg)).boxed())
    }

    async fn subscribe_completion(
        &self,
        session_id: &str,
    ) -> Result<BoxStream<'static, Completion>> {
        let raw = subscribe(self.client.clone(), done_channel(session_id)).await?;
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
