//! A session's view (`GET /v1/sessions/{id}`, the MCP tools `get_session` and
//! `wait_session`) and its cancellation (`POST /v1/sessions/{id}/cancel`,
//! `cancel_session`).

use agentq_api::{CancelResponse, SessionDetail};
use agentq_core::auth::Caller;
use agentq_core::{CancelResult, ListFilter, SessionRow};

use crate::error::ApiError;
use crate::http::{ApiResult, get_row, not_found, session_view};
use crate::state::Scheduler;

/// Children listed in a session's view.
const MAX_CHILDREN: u32 = 1000;

/// The view of session `id` of the caller's tenant.
pub(crate) async fn session_detail(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
) -> ApiResult<SessionDetail> {
    let row = get_row(s, caller, id).await?;
    detail_of(s, caller, row).await
}

/// The view of `row`, a session the caller may see.
pub(crate) async fn detail_of(
    s: &Scheduler,
    caller: &Caller,
    row: SessionRow,
) -> ApiResult<SessionDetail> {
    let children: Vec<String> = s
        .store
        .list(&ListFilter {
            tenant: caller.tenant_filter(),
            parent_id: Some(row.id.clone()),
            limit: MAX_CHILDREN,
            ..Default::default()
        })
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    let pending_approvals = super::pending_approvals(s, &row).await?;
    let (cost_usd, tree_cost, budget) = crate::http::cost::of_session(s, &row).await?;
    Ok(SessionDetail {
        session: session_view(&row),
        children,
        pending_approvals,
        cost_usd,
        tree_cost,
        budget,
    })
}

/// Cancel session `id` of the caller's tenant, and its descendants: at once if it was not
/// running (`cancel_requested: false`), else by asking its worker
/// (`cancel_requested: true`).
pub(crate) async fn cancel_session(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
) -> ApiResult<CancelResponse> {
    get_row(s, caller, id).await?;
    let result = s.store.request_cancel(id).await?;
    s.announce_cancel(&result).await;
    let (row, cancel_requested) = match result {
        CancelResult::CancelledNow(row) => {
            tracing::info!(session_id = %row.id, "session cancelled before running");
            (row, false)
        }
        CancelResult::Requested(row) => {
            tracing::info!(session_id = %row.id, owner = ?row.lease_owner, "cancel requested");
            (row, true)
        }
        CancelResult::AlreadyFinished(row) => {
            return Err(ApiError::Conflict {
                code: "already_finished",
                message: format!("session {} already finished ({})", row.id, row.status),
            });
        }
        CancelResult::NotFound => return Err(not_found(id)),
    };
    s.cancel_descendants(&row.id).await;
    Ok(CancelResponse {
        id: row.id,
        status: row.status,
        cancel_requested,
    })
}
