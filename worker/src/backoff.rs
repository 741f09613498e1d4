//! Waiting between tries: the backoff every reconnect and retry loop of the worker uses,
//! and the loop that retries an operation until it succeeds or the worker stops.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Exponential backoff for reconnect loops: 100 ms doubling to 5 s.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Self {
        Backoff(Duration::from_millis(100))
    }
    pub fn reset(&mut self) {
        self.0 = Duration::from_millis(100);
    }
    pub fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
        d
    }
}

pub(crate) async fn retry_forever<F, Fut, T>(stop: &CancellationToken, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = agentq_core::Result<T>>,
{
    let mut backoff = Backoff::new();
    loop {
        match f().await {
            Ok(v) => return Some(v),
            Err(e) => {
                let wait = backoff.next();
                warn!(error = %e, ?wait, "retrying");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => return None,
                }
            }
        }
    }
}
