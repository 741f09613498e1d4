//! `submit --wait`: the completions of the sessions just submitted, from `agentq:done`
//! when Redis is reachable, by polling the API otherwise (and now and then as well, since
//! pub/sub drops messages while a connection is down).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;

use agentq_api::{SessionDetail, SessionView};
use agentq_core::config::Settings;
use agentq_core::queue::DONE_CHANNEL;
use agentq_core::{Completion, CompletionUsage};

use super::api::Api;

const POLL_EVERY: Duration = Duration::from_millis(500);
/// With pub/sub: how often to check by polling too (missed messages).
const SAFETY_POLL_EVERY: Duration = Duration::from_secs(10);
/// Above this many pending sessions the safety poll is skipped (it would be a GET each).
const SAFETY_POLL_MAX: usize = 200;

pub(super) type DoneStream = futures::stream::BoxStream<'static, Completion>;

/// All completions (`agentq:done`), when a Redis URL is configured and reachable.
pub(super) async fn subscribe_done() -> Option<DoneStream> {
    let url = match Settings::load_only(None, |k| std::env::var(k).ok(), &["redis_url"]) {
        Ok(c) => c.redis_url?,
        Err(e) => {
            tracing::warn!(error = %e, "cannot load the configuration; polling the API");
            return None;
        }
    };
    let sub = async {
        let client = redis::Client::open(url.as_str())?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(DONE_CHANNEL).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(Duration::from_secs(5), sub).await {
        Ok(Ok(pubsub)) => Some(
            pubsub
                .into_on_message()
                .filter_map(|msg| async move {
                    let payload: String = msg.get_payload().ok()?;
                    serde_json::from_str::<Completion>(&payload).ok()
                })
                .boxed(),
        ),
        Ok(Err(e)) => {
            eprintln!("agentq: cannot subscribe to completions ({e}); polling the API instead");
            None
        }
        Err(_) => {
            eprintln!("agentq: subscribing to completions timed out; polling the API instead");
            None
        }
    }
}

/// Wait until every id has finished (or `timeout`): from pub/sub when subscribed, by
/// polling otherwise (and, with few sessions, now and then as well).
pub(super) async fn wait_for(
    api: &Api,
    ids: &[String],
    mut done: Option<&mut DoneStream>,
    timeout: Option<Duration>,
) -> anyhow::Result<HashMap<String, Completion>> {
    let mut pending: HashSet<String> = ids.iter().cloned().collect();
    let mut results = HashMap::new();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let poll_every = if done.is_some() {
        SAFETY_POLL_EVERY
    } else {
        POLL_EVERY
    };
    // The first poll right away: a session may have finished before we subscribed (an
    // idempotent repeat of an old one).
    let mut next_poll = tokio::time::Instant::now();
    while !pending.is_empty() {
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            break;
        }
        let wake = deadline.map_or(next_poll, |d| d.min(next_poll));
        let msg = match done.as_deref_mut() {
            Some(stream) => tokio::select! {
                m = stream.next() => m,
                () = tokio::time::sleep_until(wake) => None,
            },
            None => {
                tokio::time::sleep_until(wake).await;
                None
            }
        };
        if let Some(c) = msg {
            if pending.remove(&c.session_id) {
                results.insert(c.session_id.clone(), c);
            }
            continue;
        }
        if tokio::time::Instant::now() < next_poll {
            continue;
        }
        next_poll = tokio::time::Instant::now() + poll_every;
        if done.is_some() && pending.len() > SAFETY_POLL_MAX {
            continue;
        }
        let batch: Vec<String> = pending.iter().cloned().collect();
        for id in batch {
            let view: SessionDetail = api.get(&format!("/v1/sessions/{id}")).await?;
            if let Some(c) = completion_from_view(&view.session) {
                pending.remove(&id);
                results.insert(id, c);
            }
        }
    }
    Ok(results)
}

/// A `Completion` from `GET /v1/sessions/{id}` once the session is terminal.
pub(super) fn completion_from_view(v: &SessionView) -> Option<Completion> {
    if !v.status.is_terminal() {
        return None;
    }
    Some(Completion {
        session_id: v.id.clone(),
        status: v.status,
        finish_reason: v.finish_reason,
        result: v.result.clone(),
        error: v.error.clone(),
        iterations: v.iterations,
        usage: CompletionUsage {
            input_tokens: v.usage.input_tokens,
            output_tokens: v.usage.output_tokens,
        },
        parent_id: v.parent_id.clone(),
    })
}
