//! A batch as the API shows it (`GET /v1/batches/{id}`, `GET /v1/batches`): its row and
//! the tally of its sessions as a [`BatchView`], priced at the configured prices; its
//! results a page at a time (`GET /v1/batches/{id}/results`); and its cancel.

use std::collections::BTreeMap;

use chrono::Utc;
use futures::StreamExt;

use agentq_api::{BatchCounts, BatchList, BatchResult, BatchStatus, BatchView, ResultsEnd};
use agentq_core::auth::Caller;
use agentq_core::batch::{BatchRow, BatchTally, BatchTotals};
use agentq_core::{CancelResult, SessionStatus};

use crate::error::ApiError;
use crate::http::MAX_ID_LEN;
use crate::request::LIST_MAX_BYTES;
use crate::state::Scheduler;

/// Sessions cancelled at once per statement of a batch's cancel.
const CANCEL_CHUNK: u32 = 1_000;
/// Completions of cancelled sessions published at once.
const PUBLISH_AT_ONCE: usize = 32;
/// Sessions read per statement while a page of results is built.
const RESULTS_CHUNK: u32 = 256;

/// The batch `id` of the caller's tenant, else a 404 (another tenant's batch is answered
/// exactly as a missing one, so its ids cannot be probed).
pub(crate) async fn batch_of(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
) -> Result<BatchRow, ApiError> {
    let missing = || {
        ApiError::NotFound(format!(
            "batch {} not found",
            id.chars().take(MAX_ID_LEN).collect::<String>()
        ))
    };
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(missing());
    }
    s.store
        .batch(id)
        .await?
        .filter(|b| caller.sees(&b.tenant))
        .ok_or_else(missing)
}

/// The view of `row` from its sessions' `tallies`.
pub(crate) fn view(s: &Scheduler, row: BatchRow, tallies: &[BatchTally]) -> BatchView {
    let t = BatchTotals::of(tallies);
    let count = |status: SessionStatus| t.by_status.get(status.as_str()).copied().unwrap_or(0);
    let counts = BatchCounts {
        queued: count(SessionStatus::Queued),
        running: count(SessionStatus::Running),
        waiting: count(SessionStatus::Waiting),
        awaiting_approval: count(SessionStatus::AwaitingApproval),
        completed: count(SessionStatus::Completed),
        failed: count(SessionStatus::Failed),
        cancelled: count(SessionStatus::Cancelled),
    };
    let status = match (row.cancelled_at.is_some(), t.unfinished > 0) {
        (false, true) => BatchStatus::InProgress,
        (false, false) => BatchStatus::Completed,
        (true, true) => BatchStatus::Cancelling,
        (true, false) => BatchStatus::Cancelled,
    };
    let prices = &s.cfg.prices;
    let cost_usd = tallies
        .iter()
        .filter_map(|g| prices.cost_usd(g.model.as_deref().unwrap_or(""), &g.usage))
        .reduce(|a, b| a + b);
    BatchView {
        id: row.id,
        status,
        total: t.sessions,
        counts,
        finish_reasons: t
            .by_reason
            .iter()
            .map(|(r, n)| (r.to_string(), *n))
            .collect(),
        usage: t.usage,
        cost_usd,
        metadata: row.metadata,
        max_running: row.max_running,
        created_at: row.created_at,
        started_at: t.first_started,
        finished_at: t.finished_at(),
        cancelled_at: row.cancelled_at,
        eta_secs: t.eta_secs(Utc::now()),
    }
}

/// `row`'s view, its sessions tallied now.
pub(crate) async fn view_of(s: &Scheduler, row: BatchRow) -> Result<BatchView, ApiError> {
    let tallies = s.store.batch_tally(std::slice::from_ref(&row.id)).await?;
    Ok(view(s, row, &tallies))
}

/// A page of the caller's batches, newest first, tallied in one statement.
pub(crate) async fn list(
    s: &Scheduler,
    caller: &Caller,
    cursor: Option<&str>,
    limit: u32,
) -> Result<BatchList, ApiError> {
    let tenant = caller.tenant_filter();
    // One more than asked tells whether another page exists.
    let mut rows = s
        .store
        .list_batches(tenant.as_deref(), cursor, limit.saturating_add(1))
        .await?;
    let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let mut by_batch: BTreeMap<String, Vec<BatchTally>> = BTreeMap::new();
    for t in s.store.batch_tally(&ids).await? {
        by_batch.entry(t.batch_id.clone()).or_default().push(t);
    }
    let next_cursor = more.then(|| ids.last().cloned()).flatten();
    let batches = rows
        .into_iter()
        .map(|row| {
            let tallies = by_batch.remove(&row.id).unwrap_or_default();
            view(s, row, &tallies)
        })
        .collect();
    Ok(BatchList {
        batches,
        next_cursor,
    })
}

