//! Private, throwaway Redis and Postgres servers for tests.
//!
//! Every server runs as a child process of the test binary, on a free port of 127.0.0.1,
//! with its files in its own temporary directory. Tests can stop, kill (SIGKILL) and
//! restart a server mid-test; a restart reuses the port and, for Postgres, the data
//! directory. Nothing here touches a system Redis or Postgres.
//!
//! * [`RedisServer::start`] takes a few milliseconds: start one per test.
//! * [`shared_postgres`] starts one Postgres per test binary (the first call runs `initdb`);
//!   each test takes its own database from [`PostgresServer::fresh_database`]. Tests that
//!   stop, kill or restart Postgres start a private [`PostgresServer`] instead.
//! * [`PostgresServer::start_with`] takes [`PostgresOptions`]: production durability
//!   (`agentq bench --private` measures what durable commits cost), or the connection limit
//!   of a stock server (`max_connections=100`) for tests of how pools are sized.
//!
//! # Cleanup
//!
//! A server owned by a value is stopped, and its directory removed, when the value is
//! dropped (also when a test panics). The shared Postgres lives in a `static`, which is
//! never dropped, and a test binary can also die without unwinding (a SIGKILL, an abort, a
//! timeout in CI). So each server also gets a *watchdog*: a small `sh` process whose stdin
//! is a pipe held open by the test process. The harness writes the current server PID into
//! that pipe on every (re)start. When the test process ends, however it ends, the kernel
//! closes the write end; the watchdog's `read` sees end-of-file, it signals the last PID
//! (SIGINT — a fast shutdown — for Postgres, SIGKILL for Redis), waits for the server to
//! exit (up to 30 s, then SIGKILL), SIGKILLs any other process still working in the
//! temporary directory (an `initdb` cut short, orphaned backends) and removes the
//! directory. No polling, no timers while the tests run; the watchdog ignores
//! SIGINT/SIGTERM/SIGHUP so a Ctrl-C on the terminal cannot stop it before it has cleaned
//! up. When a server value is dropped normally, it stops the server itself, ends its
//! watchdog and removes the directory.
//!
//! Server output goes to log files in the temporary directory (never to the test's
//! stdout/stderr: a child holding those open would keep a `cargo test | tee` pipeline
//! waiting), and every start-up error quotes the log's last lines.
//!
//! # Environment
//!
//! * `AGENTQ_PG_BIN` — the PostgreSQL bin directory (with `initdb` and `postgres`); by
//!   default `initdb` on `PATH` (symlinks resolved), else the highest
//!   `/usr/lib/postgresql/*/bin`.
//! * `AGENTQ_REDIS_SERVER` — the `redis-server` binary; by default the one on `PATH`.
//! * `AGENTQ_PG_USER` — the unprivileged user `initdb` and `postgres` run as when the tests
//!   run as root (they refuse to run as root); default `postgres`.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};

const REDIS_START_TIMEOUT: Duration = Duration::from_secs(10);
const PG_START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
const PORT_FREE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many fresh ports to try when the chosen one was taken between probe and bind.
const PORT_ATTEMPTS: usize = 5;
const LOG_TAIL_LINES: usize = 40;

// ---------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------

