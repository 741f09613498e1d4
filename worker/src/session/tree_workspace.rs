//! The tree's workspace for a claimed session's run: its directory restored to the
//! committed manifest before anything runs, riding out store outages for a while, and the
//! sync that commits the run's changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;

use agentq_agent::tools::LocalWorkspace;
use agentq_core::SessionRow;

use crate::backoff::Backoff;
use crate::inner::Inner;
use crate::workspace::TreeSync;

/// Why a claimed session's workspace could not be opened.
pub(super) enum WorkspaceOpen {
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
pub(super) async fn open_workspace(
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
