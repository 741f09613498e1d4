//! The scheduler as a process: the configured queues' consumer groups, the API and
//! `/metrics` listeners, the sweeper, the workspace collector, retention, the dispatcher,
//! the webhook delivery loop and the schedules' fire loop, until shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use agentq_core::{Queue, Store};

use crate::retention::Retention;
use crate::routes::{metrics_router, router};
use crate::schedules::Firer;
use crate::serve::serve;
use crate::settings::SchedulerSettings;
use crate::state::Scheduler;
use crate::webhooks::{Deliverer, SystemClock};
use crate::{sweeper, workspace_gc};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("HTTP server: {0}")]
    Io(#[from] std::io::Error),
}

/// Run the scheduler until `shutdown` is cancelled: create the configured queues' consumer
/// groups, serve the API on `listener` (graceful: in-flight requests finish, `/readyz`
/// turns 503 at once) and `/metrics` on `metrics` (a listener of its own: the scraper
/// holds no API key), and run the sweeper and the dispatcher.
pub async fn run(
    store: Arc<dyn Store>,
    queue: Arc<dyn Queue>,
    cfg: SchedulerSettings,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let state =
        Scheduler::new(store.clone(), queue.clone(), cfg.clone()).with_shutdown(shutdown.clone());
    // Not fatal when Redis is briefly away: the sweeper retries every tick.
    if !state.queues().ensure_configured(queue.as_ref()).await {
        tracing::warn!("some consumer groups could not be created yet; will retry");
    }

    // A child token: the sweeper also stops when the server ends on its own, without
    // cancelling the caller's token.
    let stop_sweeper = shutdown.child_token();
    let workspace_gc = tokio::spawn(workspace_gc::run_workspace_gc(
        store.clone(),
        cfg.workspace.clone(),
        stop_sweeper.clone(),
    ));
    let retention = match Retention::new(
        store.clone(),
        cfg.retention.clone(),
        cfg.workspace.clone(),
        Arc::new(SystemClock),
        agentq_core::metrics::global(),
    ) {
        // Always: a rule may be stored through the admin API at any time.
        Ok(r) => Some(tokio::spawn(r.run(stop_sweeper.clone()))),
        Err(e) => {
            tracing::error!(error = %e, "retention cannot start; finished trees are kept");
            None
        }
    };
    let deliverer = tokio::spawn(
        Deliverer::new(store.clone(), cfg.webhooks.clone(), Arc::new(SystemClock))
            .run(stop_sweeper.clone()),
    );
    let firer =
        tokio::spawn(Firer::new(state.clone(), Arc::new(SystemClock)).run(stop_sweeper.clone()));
    let sweeper = tokio::spawn(sweeper::run_sweeper(
        store,
        queue,
        state.queues().clone(),
        sweeper::SweepSettings {
            interval: cfg.sweep_interval,
            age: cfg.sweep_age,
            stream_max_len: cfg.stream_max_len,
            event_ttl: cfg.event_ttl,
        },
        stop_sweeper.clone(),
    ));
    let dispatcher = state.spawn_dispatcher(stop_sweeper.clone());

    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "scheduler listening");
    }
    let metrics_server = metrics.map(|m| {
        if let Ok(addr) = m.local_addr() {
            tracing::info!(%addr, "serving /metrics");
        }
        let token = shutdown.clone();
        let app = metrics_router(state.clone());
        tokio::spawn(async move {
            let served = axum::serve(m, app)
                .with_graceful_shutdown(async move { token.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the /metrics server stopped");
            }
        })
    });
    let app = router(state);
    let served = serve(listener, app, cfg.serve, shutdown.clone()).await;
    stop_sweeper.cancel();
    if let Some(m) = metrics_server {
        m.abort();
    }
    let mut background = vec![
        ("sweeper", sweeper),
        ("dispatcher", dispatcher),
        ("webhook delivery", deliverer),
        ("schedule fire", firer),
        ("workspace collector", workspace_gc),
    ];
    background.extend(retention.map(|r| ("retention", r)));
    for (task, handle) in background {
        if let Err(e) = handle.await {
            tracing::error!(error = %e, task, "a background task failed");
        }
    }
    served?;
    tracing::info!("scheduler stopped");
    Ok(())
}
