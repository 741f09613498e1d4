//! How many Postgres connections the run's pools may hold, within what the server has free.
//!
//! `agentq worker` sizes its main pool from its concurrency (a quarter of it, 4 to 64), and
//! the bench's in-process workers and its commit ceiling do the same, so that the figures
//! are a deployment's. Two default workers then want 2 × (64 + 3) connections, more than a
//! stock Postgres (`max_connections = 100`) accepts: the pools would wait for connections
//! the server refuses until they time out, half a minute later. So the bench counts the
//! server's free connections once at the start, before anything else connects, and sizes
//! each worker's main pool to its share (telling so), or refuses at once when not even the
//! smallest pool fits.

use anyhow::{Context, bail};

use agentq_core::pg::PgStore;

use crate::args::BenchArgs;
use crate::report::progress;

/// The bench's own store (sessions created, progress read, clean-up).
pub const ADMIN_CONNECTIONS: u32 = 8;
/// Beside the workers' pools: the rest of the bench's own store, and the storage part's
/// scratch-database store (as large) while its workers run.
const OWN_CONNECTIONS: u32 = 2 * ADMIN_CONNECTIONS;
/// The smallest main pool a worker is given (`agentq worker`'s own floor).
const MIN_POOL: u32 = 4;
/// The concurrency of the recovery part's in-process survivor.
pub const SURVIVOR_CONCURRENCY: u32 = 64;

/// Connections the server can still accept from ordinary roles.
const HEADROOM: &str = "SELECT (current_setting('max_connections')::int \
    - current_setting('superuser_reserved_connections')::int \
    - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'))::bigint, \
    current_setting('max_connections')::bigint";

/// The size of each in-process worker's main pool: what `agentq worker` would open for
/// its concurrency, at most `cap`.
#[derive(Debug, Clone, Copy)]
pub struct Pools {
    cap: u32,
    /// Free connections when the run started.
    free: u32,
    /// Of those, what the bench's own stores may still open.
    own: u32,
}

impl Pools {
    /// The main pool of an in-process worker running `concurrency` sessions at once.
    pub fn main(&self, concurrency: u32) -> u32 {
        agentq_worker::pool_connections(concurrency as usize).min(self.cap)
    }

    /// Size the pools for the parts in `selected` from the server's free connections,
    /// counted through `store` (which holds its first connections already).
    pub async fn plan(
        store: &PgStore,
        args: &BenchArgs,
        selected: &[String],
    ) -> anyhow::Result<Pools> {
        let (free, max): (i64, i64) = sqlx::query_as(HEADROOM)
            .fetch_one(store.pool())
            .await
            .context("counting the connections Postgres has free")?;
        let free = u32::try_from(free.max(0)).unwrap_or(u32::MAX);
        let held = store.pool().size();
        let own = OWN_CONNECTIONS.saturating_sub(held);
        let pools = plan(free, max, own, args)?;
        let want = agentq_worker::pool_connections(args.concurrency as usize);
        let in_process = [
            "ceiling",
            "throughput",
            "overhead",
            "storage",
            "resume",
            "isolation",
        ];
        if pools.cap < want && selected.iter().any(|p| in_process.contains(&p.as_str())) {
            progress(&format!(
                "Postgres has {free} connections free (max_connections {max}): each of the {} \
                 workers' pools holds {} connections instead of {want}, as `agentq worker \
                 --concurrency {}` would (pass a --concurrency that low to measure a \
                 configuration that fits, or raise max_connections)",
                args.workers,
                pools.cap,
                pools.cap.saturating_mul(4)
            ));
        }
        Ok(pools)
    }

    /// Fail at once, naming what to change, when a part's pools would hold more than the
    /// server has free: they would wait for refused connections until they time out.
    pub fn check(&self, part: &str, need: u32) -> anyhow::Result<()> {
        let room = self.free.saturating_sub(self.own);
        if need > room {
            bail!(
                "{part}: its workers may hold {need} Postgres connections, and the server has \
                 {room} free beside the bench's own {}: raise the server's max_connections, or \
                 leave the part out (--only)",
                self.own
            );
        }
        Ok(())
    }
}

/// Each worker's share of `free` connections less the bench's `own`; an error naming
/// `--concurrency` and `--workers` when the share is below the smallest pool.
fn plan(free: u32, max: i64, own: u32, args: &BenchArgs) -> anyhow::Result<Pools> {
    let writers = args.checkpoint_writers.saturating_add(1);
    let share = free.saturating_sub(own) / args.workers.max(1);
    let cap = share.saturating_sub(writers);
    if cap < MIN_POOL {
        let want = agentq_worker::pool_connections(args.concurrency as usize);
        bail!(
            "Postgres has {free} connections free (max_connections {max}), too few for {} \
             in-process workers: each needs at least {MIN_POOL} + {writers} (as --concurrency \
             {} would open {want} + {writers}), and the bench {own} of its own. Lower --workers, \
             --concurrency or --checkpoint-writers, or raise max_connections",
            args.workers,
            args.concurrency,
        );
    }
    Ok(Pools { cap, free, own })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn args(flags: &[&str]) -> BenchArgs {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn a_roomy_server_gives_every_worker_agentq_workers_pool() {
        let p = plan(797, 800, 15, &args(&[])).unwrap();
        assert_eq!(p.main(256), 64);
        assert_eq!(p.main(64), 16);
    }

    #[test]
    fn a_stock_server_shares_its_connections_between_the_workers() {
        // 100 - 3 reserved - 1 held by the bench's store.
        let p = plan(96, 100, 15, &args(&[])).unwrap();
        // (96 - 15) / 2 = 40 each, less 3 writer connections.
        assert_eq!(p.main(256), 37);
        assert!(2 * (p.main(256) + 3) + 15 <= 96);
        assert_eq!(p.main(32), 8, "a small concurrency keeps its own pool");
    }

    #[test]
    fn too_few_connections_are_refused_naming_the_flags() {
        let e = plan(30, 100, 15, &args(&["--workers", "4"])).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("--concurrency") && msg.contains("--workers"),
            "{msg}"
        );
        assert!(msg.contains("max_connections 100"), "{msg}");
    }

    #[test]
    fn a_part_that_would_overrun_the_server_is_refused() {
        let p = plan(96, 100, 15, &args(&[])).unwrap();
        assert!(p.check("recovery", 81).is_ok());
        let e = p.check("capacity", 82).unwrap_err();
        assert!(format!("{e}").contains("max_connections"), "{e}");
    }
}