/// A private `redis-server` on `127.0.0.1`. Killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    bin: PathBuf,
    port: u16,
    persistent: bool,
    log: PathBuf,
    child: Option<Child>,
    watchdog: Watchdog,
    // Last: removed after the server and the watchdog are gone.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start a Redis without persistence (`--save "" --appendonly no`): a restart empties it.
    pub fn start() -> Result<RedisServer> {
        Self::start_inner(false)
    }

    /// Start a Redis with an append-only file synced on every write
    /// (`--appendonly yes --appendfsync always`): its data survives [`stop`](Self::stop),
    /// [`kill`](Self::kill) and [`restart`](Self::restart).
    pub fn start_persistent() -> Result<RedisServer> {
        Self::start_inner(true)
    }

    fn start_inner(persistent: bool) -> Result<RedisServer> {
        let bin = redis_bin()?;
        let dir = tempfile::Builder::new()
            .prefix("agentq-redis-")
            .tempdir()
            .context("creating a temporary directory for redis-server")?;
        let watchdog = Watchdog::spawn("KILL", dir.path())?;
        let mut server = RedisServer {
            bin,
            port: 0,
            persistent,
            log: dir.path().join("redis.log"),
            child: None,
            watchdog,
            dir,
        };
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()?;
            let log_start = file_len(&server.log);
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(e) if port_conflict(&server.log, log_start) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("redis-server: no free port")))
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's working directory (RDB/AOF files, `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Whether the process is running (it may have been stopped or killed).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Send `PING` over a fresh TCP connection; Ok when the answer is `+PONG`.
    pub fn ping(&self) -> Result<()> {
        redis_ping(self.port).with_context(|| format!("PING redis on 127.0.0.1:{}", self.port))
    }

    /// Wait until no client is blocked in a command on the server (`blocked_clients` of
    /// `INFO clients` is 0), for at most `bound`. A client cancels a blocking read by
    /// dropping it, and its connection goes away asynchronously: until Redis has seen it
    /// go, that read can still take entries.
    pub fn wait_until_unblocked(&self, bound: Duration) -> Result<()> {
        let deadline = Instant::now() + bound;
        loop {
            let blocked: u64 =
                redis_info_field(self.port, "clients", "blocked_clients")?.parse()?;
            if blocked == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("{blocked} clients still blocked after {bound:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Client connections open on the server (`connected_clients` of `INFO clients`),
    /// not counting the one asking.
    pub fn connected_clients(&self) -> Result<u64> {
        let n: u64 = redis_info_field(self.port, "clients", "connected_clients")?.parse()?;
        Ok(n.saturating_sub(1))
    }

    /// Graceful stop (SIGTERM, then SIGKILL after 30 s) and wait. No-op when not running.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        self.watchdog.set_pid(0);
        if child.try_wait()?.is_none() {
            signal(child.id(), "TERM")?;
            if wait_timeout(&mut child, STOP_TIMEOUT)?.is_none() {
                kill_child(&mut child);
                bail!(
                    "redis-server on port {} ignored SIGTERM for {STOP_TIMEOUT:?}; killed it. Log tail:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
        }
        Ok(())
    }

    /// SIGKILL the server and reap it: a crash. No-op when not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.watchdog.set_pid(0);
            kill_child(&mut child);
        }
    }

    /// Stop the server if it runs, then start it again on the same port and directory
    /// (waiting up to 10 s for the port to become free).
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        wait_port_free(self.port, PORT_FREE_TIMEOUT)?;
        self.spawn_and_wait()
    }

    fn spawn_and_wait(&mut self) -> Result<()> {
        let port = self.port.to_string();
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--port", &port, "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", if self.persistent { "yes" } else { "no" }])
            .args([
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--logfile",
                "",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .current_dir(self.dir.path());
        let child = spawn_logged(&mut cmd, &self.log)
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        self.watchdog.set_pid(child.id());
        self.child = Some(child);

        let deadline = Instant::now() + REDIS_START_TIMEOUT;
        loop {
            if let Some(status) = self.child_exited() {
                bail!(
                    "{} on 127.0.0.1:{} exited during start-up ({status}). Log tail:\n{}",
                    self.bin.display(),
                    self.port,
                    self.log_tail()
                );
            }
            // Ready when the server on the port is ours (not another test's that grabbed
            // the port between our probe and its bind).
            let ours = self.child.as_ref().map(Child::id);
            if redis_server_pid(self.port).ok() == ours {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "{} on 127.0.0.1:{} did not answer PING within {REDIS_START_TIMEOUT:?}. Log tail:\n{}",
                    self.bin.display(),
                    self.port,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// When the child has exited, reap it and return its status.
    fn child_exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.watchdog.set_pid(0);
        Some(status)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        self.watchdog.finish();
    }
}

fn redis_ping(port: u16) -> Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64];
    while !buf.ends_with(b"\r\n") {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let _ = s.shutdown(Shutdown::Both);
    if buf.starts_with(b"+PONG") {
        Ok(())
    } else {
        bail!("unexpected answer {:?}", String::from_utf8_lossy(&buf))
    }
}

/// `INFO server` over a fresh TCP connection; the server's `process_id`.
fn redis_server_pid(port: u16) -> Result<u32> {
    Ok(redis_info_field(port, "server", "process_id")?.parse()?)
}

/// One field of `INFO <section>`, read over a fresh TCP connection.
fn redis_info_field(port: u16, section: &str, field: &str) -> Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("*2\r\n$4\r\nINFO\r\n${}\r\n{section}\r\n", section.len()).as_bytes())?;
    // A bulk string: `$LEN\r\n` then LEN bytes and `\r\n`.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("connection closed");
        }
        buf.extend_from_slice(&chunk[..n]);
        if !buf.starts_with(b"$") {
            bail!("unexpected answer {:?}", String::from_utf8_lossy(&buf));
        }
        let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
            continue;
        };
        let len: usize = std::str::from_utf8(&buf[1..eol])?.parse()?;
        if buf.len() >= eol + 2 + len {
            let body = String::from_utf8_lossy(&buf[eol + 2..eol + 2 + len]);
            let prefix = format!("{field}:");
            return body
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .map(|v| v.trim().to_string())
                .ok_or_else(|| anyhow!("no {field} in INFO {section}"));
        }
    }
}

