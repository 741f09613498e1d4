//! Time as the limiter's Redis records score it (milliseconds since the epoch), and the
//! jitter that spreads waiters' wake-ups.

pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub(crate) fn jitter(max_ms: u64) -> u64 {
    let r = uuid::Uuid::new_v4().as_u128();
    u64::try_from(r % u128::from(max_ms.max(1))).unwrap_or(0)
}
