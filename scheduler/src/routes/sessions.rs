//! Creating, reading, listing and cancelling sessions.
//!
//! Enqueue is "insert the row, then `XADD`, then mark the row enqueued". The row is the
//! commitment: once it is in Postgres the request succeeds, even if Redis is down at that
//! moment — the sweeper adds the missing entry later.

use std::collections::BTreeMap;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use agentq_api::{
    BatchResponse, CancelResponse, LIST_PARAMS, ListResponse, MessagesResponse, SessionDetail,
    SessionRef,
};
use agentq_core::auth::Caller;
use agentq_core::{CancelResult, EnqueueReason, ListFilter, NewSession, SessionRow, SessionStatus};

use crate::error::ApiError;
use crate::http::batch_body::BatchBody;
use crate::http::query::params;
use crate::http::{
    ApiResult, Auth, JsonBody, MAX_ID_LEN, check_id, get_row, not_found, pending_approval, respond,
    session_view,
};
use crate::inputs::check_sources;
use crate::request::{
    LIST_MAX_BYTES, Limits, ListQuery, SessionRequest, check_policy, check_policy_batch,
    parse_batch_bytes, parse_session,
};
use crate::state::Scheduler;

pub const DEFAULT_LIST_LIMIT: u32 = 50;
pub const MAX_LIST_LIMIT: u32 = agentq_api::bounds::MAX_LIST_LIMIT;
/// Children listed in a session's view.
const MAX_CHILDREN: u32 = 1000;

fn limits(s: &Scheduler, caller: &Caller) -> Limits {
    Limits {
        max_prompt_bytes: s.cfg.max_prompt_bytes,
        max_batch: s.cfg.max_batch,
        files: s.cfg.policy.for_tenant(&caller.tenant).files,
    }
}

/// The hash an idempotency key is bound to: of what was asked (the validated spec and
/// queue, before the tenant's policy fills in its bounds), so that key order, spacing and
/// spelled-out defaults do not count as a different request, and neither does a policy
/// change between a request and its repeat.
fn request_hash(r: &SessionRequest) -> ApiResult<Option<String>> {
    if r.idempotency_key.is_none() {
        return Ok(None);
    }
    // A request without a workspace hashes as it always has, so keys stored before
    // workspaces existed still match their repeats.
    // Likewise a priority other than the default is part of what was asked; the default
    // one hashes as before priorities existed.
    let priority = (r.priority != agentq_core::scheduling::DEFAULT_PRIORITY).then_some(r.priority);
    let asked = match (r.files.is_empty() && r.workspace_from.is_none(), priority) {
        (true, None) => serde_json::to_string(&(&r.spec, &r.queue)),
        (true, Some(p)) => serde_json::to_string(&(&r.spec, &r.queue, p)),
        (false, p) => {
            let files = crate::inputs::files_digest(&r.files);
            match p {
                None => serde_json::to_string(&(&r.spec, &r.queue, files, &r.workspace_from)),
                Some(p) => serde_json::to_string(&(&r.spec, &r.queue, files, &r.workspace_from, p)),
            }
        }
    };
    Ok(Some(agentq_core::auth::digest(
        &asked.map_err(|_| ApiError::Internal)?,
    )))
}

/// The session a request creates, owned by the caller's tenant.
fn new_session(r: SessionRequest, caller: &Caller, hash: Option<String>) -> NewSession {
    let mut n = NewSession::root(r.spec, r.queue).with_tenant(&caller.tenant);
    n.idempotency_key = r.idempotency_key;
    n.idempotency_hash = hash;
    n.sched.priority = r.priority;
    n.files = r.files;
    n.workspace_from = r.workspace_from;
    n
}

/// `POST /v1/sessions/batch?max_running=N&batch_id=B`: at most N of the batch's sessions
/// running (or buffered) at once; with `batch_id`, the sessions join that batch of the
/// caller's tenant (a client sending one batch in several requests) instead of a new one.
#[derive(Debug, Default)]
pub(super) struct BatchQuery {
    max_running: Option<String>,
    batch_id: Option<String>,
}

/// The query parameters `POST /v1/sessions/batch` accepts.
const BATCH_PARAMS: &[&str] = &["max_running", "batch_id"];

impl BatchQuery {
    fn from_params(mut p: BTreeMap<String, String>) -> BatchQuery {
        let mut take = |k: &str| p.remove(k).filter(|v| !v.is_empty());
        BatchQuery {
            max_running: take("max_running"),
            batch_id: take("batch_id"),
        }
    }

