//! The limiter's one metric, the round trips that failed open, counted process-wide
//! without a registry of its own.

use std::sync::OnceLock;

use prometheus::IntCounter;

/// The name and help of [`errors`].
pub const ERRORS_METRIC: &str = "agentq_admission_limiter_errors_total";
pub const ERRORS_HELP: &str =
    "Rate-limiter round trips that failed (Redis down or erroring); the call was let through.";

/// Round trips that failed, in this process: every [`Limiter`](crate::Limiter) counts here, and
/// `agentq_core::metrics::global` exports this counter as `limiter_errors` (the limiter
/// needs no metrics registry of its own, and counts even before one exists).
pub fn errors() -> &'static IntCounter {
    static ERRORS: OnceLock<IntCounter> = OnceLock::new();
    ERRORS.get_or_init(|| {
        // A constant name and help: a failure is a programming error, caught by every
        // test that builds a limiter.
        IntCounter::new(ERRORS_METRIC, ERRORS_HELP)
            .unwrap_or_else(|e| panic!("metric {ERRORS_METRIC}: {e}"))
    })
}
