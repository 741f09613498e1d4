//! Running a claimed session's agent to an outcome: the loop itself, stopped at once when
//! the lease is lost; a panic of the loop, a tool or a provider turned into a failed
//! session; and a session whose agent could not be built failed before any call.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::error;

use agentq_agent::driver::{Agent, Checkpointer, Receipt, RunEnd};
use agentq_agent::state::{Outcome, SessionState};

use super::panic::panic_message;
use crate::checkpoint::StoreCheckpointer;

/// What a run came to: `None` when it was aborted because its lease is gone.
pub(super) type Ran = Option<agentq_agent::Result<(RunEnd, Receipt)>>;

/// Run `built` on `state` until it ends, `cancel` interrupting it and `abort` dropping it;
/// `committed` is the run's own checkpointer, which records a failure of its own.
pub(super) async fn drive(
    built: Result<Box<Agent>, String>,
    state: &mut SessionState,
    cancel: &CancellationToken,
    abort: &CancellationToken,
    committed: &StoreCheckpointer,
) -> Ran {
    let loaded = state.messages.len();
    match built {
        Ok(agent) => {
            let running = AssertUnwindSafe(agent.run_with_receipt(state, cancel));
            let ran = tokio::select! {
                r = running.catch_unwind() => Some(r),
                _ = abort.cancelled() => None,
            };
            match ran {
                None => None,
                Some(Ok(r)) => Some(r),
                Some(Err(panic)) => {
                    let message = panic_message(panic.as_ref());
                    Some(fail_panicked(state, committed, loaded, message).await)
                }
            }
        }
        Err(message) => Some(fail_unbuilt(state, committed, message).await),
    }
}

/// A session that cannot be built (unknown tool, bad provider) or that its tenant's policy
/// does not allow fails at once, before any LLM call or tool, with the reason, through a
/// normal fenced checkpoint (the run's own checkpointer: a draining worker still writes a
/// step with an outcome).
async fn fail_unbuilt(
    state: &mut SessionState,
    committed: &StoreCheckpointer,
    message: String,
) -> agentq_agent::Result<(RunEnd, Receipt)> {
    state.outcome = Some(Outcome::error(message));
    let from = state.messages.len();
    committed.save(state, from).await.map(|receipt| {
        let outcome = state.outcome.clone().unwrap_or_else(|| Outcome::error(""));
        (RunEnd::Finished(outcome), receipt)
    })
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
