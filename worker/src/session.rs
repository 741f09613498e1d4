//! One delivery, start to end: claim the session, run it, and settle the entry — publish
//! and ack a finished session, hand back a drained one, dead-letter a poisonous one, and
//! leave alone what another worker owns.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

use agentq_agent::driver::{Agent, Interrupter, Receipt, RunEnd, SuspendReason};
use agentq_agent::guard::{Firewall, Guards, Permissions};
use agentq_agent::provider::factory;
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::{Outcome, SessionState};
use agentq_agent::tools::{LocalWorkspace, builtin_registry};
use agentq_agent::{CheckpointFailure, bounds};
use agentq_core::lifecycle;
use agentq_core::policy::{Sent, SpawnContext};
use agentq_core::queue::Delivery;
use agentq_core::{Claim, Completion, Lease, SessionRow, SessionStatus, WaitReason};

use crate::checkpoint::StoreCheckpointer;
use crate::inbox::{Approvals, SessionInbox};
use crate::observe::{SessionObserver, StreamSink, died_mid_llm_call};
use crate::runs::Active;
use crate::spawn::{self, SpawnAgent};
use crate::workspace::TreeSync;
use crate::{Backoff, Inner, Result};

/// What processing one delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed {
    /// The session is terminal (it finished now, or in an earlier run): its parent was
    /// told, its completion published and its entry acknowledged — unless `acked` is
    /// false, when a step failed and the entry stays for a redelivery to settle it.
    Finished { acked: bool },
    /// The run gave the session up to wait (for children, an approval, a message); the
    /// entry is acknowledged and whatever it waits for enqueues it again.
    Suspended,
    /// Stopped at a checkpoint for shutdown: the lease was released, the session put back
    /// on the queue and the entry acknowledged.
    HandedBack,
    /// Another worker took the lease: the run stopped without writing anything more.
    LeaseLost,
    /// Another worker's live lease: the entry is left for that worker (or the reclaimer).
    Busy,
    /// Not runnable now, or unknown: the entry was dropped.
    Dropped,
    /// Delivered too many times without finishing: failed, and moved to the dead-letter
    /// stream.
    DeadLettered,
    /// Another entry of a session running here: it runs once that run has ended.
    Deferred,
    /// This very entry is being processed here already.
    AlreadyRunning,
    /// The store or the queue failed after the claim: the entry stays pending, the lease
    /// expires, and a redelivery resumes from the last checkpoint.
    Left,
}

/// One delivery, to its end. A panic anywhere in it (the loop, a tool, a provider, this
/// worker's own code) fails that session with the panic's message: the task survives, the
/// lease and the slot are given back and the heartbeat forgets the run, so the session
/// never stays `running` with nobody running it.
pub(crate) async fn handle(inner: Arc<Inner>, d: Delivery) -> Result<Processed> {
    let span = info_span!("session", session_id = %d.session_id, queue = %d.queue);
    let handled = AssertUnwindSafe(handle_inner(inner.clone(), d.clone()))
        .catch_unwind()
        .instrument(span.clone())
        .await;
    let panic = match handled {
        Ok(processed) => return processed,
        Err(panic) => panic,
    };
    // Settling may be what panicked: a second panic leaves the entry pending and the
    // lease to expire (the run is forgotten already), and the task still survives.
    let settled = AssertUnwindSafe(after_panic(&inner, &d, panic_message(panic.as_ref())))
        .catch_unwind()
        .instrument(span)
        .await;
    Ok(settled.unwrap_or_else(|again| {
        error!(panic = %panic_message(again.as_ref()), "failing a panicked session panicked too; leaving its entry");
        inner.runs.finish(&d.session_id);
        Processed::Left
    }))
}

