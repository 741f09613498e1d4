//! CPU time of the processes a bench part exercises, so that every rate can also be read
//! as CPU per operation and per process, on any machine: the bench process itself (it
//! hosts the in-process workers), the Postgres server when it runs on this machine (found
//! through a backend's pid and its parent, the postmaster), and Redis (which reports its
//! own through `INFO cpu`, wherever it runs), and the MCP servers of `--tool mcp` (this
//! process's `agentq bench-mcp-server` children). A figure that cannot be had is `None`.

use std::path::Path;

use agentq_core::pg::PgStore;

use crate::turns::MCP_SERVER_COMMAND;

/// `/proc` reports process times in USER_HZ, which Linux fixes at 100 for userspace.
const USER_HZ: f64 = 100.0;

/// Where to read CPU time from; built once per run.
#[derive(Clone)]
pub struct Cpu {
    postmaster: Option<u32>,
    redis: Option<redis::aio::MultiplexedConnection>,
}

/// Cumulative CPU seconds at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub own: Option<f64>,
    pub postgres: Option<f64>,
    pub redis: Option<f64>,
    /// This process's MCP server children alive at the sample (a server that exits
    /// between two samples makes the difference `None`).
    pub mcp_servers: Option<f64>,
}

impl Sample {
    /// CPU seconds spent since `before`, per process.
    pub fn since(&self, before: &Sample) -> Sample {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?).filter(|x| *x >= 0.0);
        Sample {
            own: d(self.own, before.own),
            postgres: d(self.postgres, before.postgres),
            redis: d(self.redis, before.redis),
            mcp_servers: d(self.mcp_servers, before.mcp_servers),
        }
    }
}

impl Cpu {
    pub async fn discover(store: &PgStore, redis_url: &str) -> Cpu {
        let backend: Option<(i32,)> = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_optional(store.pool())
            .await
            .ok()
            .flatten();
        let postmaster = backend
            .and_then(|(pid,)| u32::try_from(pid).ok())
            .and_then(|pid| {
                let (ppid, _) = stat(Path::new(&format!("/proc/{pid}/stat")))?;
                // The same pid on this machine could be anything if Postgres is remote.
                let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
                comm.trim().starts_with("postgres").then_some(ppid)
            });
        let redis = match redis::Client::open(redis_url) {
            Ok(c) => c.get_multiplexed_async_connection().await.ok(),
            Err(_) => None,
        };
        Cpu { postmaster, redis }
    }

    pub async fn sample(&self) -> Sample {
        Sample {
            own: stat(Path::new("/proc/self/stat")).map(|(_, t)| t.own),
            postgres: self.postmaster.and_then(postgres_secs),
            redis: match &self.redis {
                Some(c) => redis_secs(&mut c.clone()).await,
                None => None,
            },
            mcp_servers: mcp_servers_secs(),
        }
    }
}

/// Times of one process, in seconds.
struct Times {
    own: f64,
    /// Of its children that exited and were waited for.
    reaped: f64,
}

/// `(ppid, times)` from a `/proc/<pid>/stat` file.
fn stat(path: &Path) -> Option<(u32, Times)> {
    let text = std::fs::read_to_string(path).ok()?;
    // `comm` is in parentheses and may hold spaces: the fields start after the last `)`.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime), counted from `pid` = 1.
    let n = |i: usize| f.get(i - 3)?.parse::<f64>().ok();
    let ppid = f.get(1)?.parse().ok()?;
    Some((
        ppid,
        Times {
            own: (n(14)? + n(15)?) / USER_HZ,
            reaped: (n(16)? + n(17)?) / USER_HZ,
        },
    ))
}

/// A single-threaded process's CPU time to the nanosecond: the first field of
/// `/proc/<pid>/schedstat` (`stat` rounds down to whole ticks, 10 ms, which over a hundred
/// backends that start within a short window undercounts by a sizeable fraction).
fn exact_secs(dir: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join("schedstat")).ok()?;
    let ns: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

/// The postmaster and every live child of it, plus the children it already reaped (so a
/// backend that exits between two samples keeps counting, if only to the tick).
fn postgres_secs(postmaster: u32) -> Option<f64> {
    let dir = Path::new("/proc").join(postmaster.to_string());
    let (_, pm) = stat(&dir.join("stat"))?;
    let mut total = exact_secs(&dir).unwrap_or(pm.own) + pm.reaped;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Some((ppid, t)) = stat(&entry.path().join("stat"))
            && ppid == postmaster
        {
            total += exact_secs(&entry.path()).unwrap_or(t.own);
        }
    }
    Some(total)
}

/// Every live child of this process that runs `agentq bench-mcp-server`, all its
/// threads (to the tick: a server is multi-threaded, and `schedstat` is one thread's).
fn mcp_servers_secs() -> Option<f64> {
    let me = std::process::id();
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some((ppid, t)) = stat(&entry.path().join("stat")) else {
            continue;
        };
        if ppid != me {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == MCP_SERVER_COMMAND.as_bytes())
        {
            total += t.own;
        }
    }
    Some(total)
}

/// `used_cpu_sys + used_cpu_user` of `INFO cpu`: all of the server's threads.
async fn redis_secs(conn: &mut redis::aio::MultiplexedConnection) -> Option<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.ok()?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some(field("used_cpu_sys")? + field("used_cpu_user")?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn stat_reads_the_fields_after_a_comm_with_spaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("stat");
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
        // utime stime cutime cstime ...
        std::fs::write(
            &p,
            "42 (post gres: a) S 7 42 42 0 -1 4194304 10 0 0 0 250 50 30 20 20 0 1 0",
        )
        .unwrap();
        let (ppid, t) = stat(&p).unwrap();
        assert_eq!(ppid, 7);
        assert!((t.own - 3.0).abs() < 1e-9, "{}", t.own);
        assert!((t.reaped - 0.5).abs() < 1e-9, "{}", t.reaped);
    }

    #[test]
    fn exact_time_is_read_from_schedstat() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("schedstat"), "1234567890 55 3\n").unwrap();
        let secs = exact_secs(dir.path()).unwrap();
        assert!((secs - 1.23456789).abs() < 1e-12, "{secs}");
        assert!(exact_secs(&dir.path().join("missing")).is_none());
    }

    #[test]
    fn this_process_cpu_time_advances_with_work() {
        let (_, before) = stat(Path::new("/proc/self/stat")).unwrap();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        loop {
            for _ in 0..1_000_000 {
                x = x.wrapping_add(std::hint::black_box(1));
            }
            let (_, now) = stat(Path::new("/proc/self/stat")).unwrap();
            if now.own - before.own >= 0.05 {
                break;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(60),
                "no CPU time counted after a minute of work ({x})"
            );
        }
    }
}
