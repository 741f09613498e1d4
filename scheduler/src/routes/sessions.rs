//! Creating, reading, listing and cancelling sessions (what one session's routes do is
//! in [`crate::actions`], shared with the MCP tools).

use std::collections::BTreeMap;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use agentq_agent::spec::ExitReason;
use agentq_api::bounds::MAX_SCANNED_PER_PAGE;
use agentq_api::{
    BatchResponse, CancelResponse, CreateSession, ErrorBody, ListResponse, MessagesResponse,
    SessionDetail, SessionRef,
};
use agentq_core::auth::Caller;
use agentq_core::wait::WaitReason;
use agentq_core::{ListFilter, NewSession, SessionRow, SessionStatus};

use crate::actions::{
    self, Created, check_repeat, enqueue, known_queues, limits, new_session, request_hash,
};
use crate::error::ApiError;
use crate::http::batch_body::BatchBody;
use crate::http::query::{pairs, params};
use crate::http::{
    ApiResult, Auth, JsonBody, MAX_ID_LEN, check_id, get_row, respond, session_view,
};
use crate::inputs::check_sources;
use crate::request::{LIST_MAX_BYTES, ListQuery, RowFilter, check_policy_batch, parse_batch_bytes};
use crate::state::Scheduler;

pub const DEFAULT_LIST_LIMIT: u32 = 50;
pub const MAX_LIST_LIMIT: u32 = agentq_api::bounds::MAX_LIST_LIMIT;

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

/// Create a session
///
/// The session is queued at once; follow it with `GET /v1/sessions/{id}` or its events.
/// The spec's fields sit at the top level beside `queue` and `idempotency_key`; any other
/// field is refused (422 `unknown_field`), and so is a field named like a credential
/// anywhere in the body (422 `credential_not_allowed`): provider keys belong to the
/// workers.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    operation_id = "create_session",
    request_body = CreateSession,
    responses(
        (status = 201, description = "Created and queued", body = SessionRef),
        (status = 200, description = "A repeat of an `idempotency_key`: the session it \
            created", body = SessionRef),
        (status = 409, description = "`conflict`: the `idempotency_key` was used for another \
            request (`field`: `idempotency_key`)", body = ErrorBody),
    ),
)]
pub(super) async fn create(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let Created { session, created } = actions::create_session(&s, &caller, body).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    respond(status, &session)
}

/// Create a batch of sessions
///
/// 1 to `max_batch` sessions (10,000 by default), created all or none: one bad item
/// refuses the batch, naming it (`[17].mode`).
#[utoipa::path(
    post,
    path = "/v1/sessions/batch",
    operation_id = "create_batch",
    params(
        ("max_running" = Option<u32>, Query, minimum = 1, maximum = 1000000,
            description = "At most this many of the batch's sessions run at once."),
        ("batch_id" = Option<String>, Query, description = "Join this batch of the \
            caller's tenant (a batch sent in several requests) instead of a new one."),
    ),
    request_body = Vec<CreateSession>,
    responses(
        (status = 201, description = "Created (any of them)", body = BatchResponse),
        (status = 200, description = "Every item was a repeat of its `idempotency_key`",
            body = BatchResponse),
        (status = 409, description = "`conflict`: an `idempotency_key` was used for another \
            request (`field`: `[i].idempotency_key`)", body = ErrorBody),
    ),
)]
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
    let batch_id = batch_home(joined, &new, &caller.tenant);
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
        n.id = agentq_core::shard::id_beside(&batch_id);
        n.root_id = n.id.clone();
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

/// Read a session
///
/// The session, the ids of its children (newest first, at most 1000), the tool calls it
/// holds for a human decision, and what it cost.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    operation_id = "get_session",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The session", body = SessionDetail)),
)]
pub(super) async fn get(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    respond(
        StatusCode::OK,
        &actions::session_detail(&s, &caller, &id).await?,
    )
}

/// Read a session's history
///
/// Every message, parallel tool results in the order of their calls.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/messages",
    operation_id = "get_messages",
    params(("id" = String, Path, description = "The session's id")),
    responses((status = 200, description = "The history", body = MessagesResponse)),
)]
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