    fn max_running(&self) -> ApiResult<Option<u32>> {
        match self.max_running.as_deref() {
            None => Ok(None),
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .map(Some)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "max_running",
                        format!("must be an integer from 1 to 1000000, got {v:?}"),
                    )
                }),
        }
    }

    /// The batch to join: one that has sessions of the caller's own tenant (another
    /// tenant's batch is refused exactly as one that does not exist).
    async fn joined(&self, s: &Scheduler, caller: &Caller) -> ApiResult<Option<String>> {
        let Some(id) = &self.batch_id else {
            return Ok(None);
        };
        let unknown = || ApiError::invalid("batch_id", format!("no batch {id:?} of yours"));
        if id.len() > MAX_ID_LEN {
            return Err(unknown());
        }
        let found = s
            .store
            .list(&ListFilter {
                tenant: Some(caller.tenant.clone()),
                batch_id: Some(id.clone()),
                limit: 1,
                ..Default::default()
            })
            .await?;
        if found.is_empty() {
            return Err(unknown());
        }
        Ok(Some(id.clone()))
    }
}

/// A repeated idempotency key must come with the request it was first used with.
fn check_repeat(new: &NewSession, row: &SessionRow, field: String) -> ApiResult<()> {
    match (&new.idempotency_hash, &row.idempotency_hash) {
        (Some(asked), Some(stored)) if asked != stored => Err(ApiError::ConflictOn {
            field,
            message: format!(
                "idempotency key {:?} was used for a different request (session {})",
                new.idempotency_key.as_deref().unwrap_or_default(),
                row.id
            ),
        }),
        _ => Ok(()),
    }
}

/// `XADD` the new sessions of one queue and mark them enqueued. Failures are logged,
/// not returned: the rows are committed and the sweeper adds what is missing.
async fn enqueue(s: &Scheduler, queue: &str, ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    if !s.queues().ensure(s.queue.as_ref(), queue).await {
        tracing::warn!(
            queue,
            sessions = ids.len(),
            "queue unavailable; the sweeper will enqueue these sessions"
        );
        return;
    }
    let added = match ids {
        [id] => s.queue.enqueue(queue, id, EnqueueReason::New).await,
        _ => {
            let items: Vec<(String, EnqueueReason)> = ids
                .iter()
                .map(|id| (id.clone(), EnqueueReason::New))
                .collect();
            s.queue.enqueue_many(queue, &items).await
        }
    };
    if let Err(e) = added {
        tracing::warn!(queue, sessions = ids.len(), error = %e, "XADD failed; the sweeper will enqueue these sessions");
        return;
    }
    if let Err(e) = s.store.mark_enqueued(ids).await {
        // The entries exist; the sweeper may add duplicates, which the lease absorbs.
        tracing::warn!(queue, sessions = ids.len(), error = %e, "cannot mark sessions enqueued");
    }
}

/// Sessions may only name known queues (configured, or created by an admin); `batch`
/// names the field by the item's index.
async fn known_queues(s: &Scheduler, reqs: &[SessionRequest], batch: bool) -> ApiResult<()> {
    for (i, r) in reqs.iter().enumerate() {
        let field = if batch {
            format!("[{i}].queue")
        } else {
            "queue".to_string()
        };
        s.queues()
            .check_known(s.store.as_ref(), &r.queue, &field)
            .await?;
    }
    Ok(())
}

/// `POST /v1/sessions`
pub(super) async fn create(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let mut req = parse_session(body, &limits(&s, &caller), "")?;
    let hash = request_hash(&req)?;
    check_policy(&mut req, s.cfg.policy.for_tenant(&caller.tenant), "")?;
    known_queues(&s, std::slice::from_ref(&req), false).await?;
    check_sources(&s, &caller, std::slice::from_ref(&req), false).await?;
    let mut new = new_session(req, &caller, hash);
    new.sched.held = s.dispatch().hold(&new.queue, &new.tenant, 1, None);
    new.sched.capped = s.dispatch().capped(&new.tenant, None);
    let (row, created) = s.store.create_session(&new).await?;
    if !created {
        check_repeat(&new, &row, "idempotency_key".into())?;
    }
    if created {
        tracing::info!(session_id = %row.id, queue = %row.queue, held = new.sched.held, "session created");
        if new.sched.held {
            s.dispatch().nudge();
        } else {
            enqueue(&s, &row.queue, std::slice::from_ref(&row.id)).await;
        }
        respond(
            StatusCode::CREATED,
            &SessionRef {
                id: row.id,
                status: SessionStatus::Queued,
            },
        )
    } else {
        respond(
            StatusCode::OK,
            &SessionRef {
                id: row.id,
                status: row.status,
            },
        )
    }
}

