//! The calls the caller's sessions hold for a decision, across sessions
//! (`GET /v1/approvals`): the tenant's sessions `awaiting_approval`, oldest first, read
//! through their partial index (`sessions_awaiting_approval_idx`), each one's held calls
//! in the order the model made them.
//!
//! A page reads sessions a chunk at a time and their held calls one session at a time
//! (one round trip each), so it reads at most [`MAX_SESSIONS_PER_PAGE`] sessions: a `tool`
//! that matches none of them ends the page early, with a cursor to go on from.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde_json::Value;

use agentq_api::{ApprovalItem, ApprovalList};
use agentq_core::auth::Caller;
use agentq_core::{ListFilter, SessionRow, SessionStatus};

use super::approvals::pending_approvals;
use crate::error::ApiError;
use crate::http::{ApiResult, MAX_ID_LEN, get_row};
use crate::state::Scheduler;

/// Sessions one page looks at, at most.
pub const MAX_SESSIONS_PER_PAGE: usize = 500;
/// Sessions read from the store at a time.
const CHUNK: u32 = 50;

/// What to list: every field narrows.
#[derive(Debug, Default, Clone)]
pub(crate) struct ApprovalQuery {
    pub queue: Option<String>,
    pub batch_id: Option<String>,
    /// The exact tool name.
    pub tool: Option<String>,
    /// One session of the caller's (another tenant's: 404).
    pub session_id: Option<String>,
    pub limit: usize,
    /// An opaque `next_cursor`.
    pub cursor: Option<String>,
}

/// Where a page goes on: after `call` of `session` (after the whole session when `call`
/// is `None`).
struct Cursor {
    session: String,
    call: Option<String>,
}

impl Cursor {
    fn encode(&self) -> String {
        let text = match &self.call {
            Some(call) => format!("{}\n{call}", self.session),
            None => self.session.clone(),
        };
        URL_SAFE_NO_PAD.encode(text)
    }

    fn decode(s: &str) -> ApiResult<Cursor> {
        let bad = || ApiError::invalid("cursor", "is not a cursor of this listing");
        if s.len() > 4 * MAX_ID_LEN {
            return Err(bad());
        }
        let bytes = URL_SAFE_NO_PAD.decode(s).map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let (session, call) = match text.split_once('\n') {
            Some((s, c)) => (s.to_string(), Some(c.to_string())),
            None => (text, None),
        };
        if session.is_empty() || session.len() > MAX_ID_LEN {
            return Err(bad());
        }
        Ok(Cursor { session, call })
    }
}

/// When the session stopped for the decision: its deadline less its timeout (the
/// deadline is set from the time it suspended), else its last update.
fn requested_at(row: &SessionRow) -> DateTime<Utc> {
    row.approval_deadline
        .and_then(|d| {
            let secs = i64::try_from(row.spec.approval_timeout_secs).ok()?;
            d.checked_sub_signed(chrono::TimeDelta::try_seconds(secs)?)
        })
        .unwrap_or(row.updated_at)
}

fn item(row: &SessionRow, call: agentq_api::PendingApproval) -> ApprovalItem {
    ApprovalItem {
        session_id: row.id.clone(),
        tool_call_id: call.tool_call_id,
        tool: call.tool,
        arguments: call.arguments,
        requested_at: requested_at(row),
        deadline: row.approval_deadline,
        queue: row.queue.clone(),
        batch_id: row.batch_id.clone(),
        metadata: match &row.spec.metadata {
            Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        },
    }
}

/// A page being filled.
struct Page {
    items: Vec<ApprovalItem>,
    limit: usize,
    next: Option<Cursor>,
}

impl Page {
    /// Add `row`'s held calls that `q` asks for, after `after` (a call id); sets the
    /// cursor when the page fills up.
    async fn take(
        &mut self,
        s: &Scheduler,
        q: &ApprovalQuery,
        row: &SessionRow,
        after: Option<&str>,
    ) -> ApiResult<()> {
        if row.status != SessionStatus::AwaitingApproval
            || q.queue.as_ref().is_some_and(|x| *x != row.queue)
            || q.batch_id.is_some() && q.batch_id != row.batch_id
        {
            return Ok(());
        }
        let mut calls = pending_approvals(s, row).await?;
        // A call decided meanwhile is not found: the whole session is still to come.
        if let Some(i) = after.and_then(|a| calls.iter().position(|c| c.tool_call_id == a)) {
            calls.drain(..=i);
        }
        for call in calls {
            if q.tool.as_ref().is_some_and(|t| *t != call.tool) {
                continue;
            }
            if self.items.len() >= self.limit {
                // A call the page has no room for: the next page starts before it.
                let last = self.items.last().map(|i| i.tool_call_id.clone());
                self.next = Some(Cursor {
                    session: self
                        .items
                        .last()
                        .map_or(row.id.clone(), |i| i.session_id.clone()),
                    call: last,
                });
                return Ok(());
            }
            self.items.push(item(row, call));
        }
        Ok(())
    }

    fn full(&self) -> bool {
        self.next.is_some()
    }
}

/// A page of the calls the caller's sessions hold.
pub(crate) async fn list_approvals(
    s: &Scheduler,
    caller: &Caller,
    q: &ApprovalQuery,
) -> ApiResult<ApprovalList> {
    let cursor = q.cursor.as_deref().map(Cursor::decode).transpose()?;
    let mut page = Page {
        items: Vec::new(),
        limit: q.limit,
        next: None,
    };
    if let Some(id) = &q.session_id {
        // Another tenant's session is a 404, as for its own approvals route.
        let row = get_row(s, caller, id).await?;
        let after = cursor.as_ref().and_then(|c| c.call.as_deref());
        page.take(s, q, &row, after).await?;
        return Ok(answer(page));
    }
    let mut filter = ListFilter {
        tenant: caller.tenant_filter(),
        status: Some(SessionStatus::AwaitingApproval),
        queue: q.queue.clone(),
        batch_id: q.batch_id.clone(),
        limit: CHUNK,
        oldest_first: true,
        ..Default::default()
    };
    if let Some(c) = cursor {
        // The rest of the session the previous page ended in, then those after it.
        if let Some(call) = &c.call
            && let Some(row) = s.store.get(&c.session).await?
            && caller.tenant_filter().is_none_or(|t| t == row.tenant)
        {
            page.take(s, q, &row, Some(call)).await?;
        }
        filter.cursor = Some(c.session);
    }
    let mut scanned = 0usize;
    while !page.full() {
        let rows = s.store.list(&filter).await?;
        let done = rows.len() < CHUNK as usize;
        for row in &rows {
            page.take(s, q, row, None).await?;
            if page.full() {
                break;
            }
            scanned = scanned.saturating_add(1);
            filter.cursor = Some(row.id.clone());
            if scanned >= MAX_SESSIONS_PER_PAGE {
                page.next = Some(Cursor {
                    session: row.id.clone(),
                    call: None,
                });
                break;
            }
        }
        if done {
            break;
        }
    }
    Ok(answer(page))
}

fn answer(page: Page) -> ApprovalList {
    ApprovalList {
        approvals: page.items,
        next_cursor: page.next.map(|c| c.encode()),
    }
}
