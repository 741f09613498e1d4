//! One delivery, start to end: claim the session, ack its entry as soon as the claim
//! commits (from then on the store's lease alone says who runs it, and a dead worker's
//! sessions are re-queued from the store), run it, and settle it — publish a finished
//! one and mark it announced, hand back a drained one, dead-letter a poisonous one, and
//! drop what another live worker owns.
//!
//! The parts of a run, each in its own module: `wiring` (its collaborators and its
//! registration here), `tree_workspace` (its tree's files restored), `agent` (the agent
//! built from the admitted spec), `drive` (run to an outcome), `outcome` (what it came to,
//! recorded), `suspend`, `settle` (the entry's end), `panic`; `processed` is the answer.

mod agent;
mod drive;
mod outcome;
mod panic;
mod processed;
mod settle;
mod suspend;
mod tree_workspace;
mod wiring;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::FutureExt;
use tracing::{Instrument, error, info, info_span, warn};

use agentq_agent::provider::factory;
use agentq_agent::spec::SessionSpec;
use agentq_agent::state::SessionState;
use agentq_core::policy::{Sent, SpawnContext};
use agentq_core::queue::Delivery;
use agentq_core::{Claim, Lease, SessionRow};

use self::agent::{build_agent, provider_of};
use self::drive::drive;
use self::outcome::record;
use self::panic::{after_panic, panic_message};
pub use self::processed::Processed;
use self::settle::{ack, dead_letter, hand_back, settle_finished};
use self::tree_workspace::{WorkspaceOpen, open_workspace};
use self::wiring::{Claimed, Wiring};
use crate::error::Result;
use crate::inner::Inner;
use crate::tenant::tenant;

/// One delivery, to its end. A panic anywhere in it (the loop, a tool, a provider, this
/// worker's own code) fails that session with the panic's message: the task survives, the
/// lease and the slot are given back and the heartbeat forgets the run, so the session
/// never stays `running` with nobody running it.
pub(crate) async fn handle(inner: Arc<Inner>, d: Delivery) -> Result<Processed> {
    let handled = handle_caught(inner.clone(), d).await;
    if matches!(handled, Ok(Processed::Left)) {
        // The session may still be ours in the store with nobody running it: the
        // heartbeat gives it back.
        inner.runs.audit_due.store(true, Ordering::SeqCst);
    }
    handled
}

async fn handle_caught(inner: Arc<Inner>, d: Delivery) -> Result<Processed> {
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
    // lease to expire (the run is forgotten already), and the task still survives. Boxed,
    // as every way a session ends here but the run's own: the task's size is its largest
    // state, held by every session in flight, and these are larger than the run's wait
    // on its model.
    let settled = AssertUnwindSafe(Box::pin(after_panic(
        &inner,
        &d,
        panic_message(panic.as_ref()),
    )))
    .catch_unwind()
    .instrument(span)
    .await;
    Ok(settled.unwrap_or_else(|again| {
        error!(panic = %panic_message(again.as_ref()), "failing a panicked session panicked too; leaving its entry");
        inner.runs.finish(&d.session_id);
        Processed::Left
    }))
}