/// `POST /v1/sessions/batch`
pub(super) async fn create_batch(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    // Its grant of the decode budget is held until the batch is created.
    BatchBody {
        bytes: body,
        grant: _grant,
    }: BatchBody,
) -> ApiResult<Response> {
    let q = BatchQuery::from_params(params(query, BATCH_PARAMS)?);
    let max_running = q.max_running()?;
    let joined = q.joined(&s, &caller).await?;
    let mut reqs = parse_batch_bytes(&body, &limits(&s, &caller))?;
    // The requests own what they need; the body's bytes go before the store's work.
    drop(body);
    let hashes = reqs
        .iter()
        .map(request_hash)
        .collect::<ApiResult<Vec<_>>>()?;
    check_policy_batch(&mut reqs, s.cfg.policy.for_tenant(&caller.tenant))?;
    known_queues(&s, &reqs, true).await?;
    check_sources(&s, &caller, &reqs, true).await?;
    let mut new: Vec<NewSession> = reqs
        .into_iter()
        .zip(hashes)
        .map(|(r, h)| new_session(r, &caller, h))
        .collect();
    // One batch id per request (or the one it joins): fair share among a tenant's
    // batches, and their caps.
    let batch_id = joined.unwrap_or_else(agentq_core::new_session_id);
    let mut per_queue: BTreeMap<String, usize> = BTreeMap::new();
    for n in &new {
        *per_queue.entry(n.queue.clone()).or_default() += 1;
    }
    let held: BTreeMap<String, bool> = per_queue
        .into_iter()
        .map(|(q, n)| {
            let held = s.dispatch().hold(&q, &caller.tenant, n, max_running);
            (q, held)
        })
        .collect();
    for n in &mut new {
        n.sched.batch_id = Some(batch_id.clone());
        n.sched.batch_max_running = max_running;
        n.sched.held = held.get(&n.queue).copied().unwrap_or(false);
        n.sched.capped = s.dispatch().capped(&caller.tenant, max_running);
    }
    let rows = s.store.create_sessions(&new).await?;

    let mut by_queue: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut any_held = false;
    for (row, created) in &rows {
        if *created && held.get(&row.queue).copied().unwrap_or(false) {
            any_held = true;
        } else if *created {
            by_queue
                .entry(row.queue.as_str())
                .or_default()
                .push(row.id.clone());
        }
    }
    let any_created = any_held || !by_queue.is_empty();
    tracing::info!(
        sessions = rows.len(),
        enqueued = by_queue.values().map(Vec::len).sum::<usize>(),
        held = any_held,
        "batch created"
    );
    for (queue, ids) in &by_queue {
        enqueue(&s, queue, ids).await;
    }
    if any_held {
        s.dispatch().nudge();
    }
    // After the enqueue: the new sessions of the batch are committed and must run.
    for (i, (n, (row, created))) in new.iter().zip(&rows).enumerate() {
        if !created {
            check_repeat(n, row, format!("[{i}].idempotency_key"))?;
        }
    }
    let answer = BatchResponse {
        sessions: rows
            .iter()
            .map(|(row, _)| SessionRef {
                id: row.id.clone(),
                status: row.status,
            })
            .collect(),
        batch_id: Some(batch_id),
    };
    let status = if any_created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    respond(status, &answer)
}

/// `GET /v1/sessions/{id}`
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let row = get_row(&s, &caller, &id).await?;
    let children: Vec<String> = s
        .store
        .list(&ListFilter {
            tenant: caller.tenant_filter(),
            parent_id: Some(id.clone()),
            limit: MAX_CHILDREN,
            ..Default::default()
        })
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect();
    // Only a session whose row shows held calls costs a read for them.
    let pending_approvals = if row.may_hold_calls() {
        let held = s.store.pending_approvals(&id, &row.held_calls).await?;
        held.into_iter()
            .map(|c| pending_approval(&row, c))
            .collect()
    } else {
        Vec::new()
    };
    let (cost_usd, tree_cost, budget) = crate::http::cost::of_session(&s, &row).await?;
    respond(
        StatusCode::OK,
        &SessionDetail {
            session: session_view(&row),
            children,
            pending_approvals,
            cost_usd,
            tree_cost,
            budget,
        },
    )
}

/// `GET /v1/sessions/{id}/messages`
pub(super) async fn messages(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    get_row(&s, &caller, &id).await?;
    let mut messages = s.store.messages(&id).await?;
    // Parallel tool results are stored as they finished; clients read them in call order.
    agentq_agent::state::normalize_history(&mut messages);
    respond(StatusCode::OK, &MessagesResponse { messages })
}

