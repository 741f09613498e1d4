//! From a delivery to a running session: may it start here (one run per session here;
//! another entry of a running session waits for it), take a slot, and process it — on a
//! task of the worker's tracker for the run loop ([`start`]), on the caller's task for
//! [`crate::Worker::process`] ([`process`]). Both go through [`session::handle`].

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use agentq_core::queue::Delivery;

use crate::error::{Error, Result};
use crate::inner::Inner;
use crate::runs::Start;
use crate::session::{self, Processed};

/// The handling of a session [`crate::runs::Runs::try_start`] began, ended when this
/// drops: after the delivery's processing, or without it (no slot).
struct Handling {
    inner: Arc<Inner>,
    session_id: String,
}

impl Handling {
    fn began(inner: &Arc<Inner>, session_id: &str) -> Handling {
        Handling {
            inner: inner.clone(),
            session_id: session_id.to_string(),
        }
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.inner.runs.end_handling(&self.session_id);
    }
}

/// Hand a delivery to a session task once a slot is free.
pub(crate) async fn start(inner: &Arc<Inner>, tracker: &TaskTracker, d: Delivery) {
    if inner.runs.try_start(&d) != Start::Now {
        return;
    }
    let handling = Handling::began(inner, &d.session_id);
    let Ok(permit) = inner.slots.clone().acquire_owned().await else {
        return;
    };
    let inner = inner.clone();
    tracker.spawn(async move {
        // The outcome is logged where it happens; the run loop has nothing to add.
        let _ = session::handle(inner, d).await;
        drop(permit);
        drop(handling);
    });
}

/// [`start`] on the caller's task, to the end of the session's processing.
pub(crate) async fn process(inner: &Arc<Inner>, d: Delivery) -> Result<Processed> {
    match inner.runs.try_start(&d) {
        Start::Now => {}
        Start::Deferred => return Ok(Processed::Deferred),
        Start::Duplicate => return Ok(Processed::AlreadyRunning),
    }
    let _handling = Handling::began(inner, &d.session_id);
    let _permit = inner
        .slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| Error::Config("the worker's session slots are closed".into()))?;
    session::handle(inner.clone(), d).await
}
