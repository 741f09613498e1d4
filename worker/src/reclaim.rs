//! The reclaimer: every `reclaim_interval`, put back on their queue the running sessions
//! of workers that stopped heartbeating (the store's liveness rows say which), and take
//! over queue entries another consumer has left idle for `reclaim_min_idle` (delivered to
//! a worker that died before it claimed them) and start them here.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info};

use agentq_core::PROCESS_TARGET;

use crate::delivery;
use crate::inner::Inner;

pub(crate) async fn reclaim_loop(
    inner: Arc<Inner>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(inner.cfg.reclaim_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match agentq_core::lifecycle::requeue_orphans(
            inner.store.as_ref(),
            inner.queue.as_ref(),
            &inner.cfg.queues,
        )
        .await
        {
            Ok(requeued) => {
                for (session_id, queue) in requeued {
                    // Seen by default: a takeover is the trace of a crash elsewhere.
                    info!(
                        target: PROCESS_TARGET,
                        %session_id,
                        %queue,
                        "taking over a session a dead worker left (its liveness row expired)"
                    );
                    inner.metrics.sessions_reclaimed.inc();
                }
            }
            Err(e) => debug!(error = %e, "cannot look for dead workers' sessions"),
        }
        // Even with no slot free, take at least one: its start then queues for the next
        // slot in turn with new work, instead of waiting until the backlog has drained.
        let free = inner.slots.available_permits().max(1);
        for q in &inner.cfg.queues {
            match inner
                .queue
                .reclaim(q, &inner.cfg.consumer, inner.cfg.reclaim_min_idle, free)
                .await
            {
                Ok(ds) => {
                    for d in ds {
                        // Seen by default: a takeover is the trace of a crash elsewhere.
                        info!(
                            target: PROCESS_TARGET,
                            session_id = %d.session_id,
                            queue = %q,
                            idle_at_least_secs = inner.cfg.reclaim_min_idle.as_secs(),
                            "taking over a session a dead worker left"
                        );
                        inner.metrics.sessions_reclaimed.inc();
                        delivery::start(&inner, &tracker, d).await;
                    }
                }
                Err(e) => debug!(error = %e, "reclaim failed"),
            }
        }
    }
}
