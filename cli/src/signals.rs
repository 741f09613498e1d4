//! SIGTERM and SIGINT become a cancellation token: every long-running command shuts down
//! through it, within its own bound. The signal is remembered for the stop line.

use std::sync::OnceLock;

use tokio_util::sync::CancellationToken;

static RECEIVED: OnceLock<&'static str> = OnceLock::new();

/// The signal that asked this process to stop, if one did.
pub fn received() -> Option<&'static str> {
    RECEIVED.get().copied()
}

/// The handlers are installed before this returns, not in the task it spawns: a process
/// that has said it started and is then sent SIGTERM must stop through the token, and a
/// task not yet polled would leave the default action (death, with no stop line).
pub fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        tokio::spawn(async move {
            let name = match (term, int) {
                (Ok(mut term), Ok(mut int)) => tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                },
                (Ok(mut term), Err(_)) => {
                    term.recv().await;
                    "SIGTERM"
                }
                (Err(_), Ok(mut int)) => {
                    int.recv().await;
                    "SIGINT"
                }
                (Err(_), Err(_)) => {
                    let _ = tokio::signal::ctrl_c().await;
                    "SIGINT"
                }
            };
            let _ = RECEIVED.set(name);
            token.cancel();
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = RECEIVED.set("Ctrl-C");
        token.cancel();
    });
}