/// List sessions
///
/// A page of the caller's sessions, newest first, narrowed by every filter given. Any
/// other query parameter, or a value a filter cannot take, is refused (422 naming it).
/// With `metadata` or a cost bound a page reads at most 5,000 sessions: it may then hold
/// fewer than `limit` (even none) with a `next_cursor` to go on from.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    operation_id = "list_sessions",
    params(
        ("status" = Option<SessionStatus>, Query, description = "Only sessions in this \
            status."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000,
            description = "Sessions per page (50 when absent)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous \
            page."),
        ("parent_id" = Option<String>, Query, description = "Only the children of this \
            session."),
        ("batch_id" = Option<String>, Query, description = "Only the sessions of this batch."),
        ("finish_reason" = Option<ExitReason>, Query, description = "Only sessions that \
            finished for this reason."),
        ("wait_reason" = Option<WaitReason>, Query, description = "Only sessions waiting \
            (`waiting` or `awaiting_approval`) for this."),
        ("queue" = Option<String>, Query, description = "Only sessions of this queue."),
        ("metadata" = Option<Vec<String>>, Query, style = Form, explode, description = "`key=value`: \
            only sessions whose metadata has this entry (a string, or the JSON text of a \
            number or boolean); repeat for several, all required (at most 16)."),
        ("created_after" = Option<chrono::DateTime<chrono::Utc>>, Query, description = "Only \
            sessions created at or after this time (RFC 3339)."),
        ("created_before" = Option<chrono::DateTime<chrono::Utc>>, Query, description = "Only \
            sessions created before this time (RFC 3339)."),
        ("min_cost_usd" = Option<f64>, Query, description = "Only sessions that cost at \
            least this at the configured prices (a session without a price is left out)."),
        ("max_cost_usd" = Option<f64>, Query, description = "Only sessions that cost at \
            most this at the configured prices (a session without a price is left out)."),
        ("q" = Option<String>, Query, max_length = 200, description = "Only sessions whose \
            id starts with this or whose prompt holds it, ignoring case (on SQLite, of ASCII \
            letters only); `%`, `_` and `\\` are matched as themselves. At most 200 \
            characters, no NUL."),
        ("tenant" = Option<String>, Query, description = "Only this tenant's sessions: for \
            a key with the admin scope. Any other key may name only its own tenant (the same \
            as naming none); another is refused (403 naming `tenant`)."),
    ),
    responses((status = 200, description = "A page", body = ListResponse)),
)]
pub(super) async fn list(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> ApiResult<Response> {
    let q = ListQuery::from_pairs(pairs(query)?)?;
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
    let (filter, keep) = q.filters(&caller)?;
    let (rows, next_cursor) = read_page(&s, filter, &keep, limit as usize).await?;
    respond(
        StatusCode::OK,
        &ListResponse {
            sessions: rows.iter().map(session_view).collect(),
            next_cursor,
            cost_usd: crate::http::cost::of_rows(&s, &rows),
        },
    )
}

/// A page of at most `limit` rows of `filter` that `keep` admits, and the cursor past
/// what it read when more may follow. Reads a few rows at a time and ends the page early
/// once it holds `LIST_MAX_BYTES` (a session may carry megabytes, so `limit` rows could
/// be gigabytes) or, with conditions on the rows, once it has read
/// `MAX_SCANNED_PER_PAGE` of them.
async fn read_page(
    s: &Scheduler,
    mut filter: ListFilter,
    keep: &RowFilter,
    limit: usize,
) -> ApiResult<(Vec<SessionRow>, Option<String>)> {
    // Rows the conditions may leave out come in larger chunks; so do those of a text
    // search, whose every statement reads the prompts anew (one statement for a page of
    // 50 rather than two: half the time on a 10,000-session store).
    let chunk_rows = if keep.is_empty() && filter.text.is_none() {
        LIST_CHUNK_ROWS
    } else {
        LIST_CHUNK_ROWS * 8
    };
    let mut rows: Vec<SessionRow> = Vec::new();
    let mut bytes = 0usize;
    let mut scanned = 0usize;
    // The last row read and consumed: where the next page starts.
    let mut last: Option<String> = None;
    let more = 'page: loop {
        let want = if keep.is_empty() {
            limit.saturating_sub(rows.len()).min(chunk_rows)
        } else {
            chunk_rows.min(MAX_SCANNED_PER_PAGE.saturating_sub(scanned))
        };
        // One more than asked tells whether another page exists.
        filter.limit = u32::try_from(want.saturating_add(1)).unwrap_or(u32::MAX);
        let chunk = s.store.list(&filter).await?;
        let chunk_more = chunk.len() > want;
        for row in chunk.into_iter().take(want) {
            if rows.len() >= limit {
                break 'page true;
            }
            scanned = scanned.saturating_add(1);
            let id = row.id.clone();
            if keep.is_empty() || keep.admits(&row, crate::http::cost::of_row(s, &row)) {
                let size = row_bytes(&row);
                if !rows.is_empty() && bytes.saturating_add(size) > LIST_MAX_BYTES {
                    break 'page true;
                }
                bytes = bytes.saturating_add(size);
                rows.push(row);
            }
            last = Some(id);
        }
        if !chunk_more {
            break false;
        }
        if rows.len() >= limit || scanned >= MAX_SCANNED_PER_PAGE {
            break true;
        }
        filter.cursor = last.clone();
    };
    Ok((rows, if more { last } else { None }))
}

/// Cancel a session
///
/// Its unfinished sub-agents are cancelled with it. No body is read.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/cancel",
    operation_id = "cancel_session",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Cancelled at once (it was not running)",
            body = CancelResponse),
        (status = 202, description = "`cancel_requested`: its worker stops it at its next \
            check", body = CancelResponse),
        (status = 409, description = "`already_finished`", body = ErrorBody),
    ),
)]
pub(super) async fn cancel(
    State(s): State<Scheduler>,
    Auth(caller): Auth,
    id: Result<Path<String>, PathRejection>,
) -> ApiResult<Response> {
    let id = check_id(id)?;
    let answer = actions::cancel_session(&s, &caller, &id).await?;
    let status = if answer.cancel_requested {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    respond(status, &answer)
}

/// The id of a request's batch, which its sessions live beside (one shard): the joined
/// batch's, else one in the partition of its first idempotency key, so that a retried
/// request lands where the first one did and its keys find their sessions.
fn batch_home(joined: Option<String>, new: &[NewSession], tenant: &str) -> String {
    joined.unwrap_or_else(
        || match new.iter().find_map(|n| n.idempotency_key.as_deref()) {
            Some(key) => agentq_core::shard::id_in(agentq_core::shard::key_partition(tenant, key)),
            None => agentq_core::new_session_id(),
        },
    )
}