fn redis_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("AGENTQ_REDIS_SERVER") {
        let p = PathBuf::from(p);
        if is_executable(&p) {
            return Ok(p);
        }
        bail!(
            "AGENTQ_REDIS_SERVER={} is not an executable file",
            p.display()
        );
    }
    find_on_path("redis-server").ok_or_else(|| {
        anyhow!("redis-server not found on PATH: install it (Debian: apt-get install redis-server) or set AGENTQ_REDIS_SERVER")
    })
}

// ---------------------------------------------------------------------------------------
// Postgres
// ---------------------------------------------------------------------------------------

/// What a [`PostgresServer`] keeps of a commit when it (or the machine) crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fsync=off synchronous_commit=off full_page_writes=off`: the fastest, for tests that
    /// never kill the server (a kill may lose the last ~0.5 s of commits).
    Fast,
    /// `synchronous_commit=on` with `fsync=off`: committed data survives a kill of the
    /// server (not an OS crash), at one `write()` per commit.
    CrashSafe,
    /// Production settings: `fsync=on synchronous_commit=on full_page_writes=on`, and
    /// `initdb` syncs its files. For measuring what durable commits cost.
    Durable,
}

/// Settings of a [`PostgresServer`]; the default is the tests' (see
/// [`PostgresServer::start`]).
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub durability: Durability,
    /// `max_connections` (with Postgres's 3 reserved for superusers among them).
    pub max_connections: u32,
    /// `shared_buffers`, in MiB.
    pub shared_buffers_mb: u32,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            durability: Durability::Fast,
            max_connections: 300,
            shared_buffers_mb: 128,
        }
    }
}

impl PostgresOptions {
    /// The `-c` settings of the server.
    fn settings(&self) -> Vec<String> {
        let on = |b: bool| if b { "on" } else { "off" };
        let durable = self.durability == Durability::Durable;
        let sync = self.durability != Durability::Fast;
        vec![
            format!("fsync={}", on(durable)),
            format!("synchronous_commit={}", on(sync)),
            format!("full_page_writes={}", on(durable)),
            format!("max_connections={}", self.max_connections),
            format!("shared_buffers={}MB", self.shared_buffers_mb),
        ]
    }
}

/// A private PostgreSQL cluster on `127.0.0.1` with trust authentication for the
/// `postgres` superuser. Stopped, and its directory removed, when dropped.
#[derive(Debug)]
pub struct PostgresServer {
    bin_dir: PathBuf,
    /// `Some(user)` when the tests run as root: `initdb` and `postgres` then run as `user`
    /// through `runuser -u user --`.
    run_as: Option<String>,
    port: u16,
    options: PostgresOptions,
    data: PathBuf,
    sock: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    postmaster_pid: Option<u32>,
    watchdog: Watchdog,
    // Last: removed after the server and the watchdog are gone.
    dir: tempfile::TempDir,
}

