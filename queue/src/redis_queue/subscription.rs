//! Subscriptions: one pub/sub connection per subscription, re-subscribed with backoff when
//! it is lost (to the next node of a cluster's seeds, should its node be down), and
//! pinged so that a silently dead connection is noticed.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use redis::aio::{PubSubSink, PubSubStream};
use redis::{Client, RedisError, RedisResult, Value};
use tokio::time::Instant;

use agentq_error::Result;

use super::readers::{CONNECT_TIMEOUT, within};

/// Reconnect backoff of subscriptions.
const SUB_BACKOFF_MIN: Duration = Duration::from_millis(100);
const SUB_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a subscription checks its connection with a PING.
const SUB_PING_EVERY: Duration = Duration::from_secs(15);

/// Subscribe to `channel` now (the subscription is active when this returns) and yield
/// the payloads, reconnecting with backoff when the connection is lost.
pub(super) async fn subscribe(
    clients: Vec<Client>,
    channel: String,
) -> Result<BoxStream<'static, String>> {
    let mut conn = None;
    let mut next = 0;
    let mut failure = None;
    for (i, client) in clients.iter().enumerate() {
        match connect_subscription(client, &channel).await {
            Ok(c) => {
                conn = Some(c);
                next = i;
                break;
            }
            Err(e) => failure = Some(e),
        }
    }
    let Some(conn) = conn else {
        return Err(failure
            .unwrap_or_else(|| {
                RedisError::from((redis::ErrorKind::Client, "no Redis to subscribe to"))
            })
            .into());
    };
    let state = Subscription {
        clients,
        next,
        channel,
        conn: Some(conn),
        backoff: SUB_BACKOFF_MIN,
        next_ping: Instant::now() + SUB_PING_EVERY,
    };
    Ok(futures::stream::unfold(state, |mut sub| async move {
        let payload = sub.next().await;
        Some((payload, sub))
    })
    .boxed())
}

async fn connect_subscription(
    client: &Client,
    channel: &str,
) -> RedisResult<(PubSubSink, PubSubStream)> {
    let connect = async {
        let (mut sink, stream) = client.get_async_pubsub().await?.split();
        sink.subscribe(channel).await?;
        Ok::<_, RedisError>((sink, stream))
    };
    within(CONNECT_TIMEOUT, "subscribing timed out", connect).await
}

struct Subscription {
    clients: Vec<Client>,
    /// The client in use, or to try next.
    next: usize,
    channel: String,
    /// `None` while disconnected.
    conn: Option<(PubSubSink, PubSubStream)>,
    backoff: Duration,
    next_ping: Instant,
}

enum SubEvent {
    Message(String),
    Lost(&'static str),
    Pinged,
}

impl Subscription {
    /// The next payload; reconnects (forever, with backoff) when the connection is lost.
    async fn next(&mut self) -> String {
        loop {
            let Some((sink, stream)) = &mut self.conn else {
                tokio::time::sleep(self.backoff).await;
                // Never empty: `subscribe` connected through one of them.
                let Some(client) = self.clients.get(self.next % self.clients.len().max(1)) else {
                    continue;
                };
                match connect_subscription(client, &self.channel).await {
                    Ok(conn) => {
                        tracing::info!(channel = %self.channel, "redis subscription restored");
                        self.conn = Some(conn);
                        self.backoff = SUB_BACKOFF_MIN;
                        self.next_ping = Instant::now() + SUB_PING_EVERY;
                    }
                    Err(e) => {
                        tracing::debug!(channel = %self.channel, error = %e, "redis resubscribe failed");
                        self.next = self.next.wrapping_add(1);
                        self.backoff = (self.backoff * 2).min(SUB_BACKOFF_MAX);
                    }
                }
                continue;
            };
            let event = tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => match msg.get_payload::<String>() {
                        Ok(p) => SubEvent::Message(p),
                        Err(_) => continue,
                    },
                    None => SubEvent::Lost("connection closed"),
                },
                () = tokio::time::sleep_until(self.next_ping) => {
                    match tokio::time::timeout(CONNECT_TIMEOUT, sink.ping::<Value>()).await {
                        Ok(Ok(_)) => SubEvent::Pinged,
                        _ => SubEvent::Lost("ping failed"),
                    }
                }
            };
            match event {
                SubEvent::Message(p) => return p,
                SubEvent::Pinged => self.next_ping = Instant::now() + SUB_PING_EVERY,
                SubEvent::Lost(why) => {
                    tracing::warn!(channel = %self.channel, why, "redis subscription lost; reconnecting");
                    self.conn = None;
                }
            }
        }
    }
}
