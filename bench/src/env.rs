//! Where a run happens ([`Env`]): the Postgres and Redis it measures (given, or private
//! ones started for it), an admin store, the run's id and scratch directory, and what
//! every part reads of the flags, the CPU and the pools.

use std::path::PathBuf;

use anyhow::Context;

use agentq_core::pg::PgStore;
use agentq_fixtures::{Durability, PostgresOptions, PostgresServer, RedisServer};

use crate::args::BenchArgs;
use crate::cpu;
use crate::pools;
use crate::report::progress;

/// Where the run happens: the services, an admin store, names and a scratch directory.
pub(crate) struct Env {
    pub db_url: String,
    pub redis_url: String,
    pub store: PgStore,
    /// Short random id; every queue, table and key of the run carries it.
    pub run: String,
    pub scratch: PathBuf,
    pub args: BenchArgs,
    pub cpu: cpu::Cpu,
    /// How many connections each in-process worker's pool holds.
    pub pools: pools::Pools,
    pub(crate) _private: Option<Private>,
}

/// The servers of `--private`, stopped (and their files removed) when dropped.
pub(crate) struct Private {
    _postgres: PostgresServer,
    _redis: RedisServer,
}

/// Settings of the `--private` Postgres: the production durability settings, since the
/// bench measures what durable commits cost, and room for every pool of a large run.
fn private_postgres() -> PostgresOptions {
    PostgresOptions {
        durability: Durability::Durable,
        max_connections: 800,
        shared_buffers_mb: 256,
    }
}

impl Env {
    pub fn queue(&self, part: &str) -> String {
        format!("bench-{}-{part}", self.run)
    }

    /// The tool the in-process parts' sessions call (`--tool`, as sessions name it).
    pub fn tool(&self) -> &'static str {
        crate::turns::session_tool(&self.args.tool)
    }

    /// The `agentq` binary whose subcommands the bench starts as children (workers, the
    /// MCP server): [`BenchArgs::agentq_binary`], by default this very executable.
    pub fn agentq_binary(&self) -> anyhow::Result<PathBuf> {
        match &self.args.agentq_binary {
            Some(exe) => Ok(exe.clone()),
            None => std::env::current_exe().context("locating the agentq binary"),
        }
    }

    /// The same run against another database (a scratch one of the storage part).
    pub fn derived(&self, db_url: String, store: PgStore) -> Env {
        Env {
            db_url,
            redis_url: self.redis_url.clone(),
            store,
            run: self.run.clone(),
            scratch: self.scratch.clone(),
            args: self.args.clone(),
            cpu: self.cpu.clone(),
            pools: self.pools,
            _private: None,
        }
    }
}

/// The Postgres and Redis URLs of the run: private servers with `--private`, else the
/// ones given.
pub(crate) fn services(args: &BenchArgs) -> anyhow::Result<(String, String, Option<Private>)> {
    if args.private {
        progress("starting a private Redis and a durable private Postgres");
        let redis = RedisServer::start()?;
        let postgres = PostgresServer::start_with(private_postgres())?;
        let urls = (postgres.database_url("postgres"), redis.url());
        return Ok((
            urls.0,
            urls.1,
            Some(Private {
                _postgres: postgres,
                _redis: redis,
            }),
        ));
    }
    Ok((
        args.database_url
            .clone()
            .context("--database-url (or AGENTQ_DATABASE_URL) is required, or --private")?,
        args.redis_url
            .clone()
            .context("--redis-url (or AGENTQ_REDIS_URL) is required, or --private")?,
        None,
    ))
}
