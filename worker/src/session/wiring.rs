//! A claimed session's run, wired up before its agent is built: the collaborators it talks
//! through ([`Wiring`]: metrics observer, event sink, inbox, interrupter, and the tokens
//! that stop it), and its registration among the runs of this worker, which the
//! heartbeat, the signal listener and the drain find it by.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::warn;

use agentq_agent::driver::Interrupter;
use agentq_agent::state::SessionState;
use agentq_agent::tools::LocalWorkspace;
use agentq_core::queue::Delivery;
use agentq_core::{Lease, SessionRow};

use super::agent::AgentParts;
use crate::checkpoint::StoreCheckpointer;
use crate::inbox::{Approvals, SessionInbox};
use crate::inner::Inner;
use crate::observe::{SessionObserver, StreamSink, died_mid_llm_call};
use crate::runs::Active;
use crate::spawn;
use crate::workspace::TreeSync;

/// What one run talks through besides the store and its checkpointer.
pub(super) struct Wiring {
    pub(super) observer: Arc<SessionObserver>,
    /// The user asked to cancel: the run ends `interrupted`.
    pub(super) cancel: CancellationToken,
    /// The lease is gone: the run is dropped without writing anything.
    pub(super) abort: CancellationToken,
    pub(super) sink: Arc<StreamSink>,
    pub(super) inbox: Arc<SessionInbox>,
    pub(super) interrupter: Arc<Interrupter>,
    /// Set once the run returned and its entry is being settled.
    pub(super) settling: Arc<AtomicBool>,
}

impl Wiring {
    /// The collaborators of the run of `row` claimed with `lease`, its state as loaded.
    pub(super) async fn new(
        inner: &Arc<Inner>,
        d: &Delivery,
        lease: &Lease,
        state: &SessionState,
        row: &SessionRow,
        resumed: bool,
    ) -> Self {
        let observer = observer_for(inner, d, state, lease, resumed).await;
        let cancel = CancellationToken::new();
        if row.cancel_requested {
            cancel.cancel();
        }
        let abort = CancellationToken::new();
        let sink = Arc::new(StreamSink {
            session_id: d.session_id.clone(),
            epoch: lease.epoch,
            tx: inner.pipeline.events.clone(),
        });
        let inbox = SessionInbox::new(
            inner.store.clone(),
            &d.session_id,
            state.bg_cursor,
            state.msg_cursor,
            row.wake_seq,
            Approvals {
                deadline: row.approval_deadline,
                held: state.not_started.clone(),
                events: sink.clone(),
                run_from: state.messages.len(),
            },
        );
        let can_spawn = row
            .spec
            .tools
            .as_ref()
            .is_some_and(|t| t.iter().any(|n| n == spawn::NAME));
        if can_spawn && let Err(e) = inbox.load_outstanding().await {
            warn!(error = %e, "counting background children failed; the first drain re-reads them");
        }
        Wiring {
            observer,
            cancel,
            abort,
            sink,
            inbox,
            interrupter: Interrupter::new(),
            settling: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Make the run reachable by signals and the heartbeat. It is forgotten when the
    /// returned guard drops, so that a run that returns or unwinds never stays registered,
    /// heartbeating a lease nobody uses.
    pub(super) fn register<'a>(
        &self,
        inner: &'a Arc<Inner>,
        d: &'a Delivery,
        lease: &Lease,
        claimed_at: Instant,
    ) -> Registered<'a> {
        let woken_meanwhile = inner.runs.register(
            &d.session_id,
            Active {
                lease: lease.clone(),
                entry_id: d.entry_id.clone(),
                cancel: self.cancel.clone(),
                abort: self.abort.clone(),
                inbox: self.inbox.clone(),
                interrupter: self.interrupter.clone(),
                settling: self.settling.clone(),
            },
            claimed_at,
        );
        let registered = Registered(inner, &d.session_id);
        if woken_meanwhile {
            self.inbox.mark_dirty();
        }
        registered
    }

    /// The run's checkpointer, fenced by `lease`, committing the workspace's changes
    /// through `sync` (which the inbox refreshes when children's results arrive).
    pub(super) fn checkpointer(
        &self,
        inner: &Inner,
        lease: &Lease,
        sync: Option<Arc<TreeSync>>,
        model_used: Option<String>,
    ) -> Arc<StoreCheckpointer> {
        let mut checkpointer = StoreCheckpointer::new(
            inner.pipeline.commits.clone(),
            lease.clone(),
            inner.draining.clone(),
            inner.cfg.lease_ttl.saturating_mul(10),
            inner.metrics,
        );
        if let Some(sync) = &sync {
            self.inbox.set_workspace(sync.clone());
        }
        checkpointer.workspace = sync;
        checkpointer.model_used = model_used;
        Arc::new(checkpointer)
    }

    /// What the agent is built from besides the spec.
    pub(super) fn agent_parts(
        &self,
        checkpointer: Arc<StoreCheckpointer>,
        workspace: LocalWorkspace,
    ) -> AgentParts {
        AgentParts {
            checkpointer,
            observer: self.observer.clone(),
            sink: self.sink.clone(),
            inbox: self.inbox.clone(),
            interrupter: self.interrupter.clone(),
            workspace,
        }
    }

    /// The run returned: its entry is being settled. It stays "active" until then, so a
    /// duplicate entry delivered to this worker meanwhile does not start a second run (the
    /// same owner may re-claim), but its lease may be gone by design: no heartbeat.
    pub(super) fn settling(&self) {
        self.settling.store(true, Ordering::SeqCst);
    }
}

/// A claimed session's run, as what it came to is recorded.
#[derive(Clone, Copy)]
pub(super) struct Claimed<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) d: &'a Delivery,
    pub(super) lease: &'a Lease,
    /// The row as claimed.
    pub(super) row: &'a SessionRow,
    pub(super) sink: &'a StreamSink,
    /// Whether the claim acked the session's queue entry (settling then leaves it).
    pub(super) acked: bool,
}

/// Removes the session from the worker's active set when the run is fully settled.
pub(super) struct Registered<'a>(&'a Arc<Inner>, &'a str);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.runs.finish(self.1);
    }
}

/// The run's metrics; a resumed run whose predecessor died during an LLM call counts the
/// call it issues again.
async fn observer_for(
    inner: &Arc<Inner>,
    d: &Delivery,
    state: &SessionState,
    lease: &Lease,
    resumed: bool,
) -> Arc<SessionObserver> {
    let observer = Arc::new(SessionObserver {
        metrics: inner.metrics,
        queue: d.queue.clone(),
        reissue_pending: AtomicBool::new(false),
    });
    if resumed
        && state.outcome.is_none()
        && state.pending_calls().is_empty()
        && died_mid_llm_call(
            inner.queue.as_ref(),
            &d.session_id,
            state.messages.len(),
            lease.epoch,
        )
        .await
    {
        observer.reissue_pending.store(true, Ordering::SeqCst);
    }
    observer
}