/// Rows read from the store at a time for a listing.
const LIST_CHUNK_ROWS: usize = 32;

/// What a session adds to a listing, roughly: its texts, the bulk of it.
fn row_bytes(row: &SessionRow) -> usize {
    let spec = &row.spec;
    [
        spec.prompt.len(),
        spec.system.as_deref().map_or(0, str::len),
        row.result.as_deref().map_or(0, str::len),
        row.error.as_deref().map_or(0, str::len),
        // Ids, numbers and the rest.
        1_024,
    ]
    .iter()
    .fold(0usize, |n, b| n.saturating_add(*b))
}

/// `GET /v1/sessions`
pub(super) async fn list(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let q = ListQuery::from_params(params(query, LIST_PARAMS)?)?;
    let limit = match q.limit.as_deref() {
        None => DEFAULT_LIST_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_LIST_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::invalid(
                    "limit",
                    format!("must be an integer between 1 and {MAX_LIST_LIMIT}, got {l:?}"),
                )
            })?,
    };
    let status = match q.status.as_deref() {
        None => None,
        Some(st) => Some(SessionStatus::parse(st).ok_or_else(|| {
            ApiError::invalid(
                "status",
                format!(
                    "unknown status {st:?} (expected queued, running, waiting, \
                     awaiting_approval, completed, failed or cancelled)"
                ),
            )
        })?),
    };
    let mut filter = ListFilter {
        tenant: caller.tenant_filter(),
        status,
        parent_id: q.parent_id,
        batch_id: q.batch_id,
        limit: 0,
        cursor: q.cursor,
    };
    // Read a few rows at a time, and end the page early once it holds
    // `LIST_MAX_BYTES`: a session may carry megabytes, so `limit` rows could be gigabytes.
    let limit = limit as usize;
    let mut rows: Vec<SessionRow> = Vec::new();
    let mut bytes = 0usize;
    let more = 'page: loop {
        let want = limit.saturating_sub(rows.len()).min(LIST_CHUNK_ROWS);
        // One more than asked tells whether another page exists.
        filter.limit = u32::try_from(want.saturating_add(1)).unwrap_or(u32::MAX);
        let chunk = s.store.list(&filter).await?;
        let chunk_more = chunk.len() > want;
        for row in chunk.into_iter().take(want) {
            let size = row_bytes(&row);
            if !rows.is_empty() && bytes.saturating_add(size) > LIST_MAX_BYTES {
                break 'page true;
            }
            bytes = bytes.saturating_add(size);
            rows.push(row);
        }
        if !chunk_more || rows.len() >= limit {
            break chunk_more;
        }
        filter.cursor = rows.last().map(|r| r.id.clone());
    };
    let next_cursor = if more {
        rows.last().map(|r| r.id.clone())
    } else {
        None
    };
    respond(
        StatusCode::OK,
        &ListResponse {
            sessions: rows.iter().map(session_view).collect(),
            next_cursor,
            cost_usd: crate::http::cost::of_rows(&s, &rows),
        },
    )
}

/// `POST /v1/sessions/{id}/cancel`
pub(super) async fn cancel(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    get_row(&s, &caller, &id).await?;
    let result = s.store.request_cancel(&id).await?;
    agentq_core::lifecycle::announce_cancel(s.store.as_ref(), s.queue.as_ref(), &result).await;
    match result {
        CancelResult::CancelledNow(row) => {
            tracing::info!(session_id = %row.id, "session cancelled before running");
            agentq_core::lifecycle::cancel_descendants(s.store.as_ref(), s.queue.as_ref(), &row.id)
                .await;
            respond(
                StatusCode::OK,
                &CancelResponse {
                    id: row.id,
                    status: row.status,
                    cancel_requested: false,
                },
            )
        }
        CancelResult::Requested(row) => {
            tracing::info!(session_id = %row.id, owner = ?row.lease_owner, "cancel requested");
            agentq_core::lifecycle::cancel_descendants(s.store.as_ref(), s.queue.as_ref(), &row.id)
                .await;
            respond(
                StatusCode::ACCEPTED,
                &CancelResponse {
                    id: row.id,
                    status: row.status,
                    cancel_requested: true,
                },
            )
        }
        CancelResult::AlreadyFinished(row) => Err(ApiError::Conflict {
            code: "already_finished",
            message: format!("session {} already finished ({})", row.id, row.status),
        }),
        CancelResult::NotFound => Err(not_found(&id)),
    }
}
