//! From a delivery to a running session: admit it (one run per session here; another
//! entry of a running session waits for it), take a slot, and process it — on a task of
//! the worker's tracker for the run loop, on the caller's task for
//! [`crate::Worker::process`]. Both go through [`session::handle`].

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use agentq_core::queue::Delivery;

use crate::runs::Admission;
use crate::session::{self, Processed};
use crate::{Error, Inner, Result};

/// Hand a delivery to a session task once a slot is free.
pub(crate) async fn dispatch(inner: &Arc<Inner>, tracker: &TaskTracker, d: Delivery) {
    if inner.runs.admit(&d) != Admission::Run {
        return;
    }
    let Ok(permit) = inner.slots.clone().acquire_owned().await else {
        return;
    };
    let inner = inner.clone();
    tracker.spawn(async move {
        // The outcome is logged where it happens; the run loop has nothing to add.
        let _ = session::handle(inner, d).await;
        drop(permit);
    });
}

/// [`dispatch`] on the caller's task, to the end of the session's processing.
pub(crate) async fn process(inner: &Arc<Inner>, d: Delivery) -> Result<Processed> {
    match inner.runs.admit(&d) {
        Admission::Run => {}
        Admission::Deferred => return Ok(Processed::Deferred),
        Admission::Duplicate => return Ok(Processed::AlreadyRunning),
    }
    let _permit = inner
        .slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Error::Config("the worker's session slots are closed".into()))?;
    session::handle(inner.clone(), d).await
}
