//! Private, throwaway Redis and Postgres for `agentq bench --private`.
//!
//! Unlike the test kit's servers these keep the *production* durability settings —
//! Postgres with `fsync=on`, `synchronous_commit=on`, `full_page_writes=on` — since the
//! benchmark measures what durable commits cost. Redis runs without persistence (the queue
//! is rebuilt from Postgres by the sweeper when Redis loses it).
//!
//! Each server gets a watchdog: a `sh` whose stdin is a pipe this process holds. When the
//! process ends, however it ends, the pipe closes and the watchdog stops the server and
//! removes its directory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Stops the server (SIGINT to the PID in its file, SIGKILL after 30 s) and removes the
/// directory once stdin closes. Ignores terminal signals so a Ctrl-C cannot stop it first.
const WATCHDOG: &str = r#"trap '' INT TERM HUP
cat >/dev/null
pid=$(head -n 1 "$2" 2>/dev/null)
if [ -n "$pid" ] && kill -"$3" "$pid" 2>/dev/null; then
    i=0
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    kill -KILL "$pid" 2>/dev/null
fi
rm -rf "$1"
"#;

struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    fn spawn(dir: &Path, pid_file: &Path, signal: &str) -> Result<Watchdog> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(dir)
            .arg(pid_file)
            .arg(signal)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning the watchdog shell")?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// A private server: its URL, kept alive as long as the value lives.
pub struct Private {
    pub url: String,
    _watchdog: Watchdog,
    _child: Child,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

fn temp_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn log_file(path: &Path) -> Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// `redis-server` (or `$AGENTQ_REDIS_SERVER`) on a free port, without persistence.
pub fn start_redis() -> Result<Private> {
    let bin = std::env::var("AGENTQ_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let dir = temp_dir("agentq-bench-redis")?;
    let port = free_port()?;
    let log = dir.join("redis.log");
    let pid_file = dir.join("redis.pid");
    let child = Command::new(&bin)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(log_file(&log)?)
        .stderr(log_file(&dir.join("redis.err"))?)
        .spawn()
        .with_context(|| format!("spawning {bin} (install redis-server)"))?;
    std::fs::write(&pid_file, child.id().to_string())?;
    let watchdog = Watchdog::spawn(&dir, &pid_file, "KILL")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("redis-server did not start. Log:\n{}", log_tail(&log));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Private {
        url: format!("redis://127.0.0.1:{port}"),
        _watchdog: watchdog,
        _child: child,
    })
}

/// The PostgreSQL bin directory: `$AGENTQ_PG_BIN`, the directory of `initdb` on `PATH`
/// (symlinks resolved), or the highest `/usr/lib/postgresql/*/bin`.
fn pg_bin() -> Result<PathBuf> {
    let ok = |d: &Path| d.join("initdb").is_file() && d.join("postgres").is_file();
    if let Ok(d) = std::env::var("AGENTQ_PG_BIN") {
        return Ok(PathBuf::from(d));
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for p in std::env::split_paths(&paths) {
            let initdb = p.join("initdb");
            if initdb.is_file()
                && let Some(d) = std::fs::canonicalize(&initdb)
                    .ok()
                    .and_then(|r| r.parent().map(Path::to_path_buf))
                && ok(&d)
            {
                return Ok(d);
            }
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .collect()
        })
        .unwrap_or_default();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.into_iter()
        .rev()
        .find(|d| ok(d))
        .context("PostgreSQL server binaries (initdb, postgres) not found: set AGENTQ_PG_BIN or install postgresql")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `initdb` + `postgres` on a free port with durable settings; as `postgres` (via
/// `runuser`) when we are root, since Postgres refuses to run as root.
pub fn start_postgres(max_connections: u32) -> Result<Private> {
    let bin = pg_bin()?;
    let dir = temp_dir("agentq-bench-pg")?;
    let data = dir.join("data");
    let run_as = is_root().then(|| std::env::var("AGENTQ_PG_USER").unwrap_or("postgres".into()));
    if let Some(user) = &run_as {
        let st = Command::new("chown")
            .arg("-R")
            .arg(format!("{user}:"))
            .arg(&dir)
            .status()?;
        if !st.success() {
            bail!("chown {} to {user} failed", dir.display());
        }
    }
    let cmd = |prog: &str| {
        let mut c = match &run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(bin.join(prog));
                c
            }
            None => Command::new(bin.join(prog)),
        };
        c.current_dir(&dir).stdin(Stdio::null());
        c
    };
    let initdb_log = dir.join("initdb.log");
    let st = cmd("initdb")
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"])
        .stdout(log_file(&initdb_log)?)
        .stderr(Stdio::inherit())
        .status()
        .context("running initdb")?;
    if !st.success() {
        bail!("initdb failed. Log:\n{}", log_tail(&initdb_log));
    }
    let port = free_port()?;
    let log = dir.join("postgres.log");
    let mut logf = log_file(&log)?;
    writeln!(logf, "# agentq bench private postgres")?;
    let child = cmd("postgres")
        .arg("-D")
        .arg(&data)
        .args(["-p", &port.to_string(), "-k"])
        .arg(&dir)
        .args(["-c", "listen_addresses=127.0.0.1"])
        .args(["-c", &format!("max_connections={max_connections}")])
        .args(["-c", "shared_buffers=256MB"])
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .context("spawning postgres")?;
    let pid_file = data.join("postmaster.pid");
    let watchdog = Watchdog::spawn(&dir, &pid_file, "INT")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = std::fs::read_to_string(&pid_file)
            .map(|s| s.lines().any(|l| l.trim() == "ready"))
            .unwrap_or(false);
        if up && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            bail!("postgres did not start. Log:\n{}", log_tail(&log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Private {
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        _watchdog: watchdog,
        _child: child,
    })
}
