//! What the routes of `/v1/webhooks` do with endpoints: check a new one (each refusal
//! names its field), find one of the caller's (another tenant's is a 404), and show one
//! (its secret only when just made).

use chrono::{DateTime, Utc};

use agentq_api::{
    CreateWebhook, DeliveryCountsView, DeliveryStateView, DeliveryView, MAX_WEBHOOK_DESCRIPTION,
    WebhookFailure, WebhookStatus, WebhookView,
};
use agentq_core::auth::Caller;
use agentq_core::webhook::{DeliveryRow, DeliveryState, NewWebhook, WebhookEvent, WebhookRow};

use crate::error::ApiError;
use crate::http::ApiResult;
use crate::request::{MAX_QUEUE_NAME, valid_queue_name};
use crate::state::Scheduler;

use super::sign::new_salt;
use super::target::parse_url;

/// Longest id an endpoint or a batch may have in a request (bytes).
const MAX_ID: usize = 128;

/// Check a creation request and make the endpoint (its salt fresh).
pub(crate) async fn new_endpoint(
    s: &Scheduler,
    caller: &Caller,
    body: CreateWebhook,
) -> ApiResult<NewWebhook> {
    let CreateWebhook {
        url,
        events,
        queue,
        batch_id,
        description,
    } = body;
    let events = check_events(&events)?;
    if url.contains('\0') {
        return Err(ApiError::invalid("url", "must not contain NUL"));
    }
    let parsed = parse_url(&url).map_err(|r| ApiError::invalid("url", r.0))?;
    s.cfg
        .webhooks
        .destinations
        .check(&parsed)
        .await
        .map_err(|r| ApiError::invalid("url", r.0))?;
    if let Some(q) = &queue
        && !valid_queue_name(q)
    {
        return Err(ApiError::invalid(
            "queue",
            format!("invalid queue name {q:?}: use 1 to {MAX_QUEUE_NAME} of A-Z a-z 0-9 _ . -"),
        ));
    }
    if let Some(b) = &batch_id {
        let theirs = b.len() <= MAX_ID
            && !b.contains('\0')
            && s.store
                .batch(b)
                .await?
                .is_some_and(|row| caller.is_admin() || row.tenant == caller.tenant);
        if !theirs {
            return Err(ApiError::invalid("batch_id", format!("no batch {b:?}")));
        }
    }
    if let Some(d) = &description {
        if d.len() > MAX_WEBHOOK_DESCRIPTION {
            return Err(ApiError::invalid(
                "description",
                format!("is longer than {MAX_WEBHOOK_DESCRIPTION} bytes"),
            ));
        }
        if d.contains('\0') {
            return Err(ApiError::invalid("description", "must not contain NUL"));
        }
    }
    let secret_salt = new_salt().map_err(|e| {
        tracing::error!(error = %e, "no randomness for a webhook secret");
        ApiError::Internal
    })?;
    Ok(NewWebhook {
        id: format!("wh_{}", uuid::Uuid::now_v7().simple()),
        tenant: caller.tenant.clone(),
        url: parsed.to_string(),
        events,
        queue,
        batch_id,
        description,
        secret_salt,
        created_at: Utc::now(),
    })
}

/// At least one known event type, none twice; a bad one is named by its index.
fn check_events(events: &[String]) -> ApiResult<Vec<WebhookEvent>> {
    if events.is_empty() {
        return Err(ApiError::invalid(
            "events",
            "must name at least one of session.completed, session.failed, session.waiting, \
             batch.completed",
        ));
    }
    let mut out = Vec::with_capacity(events.len());
    for (i, e) in events.iter().enumerate() {
        let field = format!("events[{i}]");
        let Some(ev) = WebhookEvent::parse(e) else {
            return Err(ApiError::invalid(
                field,
                format!(
                    "unknown event type {e:?}: one of session.completed, session.failed, \
                     session.waiting, batch.completed"
                ),
            ));
        };
        if out.contains(&ev) {
            return Err(ApiError::invalid(field, format!("{e} is named twice")));
        }
        out.push(ev);
    }
    Ok(out)
}

/// The caller's endpoint `id` (any tenant's for an admin); a 404 otherwise, the same as
/// for one that does not exist.
pub(crate) async fn endpoint_of(s: &Scheduler, caller: &Caller, id: &str) -> ApiResult<WebhookRow> {
    let not_found = || ApiError::NotFound(format!("webhook {id} not found"));
    if id.len() > MAX_ID || id.contains('\0') {
        return Err(not_found());
    }
    match s.store.webhook(id).await? {
        Some(row) if caller.is_admin() || row.tenant == caller.tenant => Ok(row),
        _ => Err(not_found()),
    }
}

/// The view of an endpoint with its delivery counts; `secret` only when just made.
pub(crate) async fn view_of(
    s: &Scheduler,
    row: WebhookRow,
    secret: Option<String>,
) -> ApiResult<WebhookView> {
    let c = s.store.delivery_counts(&row.id).await?;
    let now = Utc::now();
    Ok(WebhookView {
        status: match row.disabled_at {
            Some(_) => WebhookStatus::Disabled,
            None => WebhookStatus::Enabled,
        },
        events: row.events.iter().map(|e| e.as_str().to_string()).collect(),
        last_failure: match (row.last_failure_at, row.last_failure) {
            (Some(at), Some(error)) => Some(WebhookFailure { at, error }),
            _ => None,
        },
        counts: DeliveryCountsView {
            pending: c.pending,
            delivered: c.delivered,
            dead: c.dead,
        },
        previous_secret_expires_at: row
            .old_expires_at
            .filter(|t: &DateTime<Utc>| *t > now && row.old_secret_salt.is_some()),
        id: row.id,
        url: row.url,
        queue: row.queue,
        batch_id: row.batch_id,
        description: row.description,
        disabled_at: row.disabled_at,
        disabled_reason: row.disabled_reason,
        failing_since: row.failing_since,
        last_success_at: row.last_success_at,
        created_at: row.created_at,
        secret,
    })
}

/// A delivery as the API shows it.
pub(crate) fn delivery_view(d: DeliveryRow) -> DeliveryView {
    let state = match d.state {
        DeliveryState::Pending => DeliveryStateView::Pending,
        DeliveryState::Delivered => DeliveryStateView::Delivered,
        DeliveryState::Dead => DeliveryStateView::Dead,
    };
    DeliveryView {
        next_attempt_at: (d.state == DeliveryState::Pending).then_some(d.next_attempt_at),
        id: d.id,
        event: d.event,
        session_id: d.session_id,
        batch_id: d.batch_id,
        state,
        attempts: d.attempts,
        occurred_at: d.occurred_at,
        last_attempt_at: d.last_attempt_at,
        last_status: d.last_status,
        last_error: d.last_error,
        delivered_at: d.delivered_at,
    }
}
