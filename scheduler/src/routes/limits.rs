//! The fleet's rate limiter, for operators (admin): what is configured, the counts of
//! every rule key in use, and the holds providers asked for.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use agentq_api::LimitsView;
use agentq_core::admission::{LimiterState, read_state};

use crate::error::ApiError;
use crate::http::{ApiResult, respond};
use crate::state::Scheduler;

/// How long the view waits for Redis.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// Read the rate limiter
///
/// The fleet's rate limiter as it stands: the rules configured, the counters of every
/// rule key in use, and the holds learned from providers.
#[utoipa::path(
    get,
    path = "/v1/admin/limits",
    operation_id = "get_limits",
    responses((status = 200, description = "The limiter's state", body = LimitsView)),
)]
pub(super) async fn state(State(s): State<Scheduler>) -> ApiResult<Response> {
    let limits = &s.cfg.limits;
    let Some(url) = limits.redis_url.as_deref() else {
        return respond(
            StatusCode::OK,
            &LimitsView {
                enabled: false,
                configured: limits.configured.clone(),
                rules: Vec::new(),
                holds: Vec::new(),
            },
        );
    };
    let read = async {
        if limits.redis_cluster {
            // The limiter's keys are spread over the cluster's slots.
            let seeds: Vec<&str> = url.split(',').map(str::trim).collect();
            let client =
                redis::cluster::ClusterClient::new(seeds).map_err(agentq_core::Error::from)?;
            let mut conn = client
                .get_async_connection()
                .await
                .map_err(agentq_core::Error::from)?;
            return read_state(&mut conn).await;
        }
        let client = redis::Client::open(url).map_err(agentq_core::Error::from)?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(agentq_core::Error::from)?;
        read_state(&mut conn).await
    };
    let LimiterState { rules, holds } = match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the rate limiter's state");
            return Err(ApiError::Unavailable(
                "the rate limiter's state cannot be read from Redis now; retry later".into(),
            ));
        }
        Err(_) => {
            return Err(ApiError::Unavailable(
                "Redis did not answer for the rate limiter's state; retry later".into(),
            ));
        }
    };
    respond(
        StatusCode::OK,
        &LimitsView {
            enabled: true,
            configured: limits.configured.clone(),
            rules,
            holds,
        },
    )
}
