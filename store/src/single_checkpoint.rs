//! A single checkpoint written as a batch of one, as both stores do: one code path for
//! fencing and retries whatever the batch size.

use agentq_agent::state::SessionState;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::Lease;
use crate::store::LeaseStore;

pub(crate) async fn checkpoint_alone<S: LeaseStore + ?Sized>(
    store: &S,
    lease: &Lease,
    state: &SessionState,
    from: usize,
) -> Result<()> {
    let cp = Checkpoint::new(lease, state, from)?;
    match store.checkpoint_batch(&[&cp]).await?.pop() {
        Some(result) => result.map(|_| ()),
        // A batch answers once per checkpoint: no answer is a store bug, not a success.
        None => Err(Error::Conflict(format!(
            "the store gave no answer for the checkpoint of session {}",
            lease.session_id
        ))),
    }
}
