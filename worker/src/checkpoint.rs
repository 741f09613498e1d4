//! The worker's `Checkpointer`: hands each step to the worker's group commit, fenced by
//! the lease. Rides out short store outages by retrying (a checkpoint is idempotent),
//! stops the run at once when the lease is gone, and stops it right after a durable
//! checkpoint when the worker is draining.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use agentq_agent::driver::Checkpointer;
use agentq_agent::state::SessionState;
use agentq_core::{Checkpoint, Lease};

use crate::Backoff;
use crate::group_commit::GroupCommit;

pub struct StoreCheckpointer {
    pub commits: GroupCommit,
    pub lease: Lease,
    pub draining: CancellationToken,
    /// How long to keep retrying a store that does not answer.
    pub give_up_after: Duration,
    pub metrics: &'static agentq_core::metrics::Metrics,
}

#[async_trait]
impl Checkpointer for StoreCheckpointer {
    async fn save(&self, state: &SessionState, from: usize) -> agentq_agent::Result<()> {
        let started = Instant::now();
        let cp = Arc::new(
            Checkpoint::new(&self.lease, state, from)
                .map_err(|e| agentq_agent::Error::Checkpoint(e.to_string()))?,
        );
        let mut backoff = Backoff::new();
        loop {
            let t = Instant::now();
            match self.commits.commit(cp.clone()).await {
                Ok(()) => {
                    self.metrics.observe_checkpoint(t.elapsed());
                    break;
                }
                Err(agentq_core::Error::LeaseLost(_)) => {
                    return Err(agentq_agent::Error::LeaseLost);
                }
                Err(agentq_core::Error::Stopped) => return Err(agentq_agent::Error::Stopped),
                Err(e) if e.is_retryable() && started.elapsed() < self.give_up_after => {
                    let wait = backoff.next();
                    warn!(session_id = %state.session_id, error = %e, ?wait, "checkpoint failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(agentq_agent::Error::Checkpoint(e.to_string())),
            }
        }
        if self.draining.is_cancelled() && state.outcome.is_none() {
            return Err(agentq_agent::Error::Stopped);
        }
        Ok(())
    }
}
