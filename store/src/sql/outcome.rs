//! The answers both stores give, built from what their statements found: the same
//! decisions (why a claim was refused, what a cancel did, whether a retried write had
//! committed already) whatever the dialect that found it.

use agentq_agent::schema::{Role, ToolCall};
use agentq_agent::state::SessionState;

use crate::error::{Error, Result};
use crate::model::{
    ApprovalRecorded, CancelResult, Claim, Delivered, Lease, NewSession, SessionRow, SessionStatus,
};
use crate::protocol::phase_name;
use crate::rowconv::to_u64;

use super::record::{PendingRow, SessionRecord, StoredMessage};

/// The phase a fresh session starts in, as its initial state decides it.
pub(crate) fn fresh_phase(new: &NewSession) -> &'static str {
    phase_name(SessionState::new(new.id.clone(), new.spec.clone()).phase)
}

/// The one answer of a batch of one creation.
pub(crate) fn only_created(
    new: &NewSession,
    mut out: Vec<(SessionRow, bool)>,
) -> Result<(SessionRow, bool)> {
    out.pop()
        .ok_or_else(|| Error::Conflict(format!("session {} was not created", new.id)))
}

/// An item that was not inserted and whose existing row was not found either.
pub(crate) fn unreadable_conflict(new: &NewSession) -> Error {
    Error::Conflict(format!(
        "session {} conflicts with an existing row that could not be read",
        new.id
    ))
}

/// Whether a finished session's settle steps are done: it has no row in `unannounced`.
pub(crate) const SETTLED: &str = "SELECT NOT EXISTS (SELECT 1 FROM unannounced WHERE id = $1)";

/// Why a claim matched nothing, from the row as it is now (`None`: no such session) and,
/// for a finished one, whether it is settled ([`SETTLED`]). A race with another claim
/// only changes which answer is right.
pub(crate) fn claim_refused(rec: Option<SessionRecord>, settled: bool) -> Result<Claim> {
    let Some(rec) = rec else {
        return Ok(Claim::NotFound);
    };
    Ok(match rec.status()? {
        s if s.is_terminal() && settled => Claim::Settled,
        s if s.is_terminal() => Claim::Terminal(Box::new(rec.into_row()?)),
        SessionStatus::Queued | SessionStatus::Running => Claim::Busy,
        s => Claim::NotRunnable(s),
    })
}

/// Whether a claimed row is past `max_attempts` claims without finishing: the caller
/// fails the session then (the claim itself stands).
pub(crate) fn exhausted(rec: &SessionRecord, max_attempts: u32) -> bool {
    i64::from(rec.attempts) > i64::from(max_attempts)
}

/// The answer for a claimed row past its attempts.
pub(crate) fn exhausted_claim(rec: SessionRecord) -> Result<Claim> {
    Ok(Claim::Exhausted(Box::new(rec.into_row()?)))
}

/// A claim that took the session, with its stored history.
pub(crate) fn acquired(
    rec: SessionRecord,
    owner: &str,
    messages: Vec<StoredMessage>,
) -> Result<Claim> {
    let state = rec.state(messages)?;
    let lease = rec.lease(owner);
    Ok(Claim::Acquired {
        lease,
        state: Box::new(state),
        row: Box::new(rec.into_row()?),
    })
}

/// The row a cancel changed: a running session got the flag, any other was cancelled.
pub(crate) fn cancel_changed(rec: SessionRecord) -> Result<CancelResult> {
    let row = rec.into_row()?;
    Ok(if row.status == SessionStatus::Running {
        CancelResult::Requested(Box::new(row))
    } else {
        CancelResult::CancelledNow(Box::new(row))
    })
}

/// A cancel that matched nothing: only a missing or terminal session (every other
/// status matches), unless the row changed status in between.
pub(crate) fn cancel_unchanged(id: &str, rec: Option<SessionRecord>) -> Result<CancelResult> {
    let Some(rec) = rec else {
        return Ok(CancelResult::NotFound);
    };
    let row = rec.into_row()?;
    if row.status.is_terminal() {
        return Ok(CancelResult::AlreadyFinished(Box::new(row)));
    }
    Err(Error::Conflict(format!(
        "session {id} changed status to {} during the cancel; retry",
        row.status
    )))
}

/// `(lease_epoch, lease_owner, status)` of a session, read after a fenced write matched
/// nothing.
pub(crate) type LeaseRow = (i64, Option<String>, String);

/// Did an earlier attempt of the same fenced write commit: the epoch is still ours, the
/// lease was given up, and the status is what that write sets? Makes a retry after an
/// ambiguous failure harmless for the writes that clear the owner.
pub(crate) fn gave_up(
    row: Option<LeaseRow>,
    lease: &Lease,
    want: fn(SessionStatus) -> bool,
) -> bool {
    match row {
        Some((epoch, None, status)) if epoch == lease.epoch => {
            SessionStatus::parse(&status).is_some_and(want)
        }
        _ => false,
    }
}