impl PostgresServer {
    /// `initdb` a new cluster in a temporary directory and start it, tuned for tests:
    /// `fsync=off synchronous_commit=off full_page_writes=off max_connections=300
    /// shared_buffers=128MB`.
    ///
    /// With `synchronous_commit=off` a commit can return before its WAL reaches the kernel,
    /// so a [`kill`](Self::kill) may lose the last ~0.5 s of commits. Tests that kill the
    /// server and expect committed rows to survive should use
    /// [`start_crash_safe`](Self::start_crash_safe).
    pub fn start() -> Result<PostgresServer> {
        Self::start_with(PostgresOptions::default())
    }

    /// Like [`start`](Self::start) but with `synchronous_commit=on`: every commit is in the
    /// kernel before it returns, so committed data survives [`kill`](Self::kill) (a process
    /// crash; `fsync` stays off, so not an OS crash). With `fsync=off` this costs one
    /// `write()` per commit.
    pub fn start_crash_safe() -> Result<PostgresServer> {
        Self::start_with(PostgresOptions {
            durability: Durability::CrashSafe,
            ..PostgresOptions::default()
        })
    }

    /// `initdb` a new cluster and start it with these settings (see [`PostgresOptions`]).
    pub fn start_with(options: PostgresOptions) -> Result<PostgresServer> {
        let bin_dir = pg_bin_dir()?;
        let run_as = if is_root()? {
            let user = std::env::var("AGENTQ_PG_USER").unwrap_or_else(|_| "postgres".into());
            check_run_as(&user)?;
            Some(user)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("agentq-pg-")
            .tempdir()
            .context("creating a temporary directory for postgres")?;
        let sock = dir.path().join("sock");
        fs::create_dir(&sock).with_context(|| format!("creating {}", sock.display()))?;
        if let Some(user) = &run_as {
            run_checked(
                Command::new("chown")
                    .arg("-R")
                    .arg(format!("{user}:"))
                    .arg(dir.path()),
                "chown",
            )?;
        }
        let watchdog = Watchdog::spawn("INT", dir.path())?;
        let mut server = PostgresServer {
            bin_dir,
            run_as,
            port: 0,
            options,
            data: dir.path().join("data"),
            sock,
            log: dir.path().join("postgres.log"),
            child: None,
            postmaster_pid: None,
            watchdog,
            dir,
        };
        server.initdb()?;
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port()?;
            let log_start = file_len(&server.log);
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                Err(e) if port_conflict(&server.log, log_start) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("postgres: no free port")))
    }

    /// `postgres://postgres@127.0.0.1:PORT` (no database: libpq and sqlx then use `postgres`).
    pub fn base_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// `postgres://postgres@127.0.0.1:PORT/NAME`
    pub fn database_url(&self, name: &str) -> String {
        format!("{}/{name}", self.base_url())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Whether the server process is running (it may have been stopped or killed).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `CREATE DATABASE name` (with `createdb`); returns its URL. `name` must be a plain
    /// identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes).
    pub fn create_database(&self, name: &str) -> Result<String> {
        let valid = !name.is_empty()
            && name.len() <= 63
            && !name.as_bytes()[0].is_ascii_digit()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            bail!("invalid database name {name:?}: use [A-Za-z_][A-Za-z0-9_]*, at most 63 bytes");
        }
        let port = self.port.to_string();
        let mut cmd = self.client("createdb")?;
        cmd.args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
            .args(["--maintenance-db=postgres", name]);
        run_checked(&mut cmd, "createdb")
            .with_context(|| format!("creating database {name} on 127.0.0.1:{port}"))?;
        Ok(self.database_url(name))
    }

    /// Create a database with a new unique name; returns its URL.
    pub fn fresh_database(&self) -> Result<String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("t{}_{n}_{nanos:08x}", std::process::id());
        self.create_database(&name)
    }

    /// Run SQL with `psql` against `database` (a name, e.g. `postgres`, or a URL) and
    /// return its unaligned, tuples-only output, trimmed. Stops at the first error.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String> {
        let port = self.port.to_string();
        let mut cmd = self.client("psql")?;
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                database,
            ])
            .args(["-c", sql]);
        let out = run_checked(&mut cmd, "psql")
            .with_context(|| format!("psql on 127.0.0.1:{port}, database {database}: {sql}"))?;
        Ok(out.trim().to_string())
    }

    /// Fast shutdown (SIGINT to the postmaster) and wait. No-op when not running.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = self.postmaster_pid.take().unwrap_or(child.id());
        self.watchdog.set_pid(0);
        if child.try_wait()?.is_none() {
            signal(pid, "INT")?;
            if wait_timeout(&mut child, STOP_TIMEOUT)?.is_none() {
                self.kill_all(pid, &mut child);
                bail!(
                    "postgres on port {} did not shut down within {STOP_TIMEOUT:?}; killed it. Log tail:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
        }
        Ok(())
    }

    /// SIGKILL the postmaster and every other server process (a crash of the whole
    /// server), and wait until they are gone. No-op when not running. A later
    /// [`restart`](Self::restart) runs crash recovery.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = self.postmaster_pid.take().unwrap_or(child.id());
            self.watchdog.set_pid(0);
            self.kill_all(pid, &mut child);
        }
    }

    /// Stop the server if it runs, then start it again on the same port and data directory
    /// (after a [`kill`](Self::kill): with crash recovery).
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        wait_port_free(self.port, PORT_FREE_TIMEOUT)?;
        self.spawn_and_wait()
    }

    fn kill_all(&self, postmaster: u32, child: &mut Child) {
        let _ = signal(postmaster, "KILL");
        // Under runuser, let runuser reap the postmaster and exit by itself: killing runuser
        // too would leave the postmaster a zombie for init to reap.
        if wait_timeout(child, Duration::from_secs(10))
            .ok()
            .flatten()
            .is_none()
        {
            kill_child(child);
        }
        // The other server processes (backends, checkpointer, ...) all have the data
        // directory as their working directory, also once orphaned. Kill until none is
        // left, so a restart does not find the old shared memory still attached.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = pids_with_cwd(&self.data);
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for pid in pids {
                let _ = signal(pid, "KILL");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Everything is dead: the lock file is stale. Postgres ignores a stale one unless its
        // PID still looks alive (a zombie not yet reaped by init, or a PID reused by another
        // process of the same user); remove it so a restart never trips over it.
        let _ = fs::remove_file(self.data.join("postmaster.pid"));
    }

    /// A command for a server binary, run as the unprivileged user when we are root.
    fn server_command(&self, prog: &str) -> Command {
        let bin = self.bin_dir.join(prog);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.current_dir(self.dir.path());
        cmd
    }

    /// A command for a client binary (`psql`, `createdb`, `pg_isready`).
    fn client(&self, prog: &str) -> Result<Command> {
        let bin = client_bin(&self.bin_dir, prog).ok_or_else(|| {
            anyhow!(
                "{prog} not found in {} nor on PATH: install the PostgreSQL client (Debian: apt-get install postgresql-client)",
                self.bin_dir.display()
            )
        })?;
        let mut cmd = Command::new(bin);
        for var in [
            "PGSSLMODE",
            "PGOPTIONS",
            "PGSERVICE",
            "PGSERVICEFILE",
            "PGPASSWORD",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("PGCONNECT_TIMEOUT", "10").stdin(Stdio::null());
        Ok(cmd)
    }

    fn initdb(&self) -> Result<()> {
        let log = self.dir.path().join("initdb.log");
        let mut cmd = self.server_command("initdb");
        cmd.arg("-D").arg(&self.data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        // A durable cluster starts from files that are on disk, as a production one does.
        if self.options.durability != Durability::Durable {
            cmd.arg("--no-sync");
        }
        let mut child = spawn_logged(&mut cmd, &log)
            .with_context(|| format!("spawning {}", self.bin_dir.join("initdb").display()))?;
        let status = child.wait().context("waiting for initdb")?;
        if !status.success() {
            bail!(
                "{} -D {} failed ({status}){}. Output tail:\n{}",
                self.bin_dir.join("initdb").display(),
                self.data.display(),
                match &self.run_as {
                    Some(u) => format!(" running as {u} via runuser"),
                    None => String::new(),
                },
                log_tail(&log)
            );
        }
        Ok(())
    }

    fn spawn_and_wait(&mut self) -> Result<()> {
        let port = self.port.to_string();
        let mut cmd = self.server_command("postgres");
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-p", &port, "-k"])
            .arg(&self.sock)
            .args(["-c", "listen_addresses=127.0.0.1"]);
        for setting in self.options.settings() {
            cmd.arg("-c").arg(setting);
        }
        let child = spawn_logged(&mut cmd, &self.log)
            .with_context(|| format!("spawning {}", self.bin_dir.join("postgres").display()))?;
        // Without runuser the child is the postmaster: the watchdog knows it already.
        if self.run_as.is_none() {
            self.watchdog.set_pid(child.id());
        }
        self.child = Some(child);

        let isready = client_bin(&self.bin_dir, "pg_isready");
        let deadline = Instant::now() + PG_START_TIMEOUT;
        loop {
            // Tell the watchdog about the postmaster as soon as it shows up, so it is not
            // left running if this process dies during start-up.
            if self.postmaster_pid.is_none()
                && let Some(pid) = self.read_postmaster_pid()
            {
                self.postmaster_pid = Some(pid);
                self.watchdog.set_pid(pid);
            }
            if let Some(status) = self.child_exited() {
                bail!(
                    "postgres on 127.0.0.1:{port} (data {}) exited during start-up ({status}). Log tail:\n{}",
                    self.data.display(),
                    self.log_tail()
                );
            }
            if self.ready(isready.as_deref()) {
                break;
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "postgres on 127.0.0.1:{port} (data {}) not ready within {PG_START_TIMEOUT:?}. Log tail:\n{}",
                    self.data.display(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Under runuser the postmaster is a grandchild: its PID is in postmaster.pid.
        if self.postmaster_pid.is_none() {
            match self.read_postmaster_pid() {
                Some(pid) => {
                    self.postmaster_pid = Some(pid);
                    self.watchdog.set_pid(pid);
                }
                None => {
                    self.kill();
                    bail!(
                        "postgres on 127.0.0.1:{port}: cannot read the postmaster PID from {}",
                        self.data.join("postmaster.pid").display()
                    );
                }
            }
        }
        Ok(())
    }

    /// The PID in `postmaster.pid`, if that process runs in our data directory.
    fn read_postmaster_pid(&self) -> Option<u32> {
        let text = fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let pid = text.lines().next()?.trim().parse::<u32>().ok()?;
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        (cwd == fs::canonicalize(&self.data).ok()?).then_some(pid)
    }

    fn ready(&self, isready: Option<&Path>) -> bool {
        // Our postmaster writes `ready` into line 8 of postmaster.pid once it listens and
        // accepts connections; checking it first means a server of another test that took
        // the port between our probe and our bind is never mistaken for ours.
        let status = fs::read_to_string(self.data.join("postmaster.pid")).unwrap_or_default();
        if status.lines().nth(7).map(str::trim) != Some("ready") {
            return false;
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
            return false;
        }
        let Some(isready) = isready else {
            return true;
        };
        let port = self.port.to_string();
        Command::new(isready)
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-t",
                "2",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn child_exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        self.postmaster_pid = None;
        self.watchdog.set_pid(0);
        Some(status)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.stop().is_err() {
            self.kill();
        }
        self.watchdog.finish();
    }
}

/// One Postgres per test binary, started on first use and shut down by its watchdog when
/// the process exits. Tests must not stop it: each takes its own database with
/// [`PostgresServer::fresh_database`]. A failed start is remembered, so every test that asks
/// gets the same error without paying for another attempt.
pub fn shared_postgres() -> Result<&'static PostgresServer> {
    static SHARED: OnceLock<std::result::Result<PostgresServer, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| PostgresServer::start().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("shared postgres failed to start: {e}"))
}

/// The PostgreSQL bin directory: `$AGENTQ_PG_BIN`, else `initdb` on `PATH` (symlinks
/// resolved, so Debian's wrappers lead to the versioned directory), else the highest
/// `/usr/lib/postgresql/*/bin`.
pub fn pg_bin_dir() -> Result<PathBuf> {
    let has_server =
        |d: &Path| is_executable(&d.join("initdb")) && is_executable(&d.join("postgres"));
    if let Some(d) = std::env::var_os("AGENTQ_PG_BIN") {
        let d = PathBuf::from(d);
        if has_server(&d) {
            return Ok(d);
        }
        bail!(
            "AGENTQ_PG_BIN={} has no initdb and postgres executables",
            d.display()
        );
    }
    if let Some(initdb) = find_on_path("initdb") {
        let real = fs::canonicalize(&initdb).unwrap_or(initdb);
        if let Some(d) = real.parent()
            && has_server(d)
        {
            return Ok(d.to_path_buf());
        }
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name
                .split('.')
                .map(|p| p.parse::<u32>().ok())
                .collect::<Option<Vec<_>>>()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        anyhow!(
            "PostgreSQL server binaries (initdb, postgres) not found in $AGENTQ_PG_BIN, on PATH or in /usr/lib/postgresql/*/bin: install them (Debian: apt-get install postgresql)"
        )
    })
}

fn client_bin(bin_dir: &Path, prog: &str) -> Option<PathBuf> {
    let p = bin_dir.join(prog);
    if is_executable(&p) {
        Some(p)
    } else {
        find_on_path(prog)
    }
}

fn check_run_as(user: &str) -> Result<()> {
    if find_on_path("runuser").is_none() {
        bail!(
            "running as root, but runuser (util-linux) is not on PATH: initdb and postgres refuse to run as root"
        );
    }
    let ok = Command::new("id")
        .args(["-u", user])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "running as root, but user {user:?} does not exist: initdb and postgres refuse to run as root. \
             Create it (useradd --system {user}) or set AGENTQ_PG_USER"
        );
    }
    Ok(())
}

