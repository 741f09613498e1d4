//! Panics while handling a delivery: what a panic said, bounded, and failing the session
//! of a panic outside the run's own loop so that it never stays `running` with nobody
//! running it.

use std::any::Any;
use std::sync::Arc;

use tracing::{error, warn};

use agentq_core::queue::Delivery;

use super::processed::Processed;
use super::settle::{ack, fail_and_settle};
use crate::inner::Inner;

/// What a panic said, bounded (it becomes the session's error).
pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
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
pub(super) async fn after_panic(inner: &Arc<Inner>, d: &Delivery, message: String) -> Processed {
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
    fail_and_settle(inner, d, &reason, false).await
}