/// What a panic said, bounded (it becomes the session's error).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    const MAX_CHARS: usize = 2_000;
    let text = if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    };
    match text.char_indices().nth(MAX_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

/// A panic outside the run's own loop (claiming, building, settling): the run is
/// forgotten here and the session failed with the message, unless another worker holds
/// its lease by now; its family is told and the entry acknowledged like any finish.
async fn after_panic(inner: &Arc<Inner>, d: &Delivery, message: String) -> Processed {
    let reason = format!("the worker panicked while handling this session: {message}");
    error!(%reason, "failing the session");
    inner.runs.finish(&d.session_id);
    match inner.store.get(&d.session_id).await {
        Ok(Some(row))
            if row
                .lease_owner
                .as_deref()
                .is_some_and(|owner| owner != inner.cfg.consumer) =>
        {
            warn!("another worker holds the session now; leaving it to that one");
            return Processed::Left;
        }
        Ok(None) => {
            ack(inner, d).await;
            return Processed::Dropped;
        }
        Ok(Some(_)) => {}
        Err(e) => {
            warn!(error = %e, "reading the session after a panic failed; the lease expires instead");
            return Processed::Left;
        }
    }
    fail_and_settle(inner, d, &reason).await
}

/// Fail the session with `reason` outside any checkpoint (the state may be what cannot be
/// stored, or unknown after a panic), then settle it like any finished session. If the
/// store cannot be reached the entry is left: the lease expires and a redelivery decides.
async fn fail_and_settle(inner: &Arc<Inner>, d: &Delivery, reason: &str) -> Processed {
    let failed = match inner.store.fail(&d.session_id, reason).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            ack(inner, d).await;
            return Processed::Dropped;
        }
        Err(e) => {
            warn!(error = %e, "failing the session failed; the lease expires instead");
            return Processed::Left;
        }
    };
    inner
        .metrics
        .sessions_finished
        .with_label_values(&[d.queue.as_str(), "error"])
        .inc();
    Processed::Finished {
        acked: settle_finished(inner, d, &failed).await,
    }
}

async fn handle_inner(inner: Arc<Inner>, d: Delivery) -> Result<Processed> {
    let claimed_at = Instant::now();
    let claim = inner
        .store
        .claim(
            &d.session_id,
            &inner.cfg.consumer,
            inner.cfg.lease_ttl,
            inner.cfg.max_attempts,
        )
        .await;
    let claim = match claim {
        Ok(c) => c,
        Err(e) => {
            // The entry stays pending; the reclaimer hands it out again later.
            warn!(error = %e, "claim failed; leaving the entry for a retry");
            return Err(e.into());
        }
    };
    Ok(match claim {
        Claim::Acquired { lease, state, row } => {
            run(inner, d, lease, *state, *row, claimed_at).await
        }
        Claim::Terminal(row) => {
            // Finished already (its completion may not have gone out, nor its parent been
            // told): settle again — every step is idempotent — never run again.
            Processed::Finished {
                acked: settle_finished(&inner, &d, &row).await,
            }
        }
        Claim::Busy => {
            // Another worker's live lease: leave the entry; if that worker dies, the
            // reclaimer brings it back and the lease will have expired.
            Processed::Busy
        }
        Claim::NotRunnable(status) => {
            info!(%status, "session is not runnable now; dropping the entry");
            ack(&inner, &d).await;
            Processed::Dropped
        }
        Claim::NotFound => {
            warn!("entry for an unknown session; dropping it");
            ack(&inner, &d).await;
            Processed::Dropped
        }
        Claim::Exhausted(row) => {
            let reason = format!(
                "delivered {} times without finishing (each run died); moved to the dead-letter stream",
                row.attempts
            );
            error!(%reason, "dead-lettering session");
            let failed = match inner.store.fail(&d.session_id, &reason).await {
                Ok(Some(r)) => r,
                Ok(None) => {
                    ack(&inner, &d).await;
                    return Ok(Processed::Dropped);
                }
                Err(e) => {
                    warn!(error = %e, "failing an exhausted session failed; will retry");
                    return Ok(Processed::Left);
                }
            };
            if let Err(e) = inner.queue.dead_letter(&d, &reason).await {
                warn!(error = %e, "dead-lettering failed; will retry");
                return Ok(Processed::Left);
            }
            inner.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
            inner.metrics.dead_letter.inc();
            inner
                .metrics
                .sessions_finished
                .with_label_values(&[d.queue.as_str(), "error"])
                .inc();
            tell_family(&inner, &failed).await;
            publish(&inner, &failed).await;
            Processed::DeadLettered
        }
    })
}