/// PIDs of live (non-zombie) processes whose working directory is `dir`.
fn pids_with_cwd(dir: &Path) -> Vec<u32> {
    let Ok(dir) = fs::canonicalize(dir) else {
        return Vec::new();
    };
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Watchdog
// ---------------------------------------------------------------------------------------

/// See the module docs: a `sh` process that, once its stdin reaches end-of-file, signals
/// the last PID written to it, waits for that process to exit and removes a directory.
#[derive(Debug)]
struct Watchdog {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
}

const WATCHDOG_SCRIPT: &str = r#"
trap '' INT TERM HUP
sig=$1 dir=$2 pid=0
while read -r line; do pid=$line; done
alive() { kill -0 "$1" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
if [ "$pid" != 0 ] && alive "$pid"; then
  kill -s "$sig" "$pid" 2>/dev/null
  i=0
  while alive "$pid" && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i+1)); done
  kill -s KILL "$pid" 2>/dev/null
fi
# Whatever still runs in the directory (an initdb cut short, orphaned backends): SIGKILL.
for round in 1 2 3 4 5; do
  found=
  for p in /proc/[0-9]*; do
    case $(readlink "$p/cwd" 2>/dev/null) in
      "$dir" | "$dir"/*) kill -s KILL "${p#/proc/}" 2>/dev/null && found=1 ;;
    esac
  done
  [ -z "$found" ] && break
  sleep 0.2
done
rm -rf -- "$dir"
"#;

impl Watchdog {
    fn spawn(signal: &str, dir: &Path) -> Result<Watchdog> {
        // Canonical, as the /proc/PID/cwd links it is compared with.
        let dir = fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("agentq-watchdog")
            .arg(signal)
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning the watchdog (sh)")?;
        let stdin = child.stdin.take();
        Ok(Watchdog {
            child: Some(child),
            stdin,
        })
    }

    /// Tell the watchdog which process to stop (0: none).
    fn set_pid(&mut self, pid: u32) {
        if let Some(stdin) = &mut self.stdin {
            let _ = writeln!(stdin, "{pid}");
        }
    }

    /// The owner has stopped the server and removes the directory itself: end the watchdog
    /// without letting it act.
    fn finish(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
        self.stdin = None;
    }
}

// ---------------------------------------------------------------------------------------
// S3 (moto)
// ---------------------------------------------------------------------------------------

const MOTO_START_TIMEOUT: Duration = Duration::from_secs(60);

/// A private S3-compatible server (`moto_server`, Python package `moto[server]`;
/// `AGENTQ_MOTO_SERVER` names another binary) on `127.0.0.1`. Killed when dropped. It
/// accepts any credentials and keeps its buckets in memory.
#[derive(Debug)]
pub struct MotoServer {
    port: u16,
    log: PathBuf,
    child: Option<Child>,
    watchdog: Watchdog,
    dir: tempfile::TempDir,
}

impl MotoServer {
    pub fn start() -> Result<MotoServer> {
        let bin = std::env::var_os("AGENTQ_MOTO_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("moto_server"));
        let dir = tempfile::Builder::new()
            .prefix("agentq-moto-")
            .tempdir()
            .context("creating a temporary directory for moto_server")?;
        let watchdog = Watchdog::spawn("KILL", dir.path())?;
        let log = dir.path().join("moto.log");
        let mut server = MotoServer {
            port: free_port()?,
            log,
            child: None,
            watchdog,
            dir,
        };
        let port = server.port.to_string();
        let mut cmd = Command::new(&bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port])
            .current_dir(server.dir.path());
        let child = spawn_logged(&mut cmd, &server.log).with_context(|| {
            format!(
                "spawning {} (install it with `pip install 'moto[server]'`; scripts/test does)",
                bin.display()
            )
        })?;
        server.watchdog.set_pid(child.id());
        server.child = Some(child);
        let deadline = Instant::now() + MOTO_START_TIMEOUT;
        loop {
            if let Some(status) = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                server.child = None;
                bail!(
                    "{} exited during start-up ({status}). Log tail:\n{}",
                    bin.display(),
                    log_tail(&server.log)
                );
            }
            if http_answers(server.port) {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} on 127.0.0.1:{} did not answer within {MOTO_START_TIMEOUT:?}. Log tail:\n{}",
                    bin.display(),
                    server.port,
                    log_tail(&server.log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
        self.watchdog.finish();
    }
}

/// Whether an HTTP server answers on the port.
fn http_answers(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 8];
    matches!(s.read(&mut buf), Ok(n) if n >= 5 && buf.starts_with(b"HTTP/"))
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn is_root() -> Result<bool> {
    if let Ok(status) = fs::read_to_string("/proc/self/status") {
        // "Uid:\treal\teffective\tsaved\tfs"
        if let Some(euid) = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
        {
            return Ok(euid == "0");
        }
    }
    let out = Command::new("id")
        .arg("-u")
        .output()
        .context("running id -u")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn find_on_path(prog: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(prog))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0 to find a free port")?;
    Ok(l.local_addr()?.port())
}

/// Wait until 127.0.0.1:port can be bound (std sets SO_REUSEADDR, as the servers do, so
/// TIME_WAIT connections do not count).
fn wait_port_free(port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("port 127.0.0.1:{port} still in use after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the log written since `offset` says the port was taken.
fn port_conflict(log: &Path, offset: u64) -> bool {
    let text = fs::read(log).unwrap_or_default();
    let new = text.get(offset as usize..).unwrap_or_default();
    let new = String::from_utf8_lossy(new);
    new.contains("Address already in use") || new.contains("could not bind")
}

fn file_len(p: &Path) -> u64 {
    fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn log_tail(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            lines[start..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Spawn with stdin from /dev/null and stdout+stderr appended to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Result<Child> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    Ok(cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn()?)
}

/// Run to completion; Ok(stdout) on success, else an error quoting stderr.
fn run_checked(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {what} ({:?})", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Send a signal by name (`INT`, `TERM`, `KILL`) with the shell's `kill`.
pub(crate) fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = Command::new("sh")
        .args(["-c", "kill -s \"$1\" \"$2\"", "sh", sig])
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("running kill -s {sig} {pid}"))?;
    if !status.success() {
        bail!("kill -s {sig} {pid} failed ({status})");
    }
    Ok(())
}

fn kill_child(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

pub(crate) fn wait_timeout(
    child: &mut Child,
    timeout: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
