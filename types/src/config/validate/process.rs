//! The rules of the processes' own settings: `[worker]`, `[scheduler]`,
//! `[scheduling]` and `[redis]`.

use super::rules::{invalid, names, range, timing};
use crate::config::providers::PROVIDERS;
use crate::config::redis::{MAX_PARTITIONS, RedisSection};
use crate::config::registry::describe;
use crate::config::scheduler::{SchedulerSection, SchedulingSection};
use crate::config::worker::WorkerSection;
use crate::error::Result;

/// The longest any timing setting may be: past a day it is a typo, and durations that
/// large would overflow the arithmetic of the timers built from them.
const MAX_TIMING_SECS: f64 = 86_400.0;
/// The largest file cap or workspace quota: 1 TiB.
const MAX_WORKSPACE_BYTES: u64 = 1 << 40;
/// Timers shorter than a millisecond would spin.
const MIN_TIMING_SECS: f64 = 0.001;

pub(super) fn worker_timings(w: &WorkerSection) -> Result<()> {
    for (key, v) in [
        ("worker.lease_ttl_secs", w.lease_ttl_secs),
        ("worker.heartbeat_secs", w.heartbeat_secs),
        ("worker.reclaim_min_idle_secs", w.reclaim_min_idle_secs),
        ("worker.reclaim_interval_secs", w.reclaim_interval_secs),
        ("worker.drain_timeout_secs", w.drain_timeout_secs),
    ] {
        timing(key, v, MIN_TIMING_SECS, MAX_TIMING_SECS)?;
    }
    // 0 never suspends; at most an hour of holding a slot.
    timing(
        "worker.rate_limit_suspend_secs",
        w.rate_limit_suspend_secs,
        0.0,
        3_600.0,
    )?;
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

pub(super) fn worker_limits(w: &WorkerSection) -> Result<()> {
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
    range("worker.max_llm_retries", w.max_llm_retries, 0, 100)?;
    range(
        "worker.max_file_bytes",
        w.max_file_bytes,
        1,
        MAX_WORKSPACE_BYTES,
    )?;
    range(
        "worker.workspace_quota_bytes",
        w.workspace_quota_bytes,
        1,
        MAX_WORKSPACE_BYTES,
    )?;
    if w.max_file_bytes > w.workspace_quota_bytes {
        return Err(invalid(
            "worker.max_file_bytes",
            format!(
                "{} must not be larger than {} ({}): no file that size could be written",
                w.max_file_bytes,
                describe("worker.workspace_quota_bytes"),
                w.workspace_quota_bytes
            ),
        ));
    }
    range("worker.max_children", w.max_children, 0, 10_000)?;
    names("worker.queues", &w.queues)?;
    if let Some(tools) = &w.default_tools {
        names("worker.default_tools", tools)?;
        let search = agentq_agent::spec::WEB_SEARCH_TOOL;
        if let Some(p) = &w.default_provider
            && tools.iter().any(|t| t == search)
            && !agentq_agent::provider::factory::searches_the_web(p)
        {
            return Err(invalid(
                "worker.default_tools",
                format!(
                    "`{search}` is a search the provider runs itself, and the default \
                     provider `{p}` cannot (anthropic can)"
                ),
            ));
        }
    }
    if let Some(p) = &w.default_provider
        && !PROVIDERS.contains(&p.as_str())
    {
        return Err(invalid(
            "worker.default_provider",
            format!("unknown provider `{p}` (expected {})", PROVIDERS.join(", ")),
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

pub(super) fn scheduler(s: &SchedulerSection) -> Result<()> {
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
    range(
        "scheduler.max_batch_items",
        s.max_batch_items,
        1,
        10_000_000,
    )?;
    range("scheduler.key_cache_secs", s.key_cache_secs, 0, 3_600)?;
    range("scheduler.max_connections", s.max_connections, 1, 1_000_000)?;
    range(
        "scheduler.max_connections_per_key",
        s.max_connections_per_key,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.max_connections_per_peer",
        s.max_connections_per_peer,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.batch_decode_bytes",
        s.batch_decode_bytes,
        1024 * 1024,
        usize::MAX,
    )?;
    range(
        "scheduler.max_event_streams",
        s.max_event_streams,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.max_event_streams_per_tenant",
        s.max_event_streams_per_tenant,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.max_event_streams_per_key",
        s.max_event_streams_per_key,
        1,
        1_000_000,
    )?;
    range(
        "scheduler.header_read_timeout_secs",
        s.header_read_timeout_secs,
        1,
        3_600,
    )?;
    range(
        "scheduler.body_read_timeout_secs",
        s.body_read_timeout_secs,
        1,
        3_600,
    )?;
    range(
        "scheduler.write_timeout_secs",
        s.write_timeout_secs,
        1,
        3_600,
    )?;
    range("scheduler.max_queues", s.max_queues, 1, 10_000)?;
    range(
        "scheduler.stream_max_len",
        s.stream_max_len,
        0,
        1_000_000_000,
    )?;
    if s.queues.len() > s.max_queues {
        return Err(invalid(
            "scheduler.queues",
            format!(
                "names {} queues, more than scheduler.max_queues ({})",
                s.queues.len(),
                s.max_queues
            ),
        ));
    }
    names("scheduler.queues", &s.queues)
}

pub(super) fn scheduling(s: &SchedulingSection) -> Result<()> {
    range("scheduling.buffer", s.buffer, 1, 1_000_000)?;
    range(
        "scheduling.dispatch_interval_ms",
        s.dispatch_interval_ms,
        10,
        60_000,
    )?;
    if let Some(cap) = s.tenant_max_running {
        range("scheduling.tenant_max_running", cap, 1, 1_000_000)?;
    }
    for (name, t) in &s.tenants {
        range(
            &format!("scheduling.tenants.{name}.weight"),
            t.weight,
            1,
            1_000,
        )?;
        if let Some(cap) = t.max_running {
            range(
                &format!("scheduling.tenants.{name}.max_running"),
                cap,
                1,
                1_000_000,
            )?;
        }
    }
    Ok(())
}

/// `[redis]`: a partition count in range, and several seed URLs only for a cluster (one
/// server has one address).
pub(super) fn redis(r: &RedisSection, redis_url: Option<&str>) -> Result<()> {
    if let Some(p) = r.partitions {
        range("redis.partitions", p, 1, MAX_PARTITIONS)?;
    }
    if !r.cluster && redis_url.is_some_and(|u| u.contains(',')) {
        return Err(invalid(
            "redis_url",
            "names several servers: set redis.cluster = true (AGENTQ_REDIS_CLUSTER) for a \
             Redis Cluster's seed nodes",
        ));
    }
    Ok(())
}

/// `database_url`: one Postgres URL, or several between commas (one per shard, the
/// control shard first), each a `postgres://` or `postgresql://` URL. A bad one is named by
/// its position, never echoed (it may hold a password).
pub(super) fn database(url: Option<&str>) -> Result<()> {
    let Some(url) = url else {
        return Ok(());
    };
    let urls: Vec<&str> = url.split(',').map(str::trim).collect();
    let n = urls.len();
    if n > usize::from(crate::shard::PARTITIONS) {
        return Err(invalid(
            "database_url",
            format!("names {n} shards; at most {}", crate::shard::PARTITIONS),
        ));
    }
    for (i, u) in urls.iter().enumerate() {
        let postgres = u.starts_with("postgres://") || u.starts_with("postgresql://");
        if !postgres || u.len() <= "postgres://".len() {
            return Err(invalid(
                "database_url",
                format!(
                    "URL {} of {n} is not a Postgres URL (postgres://user@host/db); several \
                     shards are given between commas",
                    i + 1
                ),
            ));
        }
    }
    Ok(())
}