async fn run(
    inner: Arc<Inner>,
    d: Delivery,
    lease: Lease,
    mut state: SessionState,
    row: SessionRow,
    claimed_at: Instant,
) -> Processed {
    // A later claim of the session (its first run may have died before checkpointing
    // anything, so `started_at` alone would miss it).
    let resumed = state.started_at.is_some() || lease.epoch > 1;
    if resumed {
        inner.stats.resumed.fetch_add(1, Ordering::Relaxed);
    }
    let m = inner.metrics;
    m.sessions_started
        .with_label_values(&[d.queue.as_str()])
        .inc();
    let observer = observer_for(&inner, &d, &state, &lease, resumed).await;
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
    let interrupter = Interrupter::new();
    let settling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let woken_meanwhile = inner.runs.register(
        &d.session_id,
        Active {
            lease: lease.clone(),
            queue: d.queue.clone(),
            entry_id: d.entry_id.clone(),
            cancel: cancel.clone(),
            abort: abort.clone(),
            inbox: inbox.clone(),
            interrupter: interrupter.clone(),
            settling: settling.clone(),
        },
        claimed_at,
    );
    // From here on the run is forgotten when this returns or unwinds: a panic must not
    // leave it registered, heartbeating a lease nobody uses.
    let _registered = ActiveGuard(&inner, &d.session_id);
    if woken_meanwhile {
        inbox.mark_dirty();
    }
    // Reset the entry's idle time now: a long claim must not look like a dead worker.
    let _ = inner
        .queue
        .touch(
            &d.queue,
            &inner.cfg.consumer,
            std::slice::from_ref(&d.entry_id),
        )
        .await;

    // The tree's files as of its last commit, before anything runs.
    let (sync, workspace) = match open_workspace(&inner, &row).await {
        Ok(opened) => opened,
        Err(WorkspaceOpen::Unavailable(e)) => {
            warn!(error = %e, "the workspace cannot be restored now; handing the session back");
            return if hand_back(&inner, &d, &lease).await {
                Processed::HandedBack
            } else {
                Processed::Left
            };
        }
        Err(WorkspaceOpen::Failed(e)) => (None, Err(e)),
    };
    let mut checkpointer = StoreCheckpointer::new(
        inner.pipeline.commits.clone(),
        lease.clone(),
        inner.draining.clone(),
        inner.cfg.lease_ttl.saturating_mul(10),
        m,
    );
    if let Some(sync) = &sync {
        inbox.set_workspace(sync.clone());
    }
    checkpointer.workspace = sync;
    let checkpointer = Arc::new(checkpointer);
    m.sessions_active.inc();
    let committed = checkpointer.clone();
    let built = admit(&inner, &row, &mut state.spec).and_then(|()| {
        let parts = AgentParts {
            checkpointer,
            observer,
            sink: sink.clone(),
            inbox,
            interrupter,
            workspace: workspace?,
        };
        build_agent(&inner, &row, &state.spec, parts)
    });
    let loaded = state.messages.len();
    let result = match built {
        Ok(agent) => {
            let running = AssertUnwindSafe(agent.run_with_receipt(&mut state, &cancel));
            let ran = tokio::select! {
                r = running.catch_unwind() => Some(r),
                _ = abort.cancelled() => None,
            };
            match ran {
                None => None,
                Some(Ok(r)) => Some(r),
                Some(Err(panic)) => {
                    let message = panic_message(panic.as_ref());
                    Some(fail_panicked(&mut state, &committed, loaded, message).await)
                }
            }
        }
        Err(message) => {
            // A session that cannot be built (unknown tool, bad provider) or that its
            // tenant's policy does not allow fails at once, before any LLM call or tool,
            // with the reason, through a normal fenced checkpoint (the run's own
            // checkpointer: a draining worker still writes a step with an outcome).
            state.outcome = Some(Outcome::error(message));
            use agentq_agent::driver::Checkpointer;
            let from = state.messages.len();
            Some(committed.save(&state, from).await.map(|receipt| {
                let outcome = state.outcome.clone().unwrap_or_else(|| Outcome::error(""));
                (RunEnd::Finished(outcome), receipt)
            }))
        }
    };
    // Stays "active" until its entry is settled below: a duplicate entry delivered to this
    // worker meanwhile must not start a second run (the same owner may re-claim).
    settling.store(true, Ordering::SeqCst);
    m.sessions_active.dec();
    match result {
        None => {
            inner.stats.lost_leases.fetch_add(1, Ordering::Relaxed);
            m.lease_lost.inc();
            warn!("run aborted: lease lost");
            Processed::LeaseLost
        }
        Some(Ok((RunEnd::Finished(outcome), receipt))) => {
            finished(&inner, &d, &state, &outcome, receipt).await
        }
        Some(Ok((RunEnd::Suspended(reason), _))) => {
            suspend(&inner, &d, &lease, &row, &state, sink.as_ref(), reason).await
        }
        Some(Err(agentq_agent::Error::LeaseLost)) => {
            inner.stats.lost_leases.fetch_add(1, Ordering::Relaxed);
            m.lease_lost.inc();
            warn!(
                "lease lost at a checkpoint: another worker owns the session; stopping without writes"
            );
            Processed::LeaseLost
        }
        Some(Err(agentq_agent::Error::Stopped)) => {
            info!("stopped at a checkpoint for shutdown; handing the session back");
            if hand_back(&inner, &d, &lease).await {
                Processed::HandedBack
            } else {
                Processed::Left
            }
        }
        Some(Err(agentq_agent::Error::Checkpoint(CheckpointFailure::Refused {
            reason,
            durable,
        }))) => fail_refused(&inner, &d, &reason, durable).await,
        Some(Err(e)) => {
            // The store stayed unreachable: leave everything; the lease expires and the
            // reclaimer resumes the session from its last checkpoint.
            error!(error = %e, "run stopped: checkpoint failed");
            Processed::Left
        }
    }
}

