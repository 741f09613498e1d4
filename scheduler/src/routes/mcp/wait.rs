//! `wait_session`: a session's view once it ends (or holds a call for a human decision),
//! or as it is when the wait runs out or the scheduler begins to shut down.
//!
//! Woken by the session's completion message (`agentq:done:<id>`, subscribed before the
//! first read, so an end between the read and the wait is not missed); pub/sub drops
//! messages while a connection is down, and a call held for a decision announces nothing,
//! so the row is also read again every [`RECHECK`]. A wait holds one of the event
//! streams' permits (the same caps): it holds a subscription while it lasts.

use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use agentq_api::SessionDetail;
use agentq_core::auth::Caller;
use agentq_core::{SessionRow, SessionStatus};

use super::tools::{DEFAULT_WAIT_SECS, MAX_WAIT_SECS};
use crate::actions::detail_of;
use crate::error::ApiError;
use crate::http::{ApiResult, get_row};
use crate::state::Scheduler;

/// How often a waiting call reads the row again whatever it heard.
const RECHECK: Duration = Duration::from_secs(2);

/// The wait `timeout_secs` asks for, within the server's bound.
pub(super) fn timeout(timeout_secs: Option<u64>) -> ApiResult<Duration> {
    let secs = timeout_secs.unwrap_or(DEFAULT_WAIT_SECS);
    if !(1..=MAX_WAIT_SECS).contains(&secs) {
        return Err(ApiError::invalid(
            "timeout_secs",
            format!("must be between 1 and {MAX_WAIT_SECS}, got {secs}"),
        ));
    }
    Ok(Duration::from_secs(secs))
}

/// Whether a wait on `row` is over: it ended, or it needs a human.
fn settled(row: &SessionRow) -> bool {
    row.status.is_terminal() || row.status == SessionStatus::AwaitingApproval
}

/// Wait up to `timeout` for session `id` of the caller's tenant to settle (or `cancel`);
/// whether it ended, and its view.
pub(super) async fn wait_session(
    s: &Scheduler,
    caller: &Caller,
    id: &str,
    timeout: Duration,
    cancel: &CancellationToken,
) -> ApiResult<(bool, SessionDetail)> {
    // Another tenant's session is refused before anything is held for it.
    let mut row = get_row(s, caller, id).await?;
    if !settled(&row) {
        let _permit = s.streams.acquire(caller)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let subscribed = tokio::time::timeout_at(deadline, s.queue.subscribe_completion(id));
        let mut done = match subscribed.await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::warn!(session_id = %id, error = %e, "cannot subscribe to a completion; polling");
                None
            }
            Err(_) => None,
        };
        let mut recheck = tokio::time::interval(RECHECK);
        // An `interval` ticks at once: that first read closes the window between the
        // first read and the subscription.
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                () = s.draining.cancelled() => break,
                // The client went away: nobody reads the answer.
                () = cancel.cancelled() => break,
                heard = next(&mut done) => {
                    if heard.is_none() {
                        // The subscription ended (its connection went): poll from now on.
                        done = None;
                    }
                }
                _ = recheck.tick() => {}
            }
            row = get_row(s, caller, id).await?;
            if settled(&row) {
                break;
            }
        }
        if !settled(&row) {
            row = get_row(s, caller, id).await?;
        }
    }
    let ended = row.status.is_terminal();
    Ok((ended, detail_of(s, caller, row).await?))
}

/// The next completion heard; never, without a subscription.
async fn next(
    done: &mut Option<futures::stream::BoxStream<'static, agentq_core::Completion>>,
) -> Option<agentq_core::Completion> {
    match done {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}
