//! The console's summaries: a listing's filter counted per status, costs per tenant,
//! model and day (admin), and the fleet's queues, waits and workers (admin). Each reads
//! bounded aggregates from the store (and the queues' stream counters), never a page of
//! rows, except where a listing's row conditions (`metadata`, a cost range) leave the
//! store unable to count: those are counted on at most
//! [`MAX_SCANNED_PER_PAGE`] rows read.

use std::collections::BTreeMap;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Duration as Days, Utc};

use agentq_api::bounds::MAX_SCANNED_PER_PAGE;
use agentq_api::{
    COSTS_PARAMS, COUNT_PARAMS, CostEntry, CostReport, MAX_COST_DAYS, MAX_COST_ROWS, Operations,
    QueueOps, SessionCounts, WorkerView,
};
use agentq_core::auth::valid_tenant;
use agentq_core::report::{CostFilter, StatusCount};
use agentq_core::{ListFilter, SessionStatus, WaitReason};

use crate::error::ApiError;
use crate::http::query::{pairs, params};
use crate::http::{ApiResult, Auth, respond, wait_reason};
use crate::metrics::STATS_TIMEOUT;
use crate::request::{ListQuery, RowFilter};
use crate::state::Scheduler;

/// Rows read at a time when a count must read rows.
const COUNT_CHUNK_ROWS: u32 = 500;

/// The most workers one `GET /v1/admin/operations` lists.
const MAX_WORKERS: u32 = 1_000;

/// The range `GET /v1/admin/costs` covers when `since` is not given, in days.
const DEFAULT_COST_DAYS: i64 = 30;

/// Count sessions
///
/// How many sessions the same filter of `GET /v1/sessions` selects, per status and, for
/// the waiting ones, per reason. With `metadata` or a cost bound the sessions must be read
/// to be counted: at most 5,000 of the newest are, and `complete` says whether that was
/// all of them.
#[utoipa::path(
    get,
    path = "/v1/sessions/counts",
    operation_id = "count_sessions",
    params(
        ("status" = Option<SessionStatus>, Query, description = "As `GET /v1/sessions`."),
        ("parent_id" = Option<String>, Query, description = "As `GET /v1/sessions`."),
        ("batch_id" = Option<String>, Query, description = "As `GET /v1/sessions`."),
        ("finish_reason" = Option<agentq_agent::spec::ExitReason>, Query,
            description = "As `GET /v1/sessions`."),
        ("wait_reason" = Option<WaitReason>, Query, description = "As `GET /v1/sessions`."),
        ("queue" = Option<String>, Query, description = "As `GET /v1/sessions`."),
        ("metadata" = Option<Vec<String>>, Query, style = Form, explode,
            description = "As `GET /v1/sessions`."),
        ("created_after" = Option<chrono::DateTime<chrono::Utc>>, Query,
            description = "As `GET /v1/sessions`."),
        ("created_before" = Option<chrono::DateTime<chrono::Utc>>, Query,
            description = "As `GET /v1/sessions`."),
        ("min_cost_usd" = Option<f64>, Query, description = "As `GET /v1/sessions`."),
        ("max_cost_usd" = Option<f64>, Query, description = "As `GET /v1/sessions`."),
        ("q" = Option<String>, Query, description = "As `GET /v1/sessions`."),
        ("tenant" = Option<String>, Query, description = "As `GET /v1/sessions`."),
    ),
    responses((status = 200, description = "The counts", body = SessionCounts)),
)]
pub(super) async fn counts(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let q = ListQuery::from_pairs_of(pairs(query)?, COUNT_PARAMS)?;
    let (filter, keep) = q.filters(&caller)?;
    let (counts, complete) = if keep.is_empty() {
        (s.store.count_sessions(&filter).await?, true)
    } else {
        count_rows(&s, filter, &keep).await?
    };
    let mut answer = SessionCounts {
        total: 0,
        by_status: BTreeMap::new(),
        by_wait_reason: BTreeMap::new(),
        complete,
    };
    for c in counts {
        answer.total = answer.total.saturating_add(c.sessions);
        let n = answer
            .by_status
            .entry(c.status.as_str().to_string())
            .or_default();
        *n = n.saturating_add(c.sessions);
        if let Some(r) = c.wait_reason {
            let n = answer
                .by_wait_reason
                .entry(r.as_str().to_string())
                .or_default();
            *n = n.saturating_add(c.sessions);
        }
    }
    respond(StatusCode::OK, &answer)
}