/// A page of results: the JSON Lines, the `after` of the next page, and why it ends.
pub(crate) struct ResultsPage {
    pub body: Vec<u8>,
    pub next: Option<String>,
    pub end: ResultsEnd,
}

/// The finished items of batch `id` in id order after `after`, up to the first that has
/// not finished, at most `limit` of them and [`LIST_MAX_BYTES`] of text (read
/// [`RESULTS_CHUNK`] sessions at a time, so a page costs a bounded amount of memory
/// whatever the batch).
pub(crate) async fn results(
    s: &Scheduler,
    id: &str,
    after: Option<String>,
    limit: u32,
) -> Result<ResultsPage, ApiError> {
    let mut body = Vec::new();
    let mut emitted: u32 = 0;
    let mut cursor = after.clone();
    let mut last: Option<String> = None;
    let end = 'page: loop {
        let want = limit.saturating_sub(emitted).min(RESULTS_CHUNK);
        // One more than wanted tells whether anything follows.
        let rows = s
            .store
            .batch_outcomes(id, cursor.as_deref(), want.saturating_add(1))
            .await?;
        let more_rows = rows.len() > usize::try_from(want).unwrap_or(usize::MAX);
        for o in rows
            .into_iter()
            .take(usize::try_from(want).unwrap_or(usize::MAX))
        {
            if !o.status.is_terminal() {
                break 'page ResultsEnd::Waiting;
            }
            let line = serde_json::to_vec(&BatchResult {
                custom_id: o.custom_id,
                id: o.id.clone(),
                status: o.status,
                finish_reason: o.finish_reason,
                result: o.result,
                error: o.error,
                usage: o.usage,
            })
            .map_err(|e| {
                tracing::error!(error = %e, "cannot encode a batch result");
                ApiError::Internal
            })?;
            if emitted > 0 && body.len().saturating_add(line.len()) > LIST_MAX_BYTES {
                break 'page ResultsEnd::More;
            }
            body.extend_from_slice(&line);
            body.push(b'\n');
            emitted = emitted.saturating_add(1);
            last = Some(o.id);
        }
        if !more_rows {
            break ResultsEnd::Complete;
        }
        if emitted >= limit {
            break ResultsEnd::More;
        }
        cursor = last.clone();
    };
    let next = match end {
        ResultsEnd::Complete => None,
        ResultsEnd::More | ResultsEnd::Waiting => last.or(after),
    };
    Ok(ResultsPage { body, next, end })
}

/// Cancel what of batch `row` has not finished: its never-started sessions at once, a
/// chunk per statement (their completions published), then each other unfinished one as
/// its own cancel does it (its worker asked to stop, its sub-agents cancelled). Whether a
/// worker was asked to stop one.
pub(crate) async fn cancel(s: &Scheduler, row: &BatchRow) -> Result<bool, ApiError> {
    let mut at_once = 0usize;
    loop {
        let rows = s.store.cancel_batch(&row.id, CANCEL_CHUNK).await?;
        if rows.is_empty() {
            break;
        }
        at_once = at_once.saturating_add(rows.len());
        futures::stream::iter(rows)
            .for_each_concurrent(PUBLISH_AT_ONCE, |r| async move {
                let done = CancelResult::CancelledNow(Box::new(r));
                s.announce_cancel(&done).await;
            })
            .await;
    }
    let unfinished =
        BatchTotals::of(&s.store.batch_tally(std::slice::from_ref(&row.id)).await?).unfinished;
    let (mut one_by_one, mut requested) = (0usize, false);
    if unfinished > 0 {
        let mut after: Option<String> = None;
        loop {
            let page = s
                .store
                .batch_outcomes(&row.id, after.as_deref(), CANCEL_CHUNK)
                .await?;
            let Some(last) = page.last() else {
                break;
            };
            after = Some(last.id.clone());
            for o in page.iter().filter(|o| !o.status.is_terminal()) {
                if let Some(asked) = cancel_one(s, &o.id).await? {
                    requested |= asked;
                    one_by_one = one_by_one.saturating_add(1);
                }
            }
        }
    }
    tracing::info!(
        batch_id = %row.id,
        cancelled_at_once = at_once,
        cancelled_one_by_one = one_by_one,
        "batch cancel"
    );
    Ok(requested)
}

/// Cancel session `id` as its own cancel does (its sub-agents too): `Some(true)` when its
/// worker was asked to stop it, `Some(false)` when it was cancelled at once, `None` when
/// it had finished meanwhile (or went).
async fn cancel_one(s: &Scheduler, id: &str) -> Result<Option<bool>, ApiError> {
    let result = s.store.request_cancel(id).await?;
    s.announce_cancel(&result).await;
    let (row, asked) = match result {
        CancelResult::CancelledNow(r) => (r, false),
        CancelResult::Requested(r) => (r, true),
        CancelResult::AlreadyFinished(_) | CancelResult::NotFound => return Ok(None),
    };
    s.cancel_descendants(&row.id).await;
    Ok(Some(asked))
}
