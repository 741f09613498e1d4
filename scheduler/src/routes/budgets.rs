//! Tenant budgets and spend (admin): setting a tenant's budget through the API (stored, it
//! replaces the configured one and wakes the tenant's parked sessions), listing every
//! budget with its current spend, and a tenant's spend today and this month.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;

use agentq_api::{BudgetList, BudgetSet, SetBudget, TenantSpend};
use agentq_core::budget::{OnBudget, Period, TenantBudget, usd_to_nanos};

use crate::error::ApiError;
use crate::http::cost::{budget_view, effective_budgets, spend_view};
use crate::http::{ApiResult, JsonBody, decode_object, respond};
use crate::state::Scheduler;

/// Longest tenant name in a path.
const MAX_TENANT_LEN: usize = 128;

/// Parked sessions woken per raise; the sweeper wakes the rest at the period's turn, and
/// another raise wakes the next ones.
const WAKE_BATCH: u32 = 10_000;

fn tenant_of(path: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    let Ok(Path(t)) = path else {
        return Err(ApiError::invalid("tenant", "must be a tenant name"));
    };
    if t.is_empty()
        || t.len() > MAX_TENANT_LEN
        || t.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ApiError::invalid(
            "tenant",
            format!("must be 1 to {MAX_TENANT_LEN} characters without spaces or controls"),
        ));
    }
    Ok(t)
}

/// Set a tenant's budget
///
/// Stored, it replaces the tenant's configured `[[budgets]]`; its parked sessions are
/// woken (those still over the new budget park again).
#[utoipa::path(
    put,
    path = "/v1/admin/budgets/{tenant}",
    operation_id = "set_budget",
    params(("tenant" = String, Path, description = "The tenant")),
    request_body = SetBudget,
    responses((status = 200, description = "Set", body = BudgetSet)),
)]
pub(super) async fn set(
    State(s): State<Scheduler>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let tenant = tenant_of(path)?;
    let SetBudget {
        period,
        tokens,
        usd,
        on_budget,
    } = decode_object(body)?;
    let period = Period::parse(&period)
        .ok_or_else(|| ApiError::invalid("period", "must be \"day\" or \"month\""))?;
    let on_budget = match on_budget.as_deref() {
        None => OnBudget::Fail,
        Some(o) => OnBudget::parse(o)
            .ok_or_else(|| ApiError::invalid("on_budget", "must be \"park\" or \"fail\""))?,
    };
    if tokens.is_none() && usd.is_none() {
        return Err(ApiError::invalid(
            "tokens",
            "a budget sets tokens, usd or both",
        ));
    }
    if let Some(t) = tokens
        && !(1..=i64::MAX.unsigned_abs() / 4).contains(&t)
    {
        return Err(ApiError::invalid(
            "tokens",
            "must be a positive number of tokens",
        ));
    }
    if let Some(u) = usd
        && !(u.is_finite() && u > 0.0 && u <= 1e9)
    {
        return Err(ApiError::invalid(
            "usd",
            "must be a number of dollars above 0 and at most 1e9",
        ));
    }
    let budget = TenantBudget {
        tenant: tenant.clone(),
        period,
        tokens,
        usd_nanos: usd.map(usd_to_nanos),
        on_budget,
    };
    s.store.set_tenant_budget(&budget).await?;
    tracing::info!(tenant = %tenant, period = period.as_str(), ?tokens, ?usd, "tenant budget set");
    // The workers read stored budgets every few seconds; a woken session that runs before
    // its worker has read this one parks again and is woken by the sweeper or the next
    // raise, so wake them now and let the sweeper's pass catch stragglers.
    let woken = s.store.wake_budget_waiters(&tenant, WAKE_BATCH).await?;
    for w in woken.iter().filter(|w| !w.held) {
        agentq_core::lifecycle::enqueue_woken(s.store.as_ref(), s.queue.as_ref(), &w.id, &w.queue)
            .await;
    }
    if woken.iter().any(|w| w.held) {
        s.dispatch().nudge();
    }
    respond(
        StatusCode::OK,
        &BudgetSet {
            budget: budget_view(&s, &budget, "stored").await?,
            woken: woken.len(),
        },
    )
}

/// List budgets
///
/// Every tenant's budget, configured or stored, with what it spent this period.
#[utoipa::path(
    get,
    path = "/v1/admin/budgets",
    operation_id = "list_budgets",
    responses((status = 200, description = "The budgets", body = BudgetList)),
)]
pub(super) async fn list(State(s): State<Scheduler>) -> ApiResult<Response> {
    let mut budgets = Vec::new();
    for (b, source) in effective_budgets(&s).await? {
        budgets.push(budget_view(&s, &b, source).await?);
    }
    respond(StatusCode::OK, &BudgetList { budgets })
}

/// Read a tenant's spend
///
/// What the tenant spent today and this month (UTC).
#[utoipa::path(
    get,
    path = "/v1/admin/tenants/{tenant}/spend",
    operation_id = "get_tenant_spend",
    params(("tenant" = String, Path, description = "The tenant")),
    responses((status = 200, description = "The spend", body = TenantSpend)),
)]
pub(super) async fn spend(
    State(s): State<Scheduler>,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let tenant = tenant_of(path)?;
    let now = Utc::now();
    let (df, dt) = Period::Day.days(now);
    let (mf, mt) = Period::Month.days(now);
    let day = s.store.tenant_spend(&tenant, &df, &dt).await?;
    let month = s.store.tenant_spend(&tenant, &mf, &mt).await?;
    respond(
        StatusCode::OK,
        &TenantSpend {
            tenant,
            day: spend_view(day),
            month: spend_view(month),
        },
    )
}