/// The counts of the rows of `filter` that `keep` admits, reading at most
/// `MAX_SCANNED_PER_PAGE` rows, newest first; and whether that was every row.
async fn count_rows(
    s: &Scheduler,
    mut filter: ListFilter,
    keep: &RowFilter,
) -> ApiResult<(Vec<StatusCount>, bool)> {
    let mut counts: Vec<StatusCount> = Vec::new();
    let mut scanned = 0usize;
    filter.limit = COUNT_CHUNK_ROWS;
    loop {
        let chunk = s.store.list(&filter).await?;
        let last = chunk.len() < COUNT_CHUNK_ROWS as usize;
        filter.cursor = chunk.last().map(|r| r.id.clone());
        for row in &chunk {
            scanned = scanned.saturating_add(1);
            if !keep.admits(row, crate::http::cost::of_row(s, row)) {
                continue;
            }
            let reason = wait_reason(row);
            match counts
                .iter_mut()
                .find(|c| c.status == row.status && c.wait_reason == reason)
            {
                Some(c) => c.sessions = c.sessions.saturating_add(1),
                None => counts.push(StatusCount {
                    status: row.status,
                    wait_reason: reason,
                    sessions: 1,
                }),
            }
        }
        if last {
            return Ok((counts, true));
        }
        if scanned >= MAX_SCANNED_PER_PAGE {
            return Ok((counts, false));
        }
    }
}

/// Read costs
///
/// Tokens and their cost at the configured prices per tenant, model and day (UTC) of the
/// sessions created in `[since, until)`: sub-agents are sessions of their own, a retried
/// session counts every attempt. The range is at most 366 days; without `since`, the 30
/// days before `until` (now when absent).
#[utoipa::path(
    get,
    path = "/v1/admin/costs",
    operation_id = "get_costs",
    params(
        ("since" = Option<chrono::DateTime<chrono::Utc>>, Query, description = "Sessions \
            created at or after this time (RFC 3339); 30 days before `until` when absent."),
        ("until" = Option<chrono::DateTime<chrono::Utc>>, Query, description = "Sessions \
            created before this time (RFC 3339); now when absent."),
        ("tenant" = Option<String>, Query, description = "Only this tenant's sessions."),
    ),
    responses((status = 200, description = "The costs", body = CostReport)),
)]
pub(super) async fn costs(
    State(s): State<Scheduler>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let p = params(query, COSTS_PARAMS)?;
    let get = |k: &str| p.get(k).filter(|v| !v.is_empty()).map(String::as_str);
    let until = time("until", get("until"))?.unwrap_or_else(Utc::now);
    let since =
        time("since", get("since"))?.unwrap_or_else(|| until - Days::days(DEFAULT_COST_DAYS));
    if since >= until {
        return Err(ApiError::invalid("since", "must be before `until`"));
    }
    if until - since > Days::days(MAX_COST_DAYS) {
        return Err(ApiError::invalid(
            "since",
            format!("the range may span at most {MAX_COST_DAYS} days"),
        ));
    }
    let tenant = get("tenant").map(str::to_string);
    if tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
        return Err(ApiError::invalid("tenant", "is not a tenant name"));
    }
    let rows = s
        .store
        .costs(&CostFilter {
            tenant,
            since,
            until,
            // One more tells whether the answer is whole.
            limit: MAX_COST_ROWS.saturating_add(1),
        })
        .await?;
    let truncated = rows.len() > MAX_COST_ROWS as usize;
    let prices = &s.cfg.prices;
    let rows: Vec<CostEntry> = rows
        .into_iter()
        .take(MAX_COST_ROWS as usize)
        .map(|r| CostEntry {
            cost_usd: prices.cost_usd(r.model.as_deref().unwrap_or(""), &r.usage),
            day: r.day,
            tenant: r.tenant,
            model: r.model,
            sessions: r.sessions,
            input_tokens: r.usage.input_tokens,
            output_tokens: r.usage.output_tokens,
            cache_read_tokens: r.usage.cache_read_tokens,
            cache_write_tokens: r.usage.cache_write_tokens,
            reasoning_tokens: r.usage.reasoning_tokens,
            web_search_requests: r.usage.web_search_requests,
        })
        .collect();
    let cost_usd = rows.iter().filter_map(|r| r.cost_usd).sum();
    respond(
        StatusCode::OK,
        &CostReport {
            since,
            until,
            rows,
            cost_usd,
            truncated,
        },
    )
}