/// What a delivery did: `seq` is the new item's position (`None`: a repeat, nothing
/// inserted), `queued` whether the session's status is `queued` after it, `held` whether
/// it is held for the dispatcher after it.
pub(crate) fn delivered(
    queue: String,
    old: SessionStatus,
    seq: Option<i64>,
    queued: bool,
    held: bool,
) -> Result<Delivered> {
    let back = seq.is_some() && queued && old != SessionStatus::Queued;
    Ok(Delivered {
        inserted: seq.is_some(),
        seq: seq.map_or(Ok(0), |s| to_u64(s, "seq"))?,
        woken: back && !held,
        held: back && held,
        queue,
        status: old,
    })
}

/// What recording a decision did, given the status before it, whether the decision was
/// new, whether it sent the session back to the queue, and whether held for the
/// dispatcher.
pub(crate) fn approval_recorded(
    queue: String,
    old: SessionStatus,
    inserted: bool,
    woken: bool,
    held: bool,
) -> ApprovalRecorded {
    if old.is_terminal() {
        ApprovalRecorded::Finished(old)
    } else if !inserted {
        ApprovalRecorded::AlreadyDecided
    } else {
        ApprovalRecorded::Recorded {
            woken: woken && !held,
            held: woken && held,
            queue,
        }
    }
}

/// The held calls still waiting for a decision, from the latest response on and the
/// decisions recorded (see [`crate::InboxStore::pending_approvals`]).
pub(crate) fn pending_approvals(rows: Vec<PendingRow>, held: &[String]) -> Vec<ToolCall> {
    let mut messages = Vec::new();
    let mut decided = Vec::new();
    for (seq, body, call) in rows {
        match (seq, body, call) {
            (Some(seq), Some(body), _) => messages.push((seq, body.0)),
            (_, _, Some(call)) => decided.push(call.into_inner()),
            _ => {}
        }
    }
    messages.sort_by_key(|(seq, _)| *seq);
    let mut messages = messages.into_iter().map(|(_, m)| m);
    let Some(response) = messages.next().filter(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let mut answered = Vec::new();
    for m in messages {
        if m.role != Role::Tool {
            // The turn went on without these calls (a cancelled turn and a follow-up).
            return Vec::new();
        }
        answered.extend(m.tool_call_id);
    }
    response
        .tool_calls
        .into_iter()
        .filter(|c| held.contains(&c.id) && !answered.contains(&c.id) && !decided.contains(&c.id))
        .collect()
}

/// A retry that changed nothing: the session is missing, or not failed with an error.
pub(crate) fn not_retried(row: Option<SessionRow>) -> crate::store::RetryResult {
    match row {
        Some(row) => crate::store::RetryResult::NotRetryable(Box::new(row)),
        None => crate::store::RetryResult::NotFound,
    }
}

/// A row of the dispatcher's load: (queue, tenant, batch, running, buffered).
#[derive(sqlx::FromRow)]
pub(crate) struct LoadRow(String, String, Option<String>, i64, i64);

impl LoadRow {
    pub(crate) fn into_count(self) -> Result<crate::scheduling::ActiveCount> {
        Ok(crate::scheduling::ActiveCount {
            queue: self.0,
            tenant: self.1,
            batch_id: self.2,
            running: to_u64(self.3, "running")?,
            buffered: to_u64(self.4, "buffered")?,
        })
    }
}

/// A held session with its rank in its group.
#[derive(sqlx::FromRow)]
pub(crate) struct HeldRow {
    id: String,
    tenant: String,
    batch_id: Option<String>,
    priority: i32,
    batch_max_running: Option<i32>,
    r: i64,
}

impl HeldRow {
    pub(crate) fn into_candidate(self) -> Result<crate::scheduling::Candidate> {
        let bad = |what: &str, v: i64| {
            crate::rowconv::bad_data(format!("held session {}: {what} {v}", self.id))
        };
        let priority =
            u8::try_from(self.priority).map_err(|_| bad("priority", self.priority.into()))?;
        let rank = u32::try_from(self.r).map_err(|_| bad("rank", self.r))?;
        let batch_max_running = self
            .batch_max_running
            .map(|n| u32::try_from(n).map_err(|_| bad("batch_max_running", n.into())))
            .transpose()?;
        Ok(crate::scheduling::Candidate {
            id: self.id,
            tenant: self.tenant,
            batch_id: self.batch_id,
            priority,
            batch_max_running,
            rank,
        })
    }
}

/// `(root_id, id, lease_epoch, queue)` rows of sessions `owner` holds, as its leases
/// with their queue.
pub(crate) fn leases(
    owner: &str,
    rows: Vec<(String, String, i64, String)>,
) -> Vec<(Lease, String)> {
    rows.into_iter()
        .map(|(root_id, session_id, epoch, queue)| {
            let lease = Lease {
                session_id,
                root_id,
                owner: owner.to_string(),
                epoch,
            };
            (lease, queue)
        })
        .collect()
}
