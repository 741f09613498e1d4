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
        use tokio::signal::unix::{Signal, SignalKind, signal};
        /// The next of these signals; never, for one that could not be installed.
        async fn next(signal: &mut Option<Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        tokio::spawn(async move {
            let name = if term.is_none() && int.is_none() {
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            } else {
                tokio::select! {
                    _ = next(&mut term) => "SIGTERM",
                    _ = next(&mut int) => "SIGINT",
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
