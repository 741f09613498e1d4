//! `/healthz` (liveness), `/readyz` (readiness: both backends answer and the scheduler is
//! not draining) and `/metrics`.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use agentq_api::{Readiness, ReadyChecks, ReadyStatus};
use agentq_core::metrics::global;

use crate::http::respond;
use crate::metrics::{CONTENT, STATS_TIMEOUT, record_held, record_queue, record_waiting};
use crate::state::Scheduler;

const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Liveness
///
/// The process serves requests (whatever its backends do).
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    responses((status = 200, description = "`ok`", content_type = "text/plain", body = String)),
)]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

fn readiness(status: ReadyStatus) -> Readiness {
    Readiness {
        status,
        down: Vec::new(),
        checks: None,
    }
}

/// Readiness
///
/// Both backends answer and the scheduler is not draining.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Draining, or a backend is down (`down`, `checks`)",
            body = Readiness),
    ),
)]
pub(super) async fn readyz(State(s): State<Scheduler>) -> Response {
    let answer = ready(&s).await;
    let status = if answer.status == ReadyStatus::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    respond(status, &answer).unwrap_or_else(IntoResponse::into_response)
}

async fn ready(s: &Scheduler) -> Readiness {
    if s.is_draining() {
        return readiness(ReadyStatus::Draining);
    }
    let check = |r: Result<agentq_core::Result<()>, tokio::time::error::Elapsed>| match r {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {READY_TIMEOUT:?}")),
    };
    let (pg, redis) = tokio::join!(
        tokio::time::timeout(READY_TIMEOUT, s.store.ping()),
        tokio::time::timeout(READY_TIMEOUT, s.queue.ping()),
    );
    let (pg, redis) = (check(pg), check(redis));
    if pg.is_none() && redis.is_none() {
        return readiness(ReadyStatus::Ready);
    }
    let down: Vec<String> = [("postgres", &pg), ("redis", &redis)]
        .into_iter()
        .filter(|(_, e)| e.is_some())
        .map(|(n, _)| n.to_string())
        .collect();
    tracing::warn!(postgres = ?pg, redis = ?redis, "not ready");
    let status = |e: &Option<String>| e.clone().unwrap_or_else(|| "ok".into());
    Readiness {
        status: ReadyStatus::Unavailable,
        down,
        checks: Some(ReadyChecks {
            postgres: status(&pg),
            redis: status(&redis),
        }),
    }
}

/// Metrics
///
/// The process's metrics in the Prometheus text format, served on the metrics listener
/// (`metrics_addr`), not the API's.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    servers((url = "http://127.0.0.1:9464", description = "The metrics listener \
        (`metrics_addr`; this is its default)")),
    responses((status = 200, description = "The Prometheus text exposition",
        content_type = "text/plain", body = String)),
)]
pub(super) async fn metrics(State(s): State<Scheduler>) -> Response {
    let m = global();
    for queue in s.queues().names() {
        let stats = match tokio::time::timeout(STATS_TIMEOUT, s.queue.stats(&queue)).await {
            Ok(Ok(st)) => Some(st),
            Ok(Err(e)) => {
                tracing::debug!(queue, error = %e, "cannot read queue stats for /metrics");
                None
            }
            Err(_) => None,
        };
        record_queue(m, &queue, stats);
    }
    // Suspended sessions hold no worker, so only the store knows how many there are.
    match tokio::time::timeout(STATS_TIMEOUT, s.store.waiting_by_reason()).await {
        Ok(Ok(counts)) => record_waiting(m, &counts),
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot count waiting sessions for /metrics"),
        Err(_) => {}
    }
    match tokio::time::timeout(STATS_TIMEOUT, s.store.held_by_queue()).await {
        Ok(Ok(counts)) => record_held(m, &s.queues().names(), &counts),
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot count held sessions for /metrics"),
        Err(_) => {}
    }
    ([(CONTENT_TYPE, CONTENT)], m.render()).into_response()
}
