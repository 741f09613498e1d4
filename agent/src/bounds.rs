//! Durations and instants from numbers a session's spec carries, which may be anything a
//! row holds (one written before the API bounded them, or inserted directly): each is
//! clamped to [`MAX_DURATION_SECS`] and every addition to a clock reading saturates, so
//! no value can make the loop or the worker panic on overflow.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};

/// The longest any per-session duration is taken to be: 100 years, past any run, and far
/// inside what every clock and both stores can represent.
pub const MAX_DURATION_SECS: u64 = 100 * 365 * 24 * 3600;

/// The most characters of one tool result that go into the transcript, whatever the
/// session's `tool_output_max_chars` says.
pub const TOOL_OUTPUT_HARD_MAX_CHARS: usize = 1_000_000;

/// The most bytes of one model answer (text, thinking, tool calls and their arguments):
/// far past what the largest `max_tokens` produces, so only a broken or hostile endpoint
/// that streams without end reaches it, and it fails that call instead of the worker's
/// memory.
pub const MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// Bytes of text, thinking and tool-call arguments one output token may stand for, with
/// room to spare: a token is a few bytes of text, and JSON escapes in streamed arguments
/// (`\u00e9`) at most multiply that by six.
pub const BYTES_PER_OUTPUT_TOKEN: usize = 32;
/// The least an answer may hold whatever its `max_tokens`.
pub const MIN_ANSWER_BYTES: usize = 256 * 1024;

/// The most bytes of text, thinking and tool-call arguments an answer asked for with
/// `max_tokens` may hold. A provider stops at `max_tokens`, so only an endpoint that
/// ignores it goes past this: it fails the call before the session's work (transcript,
/// checkpoints, the next request) grows with what the caller's bound was meant to stop.
pub fn answer_bytes(max_tokens: u32) -> usize {
    usize::try_from(max_tokens)
        .unwrap_or(usize::MAX)
        .saturating_mul(BYTES_PER_OUTPUT_TOKEN)
        .clamp(MIN_ANSWER_BYTES, MAX_RESPONSE_BYTES)
}

/// The most tool calls of one model answer that run; those past it are refused (the
/// model is told so), because every call runs at once and each result lands in the
/// transcript: thousands in one answer would take the worker's blocking threads and
/// memory from every other session on it.
pub const MAX_TOOL_CALLS_PER_RESPONSE: usize = 128;

/// `secs` seconds, at most [`MAX_DURATION_SECS`].
pub fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs.min(MAX_DURATION_SECS))
}

/// `ms` milliseconds, at most [`MAX_DURATION_SECS`].
pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms).min(Duration::from_secs(MAX_DURATION_SECS))
}

/// `secs` seconds as a calendar duration, at most [`MAX_DURATION_SECS`].
pub fn delta_secs(secs: u64) -> TimeDelta {
    i64::try_from(secs.min(MAX_DURATION_SECS))
        .ok()
        .and_then(TimeDelta::try_seconds)
        .unwrap_or(TimeDelta::MAX)
}

/// `at` plus `secs` seconds (clamped), or the end of the calendar if that is past it.
pub fn after(at: DateTime<Utc>, secs: u64) -> DateTime<Utc> {
    at.checked_add_signed(delta_secs(secs))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at` plus `d` (clamped to [`MAX_DURATION_SECS`]); `at` itself in the impossible case
/// that even that does not fit the clock, so a deadline is early rather than a panic.
pub fn instant_after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d.min(Duration::from_secs(MAX_DURATION_SECS)))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extremes_saturate() {
        assert_eq!(secs(u64::MAX), Duration::from_secs(MAX_DURATION_SECS));
        assert_eq!(millis(u64::MAX), Duration::from_secs(MAX_DURATION_SECS));
        assert_eq!(millis(1_500), Duration::from_millis(1_500));
        assert_eq!(delta_secs(u64::MAX).num_seconds() as u64, MAX_DURATION_SECS);
        assert_eq!(
            after(DateTime::<Utc>::MAX_UTC, u64::MAX),
            DateTime::<Utc>::MAX_UTC
        );
        let now = Instant::now();
        assert!(instant_after(now, Duration::MAX) > now);
    }
}
