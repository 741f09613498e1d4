//! Creating sessions: what one request (`POST /v1/sessions`, the MCP tool
//! `submit_session`) and a batch share, and the one request's whole path.
//!
//! Enqueue is "insert the row, then `XADD`, then mark the row enqueued". The row is the
//! commitment: once it is in Postgres the request succeeds, even if Redis is down at that
//! moment — the sweeper adds the missing entry later.

use serde_json::Value;

use agentq_api::SessionRef;
use agentq_core::auth::Caller;
use agentq_core::{EnqueueReason, NewSession, SessionRow, SessionStatus};

use crate::error::ApiError;
use crate::http::ApiResult;
use crate::inputs::check_sources;
use crate::request::{Limits, SessionRequest, check_policy, parse_session};
use crate::state::Scheduler;

pub(crate) fn limits(s: &Scheduler, caller: &Caller) -> Limits {
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
pub(crate) fn request_hash(r: &SessionRequest) -> ApiResult<Option<String>> {
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
pub(crate) fn new_session(r: SessionRequest, caller: &Caller, hash: Option<String>) -> NewSession {
    let mut n = NewSession::root(r.spec, r.queue).with_tenant(&caller.tenant);
    // Where the tree lives (`agentq_core::shard`): beside the tree whose files it starts
    // from (the copy is read there), else in its idempotency key's partition (a retry
    // lands where the first submit did), else anywhere.
    if let Some(key) = r.idempotency_key {
        n = n.with_idempotency_key(key);
    }
    if let Some(from) = &r.workspace_from {
        n.id = agentq_core::shard::id_beside(from);
        n.root_id = n.id.clone();
    }
    n.idempotency_hash = hash;
    n.sched.priority = r.priority;
    n.files = r.files;
    n.workspace_from = r.workspace_from;
    n
}

/// A repeated idempotency key must come with the request it was first used with.
pub(crate) fn check_repeat(new: &NewSession, row: &SessionRow, field: String) -> ApiResult<()> {
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
pub(crate) async fn enqueue(s: &Scheduler, queue: &str, ids: &[String]) {
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
pub(crate) async fn known_queues(
    s: &Scheduler,
    reqs: &[SessionRequest],
    batch: bool,
) -> ApiResult<()> {
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

/// A session request's answer: the session, and whether this request created it (else it
/// repeated an idempotency key).
pub(crate) struct Created {
    pub session: SessionRef,
    pub created: bool,
}

/// Create the session `body` (a decoded `POST /v1/sessions` body) asks for, as `caller`.
pub(crate) async fn create_session(
    s: &Scheduler,
    caller: &Caller,
    body: Value,
) -> ApiResult<Created> {
    let mut req = parse_session(body, &limits(s, caller), "")?;
    let hash = request_hash(&req)?;
    check_policy(&mut req, s.cfg.policy.for_tenant(&caller.tenant), "")?;
    known_queues(s, std::slice::from_ref(&req), false).await?;
    check_sources(s, caller, std::slice::from_ref(&req), false).await?;
    let mut new = new_session(req, caller, hash);
    new.sched.held = s.dispatch().hold(&new.queue, &new.tenant, 1, None);
    new.sched.capped = s.dispatch().capped(&new.tenant, None);
    let (row, created) = s.store.create_session(&new).await?;
    if !created {
        check_repeat(&new, &row, "idempotency_key".into())?;
        return Ok(Created {
            session: SessionRef {
                id: row.id,
                status: row.status,
            },
            created: false,
        });
    }
    tracing::info!(session_id = %row.id, queue = %row.queue, held = new.sched.held, "session created");
    if new.sched.held {
        s.dispatch().nudge();
    } else {
        enqueue(s, &row.queue, std::slice::from_ref(&row.id)).await;
    }
    Ok(Created {
        session: SessionRef {
            id: row.id,
            status: SessionStatus::Queued,
        },
        created: true,
    })
}
