//! SIGTERM and SIGINT become a cancellation token: every long-running command shuts down
//! through it, within its own bound. The signal is remembered for the stop line.

use std::sync::OnceLock;

use tokio_util::sync::CancellationToken;

static RECEIVED: OnceLock<&'static str> = OnceLock::new();

/// The signal that asked this process to stop, if one did.
pub fn received() -> Option<&'static str> {
    RECEIVED.get().copied()
}

pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    let _ = RECEIVED.set("SIGINT");
                    token.cancel();
                    return;
                }
            };
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
            };
            let _ = RECEIVED.set(name);
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            let _ = RECEIVED.set("Ctrl-C");
        }
        token.cancel();
    });
}