/// The store refused a checkpoint for what it holds (or no row could hold the state): a
/// redelivery would replay the same step into the same refusal, so the session fails now,
/// with the reason, and its lease is given up. Its stored history stays as the last
/// checkpoint left it (the refused step is not in it). Not through a checkpoint: the
/// state that could not be stored may be what is wrong.
async fn fail_refused(
    inner: &Arc<Inner>,
    d: &Delivery,
    refused: &str,
    durable: usize,
) -> Processed {
    let reason = format!("a checkpoint could not be stored: {refused}");
    error!(%reason, durable, "failing the session");
    fail_and_settle(inner, d, &reason).await
}

/// The run panicked (in the loop, a tool or a provider): the session fails with the
/// panic's message through a normal fenced final checkpoint, which gives the lease up, and
/// is then settled like any finished session. The messages the run had not committed are
/// written with it (each is whole: a panic cannot leave half a message), so the stored
/// history stays contiguous for a later turn.
async fn fail_panicked(
    state: &mut SessionState,
    committed: &StoreCheckpointer,
    loaded: usize,
    message: String,
) -> agentq_agent::Result<(RunEnd, Receipt)> {
    use agentq_agent::driver::Checkpointer;
    let error = format!("the run panicked: {message}");
    error!(%error, "session failed");
    let from = committed.committed_len().unwrap_or(loaded);
    let outcome = Outcome::error(error);
    state.outcome = Some(outcome.clone());
    committed
        .save(state, from.min(state.messages.len()))
        .await
        .map(|receipt| (RunEnd::Finished(outcome), receipt))
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
        reissue_pending: std::sync::atomic::AtomicBool::new(false),
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

/// The run finished the session: count it, let its event stream expire, and settle it
/// with the row its final checkpoint returned (the run's receipt), or read back.
async fn finished(
    inner: &Arc<Inner>,
    d: &Delivery,
    state: &SessionState,
    outcome: &Outcome,
    receipt: Receipt,
) -> Processed {
    let m = inner.metrics;
    info!(finish_reason = %outcome.reason, iterations = state.iteration, "session finished");
    inner.stats.completed.fetch_add(1, Ordering::Relaxed);
    m.sessions_finished
        .with_label_values(&[d.queue.as_str(), outcome.reason.as_str()])
        .inc();
    m.session_iterations.observe(f64::from(state.iteration));
    m.session_tokens.observe(state.usage.total() as f64);
    if let Err(e) = inner
        .queue
        .expire_events(&d.session_id, inner.cfg.event_ttl)
        .await
    {
        warn!(error = %e, "setting the event stream's expiry failed");
    }
    let row = match StoreCheckpointer::finished_row(receipt) {
        Some(row) => Some(row),
        None => get_row(inner, &d.session_id).await,
    };
    let acked = match row {
        Some(row) => settle_finished(inner, d, &row).await,
        None => {
            warn!("finished, but its row could not be read; the entry will be redelivered");
            false
        }
    };
    Processed::Finished { acked }
}

/// Removes the session from the worker's active set when the run is fully settled.
struct ActiveGuard<'a>(&'a Arc<Inner>, &'a str);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        self.0.runs.finish(self.1);
    }
}

