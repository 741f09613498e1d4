//! A running session's view of its inbox: background child results to inject, steering
//! messages to add at the next boundary, and human decisions on held tool calls. Reads
//! the store only when something may have arrived: at the start of the run when the
//! claimed row's `wake_seq` is past a cursor (every inbox item's position is the
//! `wake_seq` it set), and when a wake signal names the session. A session nobody writes
//! to costs no extra queries.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use agentq_agent::driver::{BackgroundResult, BackgroundSource};
use agentq_agent::event::{AgentEvent, EventSink};
use agentq_agent::guard::{ApprovalDecision, Approver};
use agentq_agent::schema::ToolCall;
use agentq_core::model::inbox_past;
use agentq_core::protocol::InboxKind;
use agentq_core::{ListFilter, SpawnInfo, Store};

use crate::workspace::TreeSync;

pub struct SessionInbox {
    store: Arc<dyn Store>,
    session_id: String,
    bg_cursor: AtomicU64,
    msg_cursor: AtomicU64,
    bg_dirty: AtomicBool,
    msg_dirty: AtomicBool,
    /// Background children whose result has not been injected yet.
    outstanding: AtomicUsize,
    approvals: Approvals,
    /// The tree's workspace, refreshed when a background child's result arrives: the
    /// child may have run on another machine, and its files must be here when the model
    /// reads its report.
    workspace: OnceLock<Arc<TreeSync>>,
}

/// What a run starts with for the calls it asks a human about.
pub struct Approvals {
    /// The row's: when an unanswered call counts as denied.
    pub deadline: Option<DateTime<Utc>>,
    /// Calls that were already held for approval when this run started: only they can
    /// have run out of time (a call held for the first time now gets a fresh deadline).
    pub held: Vec<String>,
    /// Where the decisions found are announced, and at which position: the history's
    /// length when the run started (the events of a run belong to no earlier one).
    pub events: Arc<dyn EventSink>,
    pub run_from: usize,
}

impl SessionInbox {
    pub fn new(
        store: Arc<dyn Store>,
        session_id: &str,
        bg_cursor: u64,
        msg_cursor: u64,
        wake_seq: i64,
        approvals: Approvals,
    ) -> Arc<Self> {
        Arc::new(SessionInbox {
            store,
            session_id: session_id.to_string(),
            bg_cursor: AtomicU64::new(bg_cursor),
            msg_cursor: AtomicU64::new(msg_cursor),
            bg_dirty: AtomicBool::new(inbox_past(wake_seq, bg_cursor)),
            msg_dirty: AtomicBool::new(inbox_past(wake_seq, msg_cursor)),
            outstanding: AtomicUsize::new(0),
            approvals,
            workspace: OnceLock::new(),
        })
    }

    /// Count the background children whose results were not delivered yet (for a
    /// session that can spawn).
    pub async fn load_outstanding(&self) -> agentq_core::Result<()> {
        let children = self
            .store
            .list(&ListFilter {
                parent_id: Some(self.session_id.clone()),
                limit: 10_000,
                ..Default::default()
            })
            .await?;
        let background = children
            .iter()
            .filter(|c| SpawnInfo::of(&c.spec).is_some_and(|i| !i.wait))
            .count();
        let delivered = self
            .store
            .inbox(&self.session_id, &[InboxKind::ChildResult], 0)
            .await?
            .iter()
            .filter(|i| i.seq <= self.bg_cursor.load(Ordering::SeqCst))
            .count();
        self.outstanding
            .store(background.saturating_sub(delivered), Ordering::SeqCst);
        Ok(())
    }

    /// The workspace to refresh when children's results arrive.
    pub fn set_workspace(&self, sync: Arc<TreeSync>) {
        let _ = self.workspace.set(sync);
    }

    /// A background child was started by this run.
    pub fn child_started(&self) {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
    }

    /// Something may have arrived: read the inbox at the next boundary.
    pub fn mark_dirty(&self) {
        self.bg_dirty.store(true, Ordering::SeqCst);
        self.msg_dirty.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl BackgroundSource for SessionInbox {
    async fn take(&self) -> Vec<BackgroundResult> {
        if !self.bg_dirty.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        let after = self.bg_cursor.load(Ordering::SeqCst);
        let items = match self
            .store
            .inbox(&self.session_id, &[InboxKind::ChildResult], after)
            .await
        {
            Ok(items) => items,
            Err(e) => {
                warn!(session_id = %self.session_id, error = %e, "reading the inbox failed");
                self.bg_dirty.store(true, Ordering::SeqCst);
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            self.bg_cursor.fetch_max(item.seq, Ordering::SeqCst);
            // A malformed item is skipped rather than retried forever: no writer of ours
            // produces one, and re-reading it would block every result behind it.
            let child = match item.child_outcome() {
                Ok(c) => c,
                Err(e) => {
                    warn!(session_id = %self.session_id, error = %e, "skipping an inbox item");
                    continue;
                }
            };
            out.push(BackgroundResult {
                result: child.text(),
                label: child.label,
                id: child.child_id,
                outcome: child.status.as_str().to_string(),
                seq: item.seq,
            });
        }
        let _ = self
            .outstanding
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(out.len()))
            });
        if !out.is_empty()
            && let Some(sync) = self.workspace.get()
            && let Err(e) = sync.refresh().await
        {
            // The results still go in: the files come with the next claim.
            warn!(session_id = %self.session_id, error = %e, "bringing in the sub-agents' files failed");
        }
        out
    }

    fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    async fn wait(&self, _cancel: &CancellationToken) -> bool {
        // A distributed session never waits holding its slot: it suspends, and the
        // child's completion re-enqueues it.
        false
    }

    async fn take_injections(&self) -> Vec<(u64, String)> {
        if !self.msg_dirty.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        let after = self.msg_cursor.load(Ordering::SeqCst);
        match self
            .store
            .inbox(&self.session_id, &[InboxKind::Message], after)
            .await
        {
            Ok(items) => items
                .into_iter()
                .filter_map(|i| {
                    self.msg_cursor.fetch_max(i.seq, Ordering::SeqCst);
                    match i.steer_message() {
                        Ok(m) => Some((i.seq, m.content)),
                        Err(e) => {
                            warn!(session_id = %self.session_id, error = %e, "skipping an inbox item");
                            None
                        }
                    }
                })
                .collect(),
            Err(e) => {
                warn!(session_id = %self.session_id, error = %e, "reading the inbox failed");
                self.msg_dirty.store(true, Ordering::SeqCst);
                Vec::new()
            }
        }
    }
}

#[async_trait]
impl Approver for SessionInbox {
    async fn approve(
        &self,
        session_id: &str,
        call: &ToolCall,
        _timeout: Duration,
    ) -> ApprovalDecision {
        let decision = match self.store.approval(session_id, &call.id).await {
            // Approved as the model made it, or with the arguments the call now carries
            // (put on it before the pipeline by `edited_arguments`).
            Ok(Some((true, _, None))) => ApprovalDecision::Approved,
            Ok(Some((true, _, Some(edited)))) => {
                if serde_json::from_str::<serde_json::Value>(&edited)
                    .is_ok_and(|v| call.arguments == v)
                {
                    ApprovalDecision::Approved
                } else {
                    // Never the model's arguments when a person approved others.
                    ApprovalDecision::Denied(
                        "the approval was given for other arguments than these".to_string(),
                    )
                }
            }
            Ok(Some((false, reason, _))) => ApprovalDecision::Denied(
                reason.unwrap_or_else(|| "a human denied this call".to_string()),
            ),
            Ok(None) => {
                if self.approvals.held.contains(&call.id)
                    && self.approvals.deadline.is_some_and(|d| d <= Utc::now())
                {
                    ApprovalDecision::TimedOut
                } else {
                    ApprovalDecision::Suspend
                }
            }
            // The store refuses this read for what it holds: no later wake can read it
            // either, and waiting would park the session for good.
            Err(e) if e.is_data() => {
                warn!(session_id, error = %e, "an approval cannot be read; denying the call");
                ApprovalDecision::Denied(format!("the approval could not be read: {e}"))
            }
            Err(e) => {
                warn!(session_id, error = %e, "reading an approval failed; waiting");
                ApprovalDecision::Suspend
            }
        };
        let (approved, reason) = match &decision {
            ApprovalDecision::Approved => (true, None),
            ApprovalDecision::Denied(r) => (false, Some(r.clone())),
            ApprovalDecision::TimedOut => (false, Some("timeout".to_string())),
            ApprovalDecision::Suspend => return decision,
        };
        self.approvals.events.emit(
            self.approvals.run_from,
            AgentEvent::ApprovalDecided {
                id: call.id.clone(),
                name: call.name.clone(),
                approved,
                reason,
            },
        );
        decision
    }

    async fn edited_arguments(
        &self,
        session_id: &str,
        call: &ToolCall,
    ) -> Result<Option<serde_json::Value>, String> {
        match self.store.approval(session_id, &call.id).await {
            Ok(Some((true, _, Some(edited)))) => serde_json::from_str(&edited)
                .map(Some)
                .map_err(|e| format!("the edited arguments cannot be read: {e}")),
            Ok(_) => Ok(None),
            // Without the edit the pipeline sees the model's arguments, and the approval
            // stage (which reads the decision again) holds the call to the edit.
            Err(e) => {
                warn!(session_id, error = %e, "reading an approval's arguments failed");
                Ok(None)
            }
        }
    }
}
