//! A stdio server's process: started with a cleared environment holding only the
//! variables the operator listed, killed when dropped, its stderr logged, and its stdout
//! read through [`BoundedLines`] so that one message larger than the bound is never held.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use agentq_types::config::McpServerSettings;

use crate::error::{Error, Result};

/// Why a connection stopped, as the calls it failed tell the model.
pub(crate) type Fault = Arc<Mutex<Option<String>>>;

pub(crate) fn set_fault(fault: &Fault, why: String) {
    if let Ok(mut f) = fault.lock() {
        f.get_or_insert(why);
    }
}

pub(crate) fn fault_of(fault: &Fault) -> Option<String> {
    fault.lock().ok().and_then(|f| f.clone())
}

/// A started server: the process (killed on drop) and its two pipes.
pub(crate) struct Process {
    pub child: Child,
    pub stdout: BoundedLines<ChildStdout>,
    pub stdin: ChildStdin,
}

/// Start `s.command`. The program is looked up on the worker's `PATH` (the child itself
/// gets a `PATH` only if it is listed in `env`).
pub(crate) fn spawn(s: &McpServerSettings, fault: Fault) -> Result<Process> {
    let command = s.command.as_deref().unwrap_or_default();
    let program = find_program(command).ok_or_else(|| Error::Start {
        server: s.name.clone(),
        why: format!("program `{command}` not found on PATH"),
    })?;
    let mut cmd = Command::new(&program);
    cmd.args(&s.args)
        .env_clear()
        .envs(s.env_values.iter().map(|(k, v)| (k, v.expose())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| Error::Start {
        server: s.name.clone(),
        why: format!("cannot start `{}`: {e}", program.display()),
    })?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(Error::Start {
            server: s.name.clone(),
            why: "no pipes to the process".into(),
        });
    };
    if let Some(mut stderr) = child.stderr.take() {
        let name = s.name.clone();
        // Logged in bounded pieces: a server that writes without end costs a log line
        // per piece, never memory.
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                let text = String::from_utf8_lossy(&buf[..n]);
                tracing::debug!(server = %name, "mcp server stderr: {}", text.trim_end());
            }
        });
    }
    Ok(Process {
        child,
        stdout: BoundedLines::new(stdout, s.max_result_bytes, s.name.clone(), fault),
        stdin,
    })
}

fn find_program(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The server's stdout, ended (as if the server had closed it) once one line, a message,
/// grows past `max` bytes: the bytes read so far are dropped, the fault says why, and the
/// connection is restarted. The calls in flight fail naming the server.
pub(crate) struct BoundedLines<R> {
    inner: R,
    max: usize,
    line: usize,
    server: String,
    fault: Fault,
    tripped: bool,
}

impl<R> BoundedLines<R> {
    pub(crate) fn new(inner: R, max: usize, server: String, fault: Fault) -> Self {
        BoundedLines {
            inner,
            max,
            line: 0,
            server,
            fault,
            tripped: false,
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.tripped {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        for &b in &buf.filled()[before..] {
            if b == b'\n' {
                this.line = 0;
            } else {
                this.line = this.line.saturating_add(1);
                if this.line > this.max {
                    this.tripped = true;
                    break;
                }
            }
        }
        if this.tripped {
            buf.set_filled(before);
            set_fault(
                &this.fault,
                format!(
                    "MCP server `{}` sent a message larger than max_result_bytes ({} bytes); \
                     it was dropped unread and the server restarted",
                    this.server, this.max
                ),
            );
        }
        Poll::Ready(Ok(()))
    }
}
