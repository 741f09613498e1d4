//! The rules every setting must follow, checked once, after all the layers, by
//! [`Settings::validate`]: each error names the setting with its variable and flag.

use super::{PROVIDERS, SchedulerSection, Secs, Settings, WorkerSection, describe};
use crate::error::{Error, Result};

/// The longest any timing setting may be: past a day it is a typo, and durations that
/// large would overflow the arithmetic of the timers built from them.
const MAX_TIMING_SECS: f64 = 86_400.0;
/// Timers shorter than a millisecond would spin.
const MIN_TIMING_SECS: f64 = 0.001;

fn invalid(key: &str, why: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {why}", describe(key)))
}

impl Settings {
    /// Every rule the settings must follow, checked once after all the layers; the error
    /// names the setting with its variable and flag.
    pub fn validate(&self) -> Result<()> {
        worker_timings(&self.worker)?;
        worker_limits(&self.worker)?;
        scheduler(&self.scheduler)?;
        for (key, addr) in [
            ("api_addr", &self.api_addr),
            ("metrics_addr", &self.metrics_addr),
            ("api_url", &self.api_url),
        ] {
            if addr.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        Ok(())
    }
}

fn timing(key: &str, v: Secs, min: f64, max: f64) -> Result<()> {
    if v.0.is_finite() && (min..=max).contains(&v.0) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("must be a number of seconds from {min} to {max}, not {v}"),
    ))
}

fn worker_timings(w: &WorkerSection) -> Result<()> {
    for (key, v) in [
        ("worker.lease_ttl_secs", w.lease_ttl_secs),
        ("worker.heartbeat_secs", w.heartbeat_secs),
        ("worker.reclaim_min_idle_secs", w.reclaim_min_idle_secs),
        ("worker.reclaim_interval_secs", w.reclaim_interval_secs),
        ("worker.drain_timeout_secs", w.drain_timeout_secs),
    ] {
        timing(key, v, MIN_TIMING_SECS, MAX_TIMING_SECS)?;
    }
    // Kept for following a finished session afterwards: a second at least, 30 days at most.
    timing("worker.event_ttl_secs", w.event_ttl_secs, 1.0, 2_592_000.0)?;
    if w.heartbeat_secs >= w.lease_ttl_secs {
        return Err(invalid(
            "worker.heartbeat_secs",
            format!(
                "{} must be shorter than {} ({}), or leases expire between heartbeats and \
                 running sessions are taken over",
                w.heartbeat_secs,
                describe("worker.lease_ttl_secs"),
                w.lease_ttl_secs
            ),
        ));
    }
    if w.reclaim_min_idle_secs <= w.heartbeat_secs {
        return Err(invalid(
            "worker.reclaim_min_idle_secs",
            format!(
                "{} must be longer than {} ({}): a live worker touches its entries every \
                 heartbeat, so a shorter idle time takes over sessions that are running",
                w.reclaim_min_idle_secs,
                describe("worker.heartbeat_secs"),
                w.heartbeat_secs
            ),
        ));
    }
    Ok(())
}

fn worker_limits(w: &WorkerSection) -> Result<()> {
    range("worker.concurrency", w.concurrency, 1, 100_000)?;
    range("worker.max_attempts", w.max_attempts, 1, 10_000)?;
    range("worker.read_block_ms", w.read_block_ms, 1, 60_000)?;
    range(
        "worker.checkpoint_batch_max",
        w.checkpoint_batch_max,
        1,
        10_000,
    )?;
    range("worker.checkpoint_writers", w.checkpoint_writers, 1, 64)?;
    range(
        "worker.write_ahead_grace_ms",
        w.write_ahead_grace_ms,
        0,
        60_000,
    )?;
    range("worker.max_depth", w.max_depth, 0, 64)?;
    range("worker.max_children", w.max_children, 0, 10_000)?;
    names("worker.queues", &w.queues)?;
    if let Some(tools) = &w.default_tools {
        names("worker.default_tools", tools)?;
    }
    if !PROVIDERS.contains(&w.default_provider.as_str()) {
        return Err(invalid(
            "worker.default_provider",
            format!(
                "unknown provider `{}` (expected {})",
                w.default_provider,
                PROVIDERS.join(", ")
            ),
        ));
    }
    if w.default_model
        .as_deref()
        .is_some_and(|m| m.trim().is_empty())
    {
        return Err(invalid("worker.default_model", "must not be empty"));
    }
    Ok(())
}

fn scheduler(s: &SchedulerSection) -> Result<()> {
    range(
        "scheduler.sweep_interval_secs",
        s.sweep_interval_secs,
        1,
        86_400,
    )?;
    range("scheduler.sweep_age_secs", s.sweep_age_secs, 0, 86_400)?;
    range(
        "scheduler.max_prompt_bytes",
        s.max_prompt_bytes,
        1,
        usize::MAX,
    )?;
    range("scheduler.max_batch", s.max_batch, 1, 1_000_000)?;
    range("scheduler.key_cache_secs", s.key_cache_secs, 0, 3_600)?;
    names("scheduler.queues", &s.queues)
}

fn range<T: PartialOrd + std::fmt::Display>(key: &str, v: T, min: T, max: T) -> Result<()> {
    if v < min || v > max {
        return Err(invalid(
            key,
            format!("must be from {min} to {max}, not {v}"),
        ));
    }
    Ok(())
}

fn names(key: &str, list: &[String]) -> Result<()> {
    if key.ends_with("queues") && list.is_empty() {
        return Err(invalid(key, "must name at least one queue"));
    }
    if list.iter().any(|n| n.trim().is_empty()) {
        return Err(invalid(key, "names must not be empty"));
    }
    Ok(())
}