async fn handle_inner(inner: Arc<Inner>, d: Delivery) -> Result<Processed> {
    let claimed_at = Instant::now();
    let claim = inner.claims.claim(&inner.store, &d.session_id).await;
    let claim = match claim {
        Ok(c) => c,
        Err(e) => {
            // The entry stays pending; the reclaimer hands it out again later. The claim
            // may have committed unanswered: the heartbeat's audit gives back a session
            // that is ours with nobody running it.
            inner.runs.audit_due.store(true, Ordering::SeqCst);
            warn!(error = %e, "claim failed; leaving the entry for a retry");
            return Err(e.into());
        }
    };
    Ok(match claim {
        Claim::Acquired { lease, state, row } => {
            // The entry's work is the store's now: a pending entry would only be touched
            // for as long as the run lasts, and pin the stream's trim. If the ack fails,
            // the entry is reclaimed later and finds the session busy or done.
            let acked = ack(&inner, &d).await;
            run_claimed(inner, d, lease, state, row, claimed_at, acked).await
        }
        Claim::Terminal(row) => {
            // Finished, not announced (its worker died before it was): settle again —
            // every step is idempotent but the publication, which may repeat one that went
            // out just before that death — never run again.
            Processed::Finished {
                // Boxed, as the settling after a panic is (`handle_caught`).
                acked: Box::pin(settle_finished(&inner, &d, &row, false)).await,
            }
        }
        Claim::Settled => {
            // Finished and announced already: the entry is a duplicate (two passes
            // re-queued a dead worker's session, say); publishing again would tell the
            // subscribers twice.
            Processed::Finished {
                acked: ack(&inner, &d).await,
            }
        }
        Claim::Busy => {
            // Another worker's live lease: the entry is a duplicate. If that worker dies,
            // the store's liveness re-queues the session.
            ack(&inner, &d).await;
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
        // Boxed, as the settling after a panic is (`handle_caught`).
        Claim::Exhausted(row) => Box::pin(dead_letter(&inner, &d, &row)).await,
    })
}

/// The run of a session claimed here: wired up and registered, its tree's files restored,
/// its stored spec admitted and its agent built, run to an outcome, and that recorded.
async fn run_claimed(
    inner: Arc<Inner>,
    d: Delivery,
    lease: Lease,
    mut state: Box<SessionState>,
    row: Box<SessionRow>,
    claimed_at: Instant,
    acked: bool,
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
    let wiring = Wiring::new(&inner, &d, &lease, &state, &row, resumed).await;
    // From here on the run is forgotten when this returns or unwinds.
    let _registered = wiring.register(&inner, &d, &lease, claimed_at);
    // The tree's files as of its last commit, before anything runs.
    let (sync, workspace) = match open_workspace(&inner, &row).await {
        Ok(opened) => opened,
        Err(WorkspaceOpen::Unavailable(e)) => {
            warn!(error = %e, "the workspace cannot be restored now; handing the session back");
            return hand_back(&inner, &d, &lease, acked).await;
        }
        Err(WorkspaceOpen::Failed(e)) => (None, Err(e)),
    };
    let checked = check_stored(&inner, &row, &mut state.spec);
    let checkpointer = wiring.checkpointer(&inner, &lease, sync, checked.clone().ok());
    m.sessions_active.inc();
    let built = checked.and_then(|_| {
        let parts = wiring.agent_parts(checkpointer.clone(), workspace?);
        // Boxed: the agent would otherwise be copied into each frame of the session's
        // task, which every session in flight holds while it waits on its model.
        build_agent(&inner, &row, &state.spec, parts).map(Box::new)
    });
    let ran = drive(
        built,
        &mut state,
        &wiring.cancel,
        &wiring.abort,
        &checkpointer,
    )
    .await;
    wiring.settling();
    m.sessions_active.dec();
    let run = Claimed {
        inner: &inner,
        d: &d,
        lease: &lease,
        row: &row,
        sink: &wiring.sink,
        acked,
    };
    // Boxed: recording is larger than the run's wait on its model, and the task's size is
    // its largest state, held by every session in flight.
    Box::pin(record(&run, &state, ran)).await
}

/// The stored spec under its tenant's policy, checked again here because the row may have
/// been written by something that did not check it (an older or compromised scheduler, a
/// direct insert). What the spec leaves to this host is checked as this host fills it in:
/// the default provider and model must be allowed, and of the default tools the session
/// gets those its tenant may use. The answer is the model the session calls.
fn check_stored(
    inner: &Arc<Inner>,
    row: &SessionRow,
    spec: &mut SessionSpec,
) -> Result<String, String> {
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
    let provider = provider_of(inner, spec)?;
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
    Ok(model)
}