fn time(field: &str, v: Option<&str>) -> ApiResult<Option<DateTime<Utc>>> {
    v.map(|t| {
        DateTime::parse_from_rfc3339(t)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| ApiError::invalid(field, format!("must be an RFC 3339 time, got {t:?}")))
    })
    .transpose()
}

/// Read the fleet's operations
///
/// Per queue its stream (what waits for a worker, what is delivered and not yet
/// acknowledged) and the sessions the dispatcher holds back; the sessions waiting per
/// reason; the workers holding leases on running sessions. The rate limiter is
/// `GET /v1/admin/limits`, budgets `GET /v1/admin/budgets`.
#[utoipa::path(
    get,
    path = "/v1/admin/operations",
    operation_id = "get_operations",
    responses((status = 200, description = "The fleet's state", body = Operations)),
)]
pub(super) async fn operations(State(s): State<Scheduler>) -> ApiResult<Response> {
    let held = s.store.held_by_queue().await?;
    let mut names = s.queues().names();
    for (q, _) in &held {
        if !names.contains(q) {
            names.push(q.clone());
        }
    }
    let mut queues = Vec::with_capacity(names.len());
    for name in names {
        let stats = match tokio::time::timeout(STATS_TIMEOUT, s.queue.stats(&name)).await {
            Ok(Ok(st)) => Ok(st),
            Ok(Err(e)) => {
                tracing::debug!(queue = %name, error = %e, "cannot read queue stats");
                Err("the queue cannot be read now".to_string())
            }
            Err(_) => Err("the queue did not answer in time".to_string()),
        };
        let held = held.iter().find(|(q, _)| *q == name).map_or(0, |(_, n)| *n);
        queues.push(match stats {
            Ok(st) => QueueOps {
                length: Some(st.waiting()),
                pending: Some(st.pending),
                lag: st.lag,
                held,
                error: None,
                name,
            },
            Err(e) => QueueOps {
                length: None,
                pending: None,
                lag: None,
                held,
                error: Some(e),
                name,
            },
        });
    }
    let counts = s.store.waiting_by_reason().await?;
    let waiting = WaitReason::ALL
        .into_iter()
        .map(|r| {
            let n = counts
                .iter()
                .filter(|(c, _)| *c == r)
                .fold(0u64, |a, (_, n)| a.saturating_add(*n));
            (r.as_str().to_string(), n)
        })
        .collect();
    // One more tells whether the list is whole.
    let mut workers = s.store.workers(MAX_WORKERS.saturating_add(1)).await?;
    let workers_truncated = workers.len() > MAX_WORKERS as usize;
    workers.truncate(MAX_WORKERS as usize);
    respond(
        StatusCode::OK,
        &Operations {
            queues,
            waiting,
            workers: workers
                .into_iter()
                .map(|w| WorkerView {
                    worker: w.worker,
                    sessions: w.sessions,
                    first_lease_expiry: w.first_expiry,
                    last_lease_expiry: w.last_expiry,
                })
                .collect(),
            workers_truncated,
        },
    )
}