/// What a run's agent is made of besides the session's spec.
struct AgentParts {
    checkpointer: Arc<StoreCheckpointer>,
    observer: Arc<SessionObserver>,
    sink: Arc<StreamSink>,
    inbox: Arc<SessionInbox>,
    interrupter: Arc<Interrupter>,
    workspace: LocalWorkspace,
}

/// Why a claimed session's workspace could not be opened.
enum WorkspaceOpen {
    /// The store stayed unreachable: the session is handed back and runs later.
    Unavailable(String),
    /// It never will be (the local directory cannot be used, stored content is gone):
    /// the session fails with the reason.
    Failed(String),
}

/// Outages of the store while restoring a workspace are ridden out this long.
const WORKSPACE_RETRY_FOR: Duration = Duration::from_secs(30);

/// The tree's workspace for a run here: its directory made to match the committed
/// manifest (see [`crate::workspace`]), and the sync that commits its changes.
async fn open_workspace(
    inner: &Arc<Inner>,
    row: &SessionRow,
) -> Result<(Option<Arc<TreeSync>>, Result<LocalWorkspace, String>), WorkspaceOpen> {
    let workspaces = inner.workspaces().map_err(WorkspaceOpen::Failed)?;
    let started = Instant::now();
    let mut backoff = Backoff::new();
    loop {
        match TreeSync::open(
            inner.store.clone(),
            workspaces,
            &row.root_id,
            inner.cfg.tool_settings.max_file_bytes,
            row.has_workspace,
        )
        .await
        {
            Ok((sync, ws)) => return Ok((Some(Arc::new(sync)), Ok(ws))),
            Err(e) if e.is_retryable() && started.elapsed() < WORKSPACE_RETRY_FOR => {
                let wait = backoff.next();
                warn!(error = %e, ?wait, "restoring the workspace failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) if e.is_retryable() => return Err(WorkspaceOpen::Unavailable(e.to_string())),
            Err(e) => return Err(WorkspaceOpen::Failed(format!("workspace: {e}"))),
        }
    }
}

/// The run gave its session up to wait (children, an approval): record that, fenced, and
/// drop the entry — whatever it waits for puts it back on the queue.
async fn suspend(
    inner: &Arc<Inner>,
    d: &Delivery,
    lease: &Lease,
    row: &SessionRow,
    state: &SessionState,
    sink: &StreamSink,
    reason: SuspendReason,
) -> Processed {
    let wait = wait_reason(&reason);
    let suspended = match reason {
        SuspendReason::Children => {
            inner
                .store
                .suspend_for(lease, row.wake_seq, wait, None)
                .await
        }
        // Its own status (`awaiting_approval`, with the decision's deadline), which the
        // store records as waiting for an approval. Clamped: the spec may hold any number
        // (a row written before the API bounded it).
        SuspendReason::Approval { .. } => {
            let deadline = bounds::after(chrono::Utc::now(), state.spec.approval_timeout_secs);
            inner
                .store
                .suspend(
                    lease,
                    SessionStatus::AwaitingApproval,
                    row.wake_seq,
                    Some(deadline),
                )
                .await
        }
        // No lease and no slot until the sweeper wakes it at `until`.
        SuspendReason::RateLimit { until } => {
            info!(wake_at = %until, "suspending for a rate limit");
            sink.waiting(state.messages.len(), wait, Some(until));
            inner
                .store
                .suspend_for(lease, row.wake_seq, wait, Some(until))
                .await
        }
        // Parked until the budget is raised (`SweepStore::wake_budget_waiters`), or until
        // its period turns over (the sweeper wakes it then).
        SuspendReason::Budget { message } => {
            info!(budget = %message, "parking for a spent budget");
            let wake_at = crate::budget::park_until(inner, &row.tenant).await;
            sink.waiting(state.messages.len(), wait, wake_at);
            inner
                .store
                .suspend_for(lease, row.wake_seq, wait, wake_at)
                .await
        }
    };
    match suspended {
        Ok(now) => {
            info!(status = %now.status, "session suspended");
            if matches!(
                now.status,
                SessionStatus::Waiting | SessionStatus::AwaitingApproval
            ) {
                inner
                    .metrics
                    .sessions_suspended
                    .with_label_values(&[wait.as_str()])
                    .inc();
            }
            match now.status {
                SessionStatus::Queued => {
                    // Woken while it was suspending: straight back on the queue.
                    lifecycle::enqueue_woken(
                        inner.store.as_ref(),
                        inner.queue.as_ref(),
                        &now.id,
                        &now.queue,
                    )
                    .await;
                }
                s if s.is_terminal() => {
                    tell_family(inner, &now).await;
                    if !publish(inner, &now).await {
                        return Processed::Finished { acked: false };
                    }
                    return Processed::Finished {
                        acked: ack(inner, d).await,
                    };
                }
                _ => {}
            }
            ack(inner, d).await;
            Processed::Suspended
        }
        Err(agentq_core::Error::LeaseLost(_)) => {
            inner.stats.lost_leases.fetch_add(1, Ordering::Relaxed);
            inner.metrics.lease_lost.inc();
            warn!("lease lost while suspending: another worker owns the session");
            Processed::LeaseLost
        }
        Err(e) => {
            // The entry stays; the lease expires and another claim resumes (and, with
            // nothing new, suspends again).
            warn!(error = %e, "suspending failed");
            Processed::Left
        }
    }
}

/// What the store, the event stream and the metrics call the wait a run suspended for:
/// the one place an agent's [`SuspendReason`] becomes core's [`WaitReason`], which stays
/// typed up to the store's column, the event's wire name and the metric's label.
fn wait_reason(reason: &SuspendReason) -> WaitReason {
    match reason {
        SuspendReason::Children => WaitReason::Children,
        SuspendReason::Approval { .. } => WaitReason::Approval,
        SuspendReason::RateLimit { .. } => WaitReason::RateLimit,
        SuspendReason::Budget { .. } => WaitReason::Budget,
    }
}

/// A session reached a terminal status: its parent learns (idempotently), a failed or
/// cancelled one leaves no child running.
async fn tell_family(inner: &Arc<Inner>, row: &SessionRow) {
    if let Err(e) = lifecycle::notify_parent(inner.store.as_ref(), inner.queue.as_ref(), row).await
    {
        warn!(error = %e, "notifying the parent failed; a redelivery retries");
    }
    if matches!(row.status, SessionStatus::Failed | SessionStatus::Cancelled) {
        lifecycle::cancel_descendants(inner.store.as_ref(), inner.queue.as_ref(), &row.id).await;
    }
}

/// Everything after a terminal commit, in an order that survives a crash at any point
/// (each step is idempotent and the entry is acked last): parent, children, follow-up
/// turn, completion, ack. Whether the entry was acked.
async fn settle_finished(inner: &Arc<Inner>, d: &Delivery, row: &SessionRow) -> bool {
    tell_family(inner, row).await;
    match lifecycle::start_next_followup(inner.store.as_ref(), inner.queue.as_ref(), row).await {
        Ok(true) => info!("started an enqueued follow-up turn"),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "starting a follow-up turn failed; a redelivery retries"),
    }
    publish_and_ack(inner, d, row).await
}

/// The tenant whose policy a session runs under.
pub(crate) fn tenant(row: &SessionRow) -> &str {
    &row.tenant
}

/// The stored spec under its tenant's policy, checked again here because the row may have
/// been written by something that did not check it (an older or compromised scheduler, a
/// direct insert). What the spec leaves to this host is checked as this host fills it in:
/// the default provider and model must be allowed, and of the default tools the session
/// gets those its tenant may use.
fn admit(inner: &Arc<Inner>, row: &SessionRow, spec: &mut SessionSpec) -> Result<(), String> {
    let policy = inner.cfg.policy.for_tenant(tenant(row));
    let refused = |v: agentq_core::policy::PolicyViolation| format!("refused by policy: {v}");
    // The scheduler's own policy check, again: a stored row counts as having sent
    // everything it holds.
    policy
        .check_request(
            &row.queue,
            spec,
            Sent::Stored,
            SpawnContext { depth: row.depth },
        )
        .map_err(refused)?;
    let provider = spec
        .provider
        .clone()
        .unwrap_or_else(|| inner.cfg.default_provider.clone());
    policy.check_provider(&provider).map_err(refused)?;
    let model = spec
        .model
        .clone()
        .or_else(|| inner.cfg.default_model.clone())
        .unwrap_or_else(|| factory::default_model(&provider).to_string());
    policy.check_model(&model).map_err(refused)?;
    if spec.tools.is_none() {
        let defaults = &inner.cfg.default_tools;
        let allowed = policy.allowed_tools(defaults);
        if allowed.len() < defaults.len() {
            spec.tools = Some(allowed.into_iter().cloned().collect());
        }
    }
    Ok(())
}

fn build_agent(
    inner: &Arc<Inner>,
    row: &SessionRow,
    spec: &SessionSpec,
    parts: AgentParts,
) -> Result<Agent, String> {
    let policy = inner.cfg.policy.for_tenant(tenant(row));
    let provider_name = spec
        .provider
        .clone()
        .unwrap_or_else(|| inner.cfg.default_provider.clone());
    let provider = inner
        .provider(tenant(row), &provider_name, spec.base_url.as_deref())
        .map_err(|e| format!("provider: {e}"))?;
    let default_model = inner
        .cfg
        .default_model
        .clone()
        .unwrap_or_else(|| factory::default_model(&provider_name).to_string());
    let mut all = builtin_registry(&inner.cfg.tool_settings);
    all.extend(&inner.cfg.tools);
    let wanted = spec
        .tools
        .clone()
        .unwrap_or_else(|| inner.cfg.default_tools.clone());
    let builtin: Vec<String> = wanted
        .iter()
        .filter(|t| t.as_str() != spawn::NAME)
        .cloned()
        .collect();
    let mut tools = all.select(&builtin).map_err(|e| format!("tools: {e}"))?;
    let admissions = crate::admission::admission_for(inner, row, spec.token_budget, &*provider);
    if builtin.len() < wanted.len() {
        tools.register(Arc::new(SpawnAgent {
            store: inner.store.clone(),
            queue: inner.queue.clone(),
            parent: SessionRow {
                spec: spec.clone(),
                ..row.clone()
            },
            parent_tools: wanted.clone(),
            max_depth: policy.max_depth(inner.cfg.max_depth),
            max_children: policy.max_children(inner.cfg.max_children),
            max_prompt_bytes: inner.cfg.max_prompt_bytes,
            max_tree_sessions: policy.max_tree_sessions(),
            policy: inner.cfg.policy.clone(),
            tenant: tenant(row).to_string(),
            inbox: parts.inbox.clone(),
            parent_spent: admissions.spent.clone(),
            creating: tokio::sync::Mutex::new(()),
        }));
    }
    // The tree's directory is made when a tool first writes there (or when committed
    // files are restored into it): sessions that never touch files cost no directory
    // (creating one per session was a fifth of a worker's CPU in the bench, and a
    // blocking call on the runtime).
    let workspace = parts.workspace;
    // The permission stage holds the tenant's rule, so a call of anything else is denied
    // even if it reaches the pipeline.
    let allowed = tools
        .names()
        .into_iter()
        .filter(|n| policy.allows_tool(n))
        .collect();
    let mut guards = Guards {
        tenant: tenant(row).to_string(),
        firewall: Some(Arc::new(Firewall::default())),
        sensitive_tools: inner.cfg.sensitive_tools.iter().cloned().collect(),
        approver: Some(parts.inbox.clone()),
        permissions: Permissions {
            can_use_tools: true,
            allowed: Some(allowed),
        },
        ..Guards::default()
    };
    inner.cfg.operator.apply(&mut guards);
    guards.guardian_admission = admissions.guardian;
    Ok(Agent {
        provider,
        default_model,
        tools,
        guards,
        events: parts.sink,
        checkpointer: parts.checkpointer,
        background: parts.inbox,
        workspace: Arc::new(workspace),
        settings: Arc::new(inner.cfg.tool_settings.clone()),
        observer: parts.observer,
        interrupter: parts.interrupter,
        admission: admissions.session,
        write_ahead_grace: inner.cfg.write_ahead_grace,
        max_llm_retries: inner.cfg.max_llm_retries,
        suspend_after: inner.cfg.rate_limit_suspend_after,
    })
}

async fn get_row(inner: &Arc<Inner>, id: &str) -> Option<SessionRow> {
    let mut backoff = Backoff::new();
    for _ in 0..20 {
        match inner.store.get(id).await {
            Ok(r) => return r,
            Err(e) => {
                warn!(error = %e, "reading the finished row failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
    None
}

/// Give a session back after a graceful stop: release the lease, put a fresh entry on the
/// queue so any worker resumes it at once, and ack the old one. A crash in between only
/// leaves duplicates, which the lease makes harmless. Whether it got that far.
async fn hand_back(inner: &Arc<Inner>, d: &Delivery, lease: &Lease) -> bool {
    if let Err(e) = inner.store.release(lease).await {
        warn!(error = %e, "releasing the lease failed; it will expire instead");
        return false;
    }
    if let Err(e) = inner
        .queue
        .enqueue(&d.queue, &d.session_id, agentq_core::EnqueueReason::Resume)
        .await
    {
        warn!(error = %e, "re-enqueueing failed; the old entry stays for the reclaimer");
        return false;
    }
    ack(inner, d).await
}

async fn publish(inner: &Arc<Inner>, row: &SessionRow) -> bool {
    let completion = Completion::from_row(row);
    let mut backoff = Backoff::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match inner.queue.publish_completion(&completion).await {
            Ok(()) => return true,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let wait = backoff.next();
                warn!(error = %e, ?wait, "publishing the completion failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                error!(error = %e, "publishing the completion failed; the entry stays for redelivery");
                return false;
            }
        }
    }
}

async fn publish_and_ack(inner: &Arc<Inner>, d: &Delivery, row: &SessionRow) -> bool {
    publish(inner, row).await && ack(inner, d).await
}

/// Whether the entry was acked (a few tries).
async fn ack(inner: &Arc<Inner>, d: &Delivery) -> bool {
    let mut backoff = Backoff::new();
    for _ in 0..10 {
        match inner
            .queue
            .ack(&d.queue, std::slice::from_ref(&d.entry_id))
            .await
        {
            Ok(()) => return true,
            Err(e) => {
                warn!(error = %e, "ack failed; retrying");
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
    false
}
