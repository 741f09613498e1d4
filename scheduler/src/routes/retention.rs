//! Retention rules (admin): the rules in force, and a rule per tenant or per queue stored
//! in the database, which replaces the configured override of that tenant or queue
//! (`RetentionSection::rules_with` says how they combine). The retention pass reads the
//! stored rules at each pass.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::Utc;

use agentq_api::{RetentionRuleView, RetentionRules, SetRetention};
use agentq_core::auth::{MAX_TENANT, valid_tenant};
use agentq_core::config::RetentionOverride;
use agentq_core::retention::{Keep, MAX_RETENTION_DAYS, RuleKind, StoredRetentionRule};

use crate::error::ApiError;
use crate::http::{ApiResult, JsonBody, decode_object, respond};
use crate::request::{MAX_QUEUE_NAME, valid_queue_name};
use crate::state::Scheduler;

/// The tenant or queue of a rule's path, checked as names of its kind are.
fn name_of(kind: RuleKind, path: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    let field = kind.as_str();
    let name = path.map(|Path(n)| n).unwrap_or_default();
    let ok = match kind {
        RuleKind::Tenant => valid_tenant(&name),
        RuleKind::Queue => valid_queue_name(&name),
    };
    if !ok {
        let most = match kind {
            RuleKind::Tenant => MAX_TENANT,
            RuleKind::Queue => MAX_QUEUE_NAME,
        };
        return Err(ApiError::invalid(
            field,
            format!("must be 1 to {most} of A-Z a-z 0-9 _ . -"),
        ));
    }
    Ok(name)
}

fn stored_view(r: &StoredRetentionRule) -> RetentionRuleView {
    RetentionRuleView {
        kind: r.kind.as_str().into(),
        name: r.name.clone(),
        days: Some(r.days),
        keep: r.keep.as_str().into(),
        source: "stored".into(),
        updated_at: Some(r.updated_at),
    }
}

/// Store the rule of `kind` `name` from `body`.
async fn set(
    s: &Scheduler,
    kind: RuleKind,
    path: Result<Path<String>, PathRejection>,
    body: serde_json::Value,
) -> ApiResult<Response> {
    let name = name_of(kind, path)?;
    let SetRetention { days, keep } = decode_object(body)?;
    if !(1..=MAX_RETENTION_DAYS).contains(&days) {
        return Err(ApiError::invalid(
            "days",
            format!("must be a whole number of days from 1 to {MAX_RETENTION_DAYS}, not {days}"),
        ));
    }
    let keep = match keep.as_deref() {
        None => Keep::None,
        Some(k) => Keep::parse(k)
            .ok_or_else(|| ApiError::invalid("keep", "must be \"none\" or \"result\""))?,
    };
    let rule = StoredRetentionRule {
        kind,
        name,
        days,
        keep,
        updated_at: Utc::now(),
    };
    s.store.set_retention_rule(&rule).await?;
    tracing::info!(kind = kind.as_str(), name = %rule.name, days, keep = keep.as_str(), "retention rule stored");
    respond(StatusCode::OK, &stored_view(&rule))
}

/// Delete the stored rule of `kind` `name`.
async fn delete(
    s: &Scheduler,
    kind: RuleKind,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let name = name_of(kind, path)?;
    if !s.store.delete_retention_rule(kind, &name).await? {
        return Err(ApiError::NotFound(format!(
            "no stored retention rule for {} {name}",
            kind.as_str()
        )));
    }
    tracing::info!(kind = kind.as_str(), name = %name, "retention rule deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// List the retention rules
///
/// The global rule, and every tenant's and queue's in force: stored through this API or
/// configured (`[retention]`). A tenant's rule wins over a queue's, a queue's over the
/// global one; a stored rule replaces the configured one of its tenant or queue.
#[utoipa::path(
    get,
    path = "/v1/admin/retention",
    operation_id = "list_retention_rules",
    responses((status = 200, description = "The rules", body = RetentionRules)),
)]
pub(super) async fn list(State(s): State<Scheduler>) -> ApiResult<Response> {
    let cfg = &s.cfg.retention;
    let stored = s.store.retention_rules().await?;
    let views =
        |kind: RuleKind, configured: &std::collections::BTreeMap<String, RetentionOverride>| {
            let mut out: Vec<RetentionRuleView> = configured
                .iter()
                .filter(|(n, _)| !stored.iter().any(|r| r.kind == kind && &r.name == *n))
                .map(|(n, o)| RetentionRuleView {
                    kind: kind.as_str().into(),
                    name: n.clone(),
                    days: o.days.or(cfg.days),
                    keep: o.keep.unwrap_or(cfg.keep).as_str().into(),
                    source: "config".into(),
                    updated_at: None,
                })
                .collect();
            out.extend(stored.iter().filter(|r| r.kind == kind).map(stored_view));
            out.sort_by(|a, b| a.name.cmp(&b.name));
            out
        };
    let tenants = views(RuleKind::Tenant, &cfg.tenants);
    let queues = views(RuleKind::Queue, &cfg.queues);
    respond(
        StatusCode::OK,
        &RetentionRules {
            days: cfg.days,
            keep: cfg.keep.as_str().into(),
            tenants,
            queues,
        },
    )
}

/// Set a tenant's retention
///
/// Stored, it replaces the tenant's configured `[retention.tenants.<tenant>]` and wins
/// over every queue's rule for the tenant's trees, from the next retention pass on.
#[utoipa::path(
    put,
    path = "/v1/admin/retention/tenants/{tenant}",
    operation_id = "set_tenant_retention",
    params(("tenant" = String, Path, description = "The tenant")),
    request_body = SetRetention,
    responses((status = 200, description = "Stored", body = RetentionRuleView)),
)]
pub(super) async fn set_tenant(
    State(s): State<Scheduler>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    set(&s, RuleKind::Tenant, path, body).await
}

/// Delete a tenant's stored retention
///
/// The configured rule (if any) applies again from the next pass on.
#[utoipa::path(
    delete,
    path = "/v1/admin/retention/tenants/{tenant}",
    operation_id = "delete_tenant_retention",
    params(("tenant" = String, Path, description = "The tenant")),
    responses((status = 204, description = "Deleted")),
)]
pub(super) async fn delete_tenant(
    State(s): State<Scheduler>,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    delete(&s, RuleKind::Tenant, path).await
}

/// Set a queue's retention
///
/// Stored, it replaces the queue's configured `[retention.queues.<queue>]` for the trees
/// whose root ran on it (a tenant's rule still wins), from the next retention pass on.
#[utoipa::path(
    put,
    path = "/v1/admin/retention/queues/{queue}",
    operation_id = "set_queue_retention",
    params(("queue" = String, Path, description = "The queue")),
    request_body = SetRetention,
    responses((status = 200, description = "Stored", body = RetentionRuleView)),
)]
pub(super) async fn set_queue(
    State(s): State<Scheduler>,
    path: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    set(&s, RuleKind::Queue, path, body).await
}

/// Delete a queue's stored retention
///
/// The configured rule (if any) applies again from the next pass on.
#[utoipa::path(
    delete,
    path = "/v1/admin/retention/queues/{queue}",
    operation_id = "delete_queue_retention",
    params(("queue" = String, Path, description = "The queue")),
    responses((status = 204, description = "Deleted")),
)]
pub(super) async fn delete_queue(
    State(s): State<Scheduler>,
    path: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    delete(&s, RuleKind::Queue, path).await
}
