//! [`crate::Worker::run`]: start the writers and the background duties, read the queue
//! as fast as slots free up and start every delivery, and on shutdown drain — running
//! sessions stop at their next checkpoint and are handed back — then stop everything in
//! the order the sessions need it (checkpoints, then the background duties, then events).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::backoff::{Backoff, retry_forever};
use crate::error::{Error, Result};
use crate::inner::Inner;
use crate::{Drain, delivery, heartbeat, listener, reclaim, settlements};

/// How long a starting worker waits for its MCP servers' first answer (or failure).
const MCP_START_BOUND: Duration = Duration::from_secs(30);

pub(crate) async fn run(inner: Arc<Inner>, shutdown: CancellationToken) -> Result<Drain> {
    inner.store.check_schema().await?;
    for q in &inner.cfg.queues {
        retry_forever(&shutdown, || inner.queue.ensure_queue(q)).await;
    }
    let twice = || Error::Config("Worker::run called twice".into());
    let mut undeferred_rx = inner.runs.take_undeferred().ok_or_else(twice)?;
    let settle_rx = inner.settlements.take_receiver().ok_or_else(twice)?;
    info!(consumer = %inner.cfg.consumer, queues = ?inner.cfg.queues, concurrency = inner.cfg.concurrency, "worker started");
    inner.start_pipeline();
    // A session that starts before its servers have answered would not see their tools.
    tokio::select! {
        _ = inner.mcp().settled(MCP_START_BOUND) => {}
        _ = shutdown.cancelled() => {}
    }
    let tracker = TaskTracker::new();
    let bg_stop = CancellationToken::new();
    let undeferrer = {
        let (inner, tracker, stop) = (inner.clone(), tracker.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                let d = tokio::select! {
                    d = undeferred_rx.recv() => match d { Some(d) => d, None => return },
                    _ = stop.cancelled() => return,
                };
                delivery::start(&inner, &tracker, d).await;
            }
        })
    };
    let background = vec![
        undeferrer,
        tokio::spawn(heartbeat::heartbeat_loop(inner.clone(), bg_stop.clone())),
        tokio::spawn(listener::signal_listener(inner.clone(), bg_stop.clone())),
        tokio::spawn(settlements::retry_loop(
            settlements::Retrier {
                store: inner.store.clone(),
                metrics: inner.metrics,
            },
            settle_rx,
            bg_stop.clone(),
        )),
        tokio::spawn(reclaim::reclaim_loop(
            inner.clone(),
            tracker.clone(),
            shutdown.clone(),
        )),
    ];

    // Entries delivered to this consumer earlier and never acked (a read dropped
    // mid-flight): they would otherwise wait for the reclaimer.
    match inner
        .queue
        .read_own_pending(&inner.cfg.queues, &inner.cfg.consumer, 1000)
        .await
    {
        Ok(ds) => {
            for d in ds {
                delivery::start(&inner, &tracker, d).await;
            }
        }
        Err(e) => warn!(error = %e, "reading own pending entries failed"),
    }

    read_until(&inner, &tracker, &shutdown).await;

    info!("worker draining");
    inner.draining.cancel();
    tracker.close();
    let drain = match tokio::time::timeout(inner.cfg.drain_timeout, tracker.wait()).await {
        Ok(()) => Drain::Finished,
        Err(_) => Drain::TimedOut,
    };
    if drain == Drain::TimedOut {
        warn!("drain timeout: aborting the sessions still running");
        let actives: Vec<CancellationToken> = inner
            .runs
            .lock()
            .values()
            .map(|a| a.abort.clone())
            .collect();
        for a in actives {
            a.cancel();
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), tracker.wait()).await;
    }
    // Sessions are done with checkpoints (or abandoned): commits in flight finish.
    inner.pipeline.stop_commits(Duration::from_secs(10)).await;
    bg_stop.cancel();
    for b in background {
        let _ = tokio::time::timeout(Duration::from_secs(5), b).await;
    }
    retire(&inner).await;
    inner.pipeline.stop_events(Duration::from_secs(5)).await;
    inner.stop_mcp(Duration::from_secs(5)).await;
    info!("worker stopped");
    Ok(drain)
}

/// No more heartbeats: whatever is still ours (a run aborted at the drain timeout) is
/// taken over at once rather than when the liveness row would have expired.
async fn retire(inner: &Inner) {
    match tokio::time::timeout(
        Duration::from_secs(5),
        inner.store.retire_worker(&inner.cfg.consumer),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "cannot retire this worker's liveness row; it expires"),
        Err(_) => warn!("retiring this worker's liveness row timed out; it expires"),
    }
}

/// Read as many entries as there are free slots, start them, until `shutdown`.
async fn read_until(inner: &Arc<Inner>, tracker: &TaskTracker, shutdown: &CancellationToken) {
    let mut backoff = Backoff::new();
    loop {
        let free = tokio::select! {
            p = inner.slots.clone().acquire_many_owned(1) => match p {
                Ok(p) => { drop(p); inner.slots.available_permits().max(1) }
                Err(_) => return,
            },
            _ = shutdown.cancelled() => return,
        };
        let read = inner.queue.read(
            &inner.cfg.queues,
            &inner.cfg.consumer,
            free,
            inner.cfg.read_block,
        );
        let deliveries = tokio::select! {
            r = read => r,
            _ = shutdown.cancelled() => return,
        };
        match deliveries {
            Ok(ds) => {
                backoff.reset();
                for d in ds {
                    delivery::start(inner, tracker, d).await;
                }
            }
            Err(e) => {
                let wait = backoff.next();
                warn!(error = %e, ?wait, "reading the queue failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    }
}
