//! The `shell` tool: one `sh -c` command in the workspace root, bounded in time and output,
//! killed (with the processes it started) on timeout or cancellation, with none of the
//! worker's environment ([`confine_env`]), not even through `/proc` ([`seal_host`]). Registered only when the host enables it
//! (`ToolSettings::shell_enabled`).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::fs::Args;
use super::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};

/// Bytes kept from each of stdout and stderr; the loop truncates tool output at 50,000
/// characters anyway.
const MAX_STREAM_BYTES: usize = 32 * 1024;
/// How long to wait for the output pipes to close once the shell itself has exited: a
/// background process may hold them open.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// `PATH` when the worker has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The whole environment a command sees. The worker's own holds provider keys and
/// database and Redis URLs with their passwords, and `env` would print them into the
/// transcript; so nothing is inherited but `PATH` and the locale, and `HOME` is the
/// workspace, so that tools writing dotfiles write them where the session may look.
fn confine_env(cmd: &mut Command, workspace: &std::path::Path) {
    let path = std::env::var_os("PATH")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PATH.into());
    let lang = std::env::var_os("LANG")
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "C.UTF-8".into());
    cmd.env_clear()
        .env("PATH", path)
        .env("HOME", workspace)
        .env("PWD", workspace)
        .env("LANG", lang);
}

/// Make this process non-dumpable before it runs a command, so that the command cannot
/// read the worker's environment through `/proc/<worker pid>/environ` (the environment
/// the process started with, keys included, whatever [`confine_env`] hands the child) or
/// its memory through `/proc/<pid>/mem`: a non-dumpable process's `/proc` entries belong
/// to root, so a command running as the worker's user is refused them. Fails closed: a
/// command is not run if the process cannot be sealed.
#[cfg(target_os = "linux")]
fn seal_host() -> Result<(), ToolError> {
    use rustix::process::{DumpableBehavior, set_dumpable_behavior};
    set_dumpable_behavior(DumpableBehavior::NotDumpable).map_err(|e| {
        ToolError::Failed(format!(
            "cannot protect the worker's environment from the command (prctl \
             PR_SET_DUMPABLE: {e}); not running it"
        ))
    })
}

#[cfg(not(target_os = "linux"))]
fn seal_host() -> Result<(), ToolError> {
    Ok(())
}

/// Output captured from one pipe: the first `MAX_STREAM_BYTES`, and whether more came.
#[derive(Default)]
struct Captured {
    data: Vec<u8>,
    truncated: bool,
}

/// Read a pipe to its end, keeping a bounded head. Reading continues past the cap so the
/// child never blocks on a full pipe.
async fn drain(mut pipe: impl AsyncRead + Unpin, into: Arc<Mutex<Captured>>) {
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let Ok(mut c) = into.lock() else { return };
                let room = MAX_STREAM_BYTES.saturating_sub(c.data.len());
                if n > room {
                    c.truncated = true;
                }
                let keep = n.min(room);
                c.data.extend_from_slice(&buf[..keep]);
            }
        }
    }
}

fn take(c: &Arc<Mutex<Captured>>) -> (String, bool) {
    match c.lock() {
        Ok(c) => (String::from_utf8_lossy(&c.data).into_owned(), c.truncated),
        Err(_) => (String::new(), false),
    }
}

/// Kill the process group the shell leads (it was started with `process_group(0)`, so its
/// pgid is its pid), reaching the commands it spawned. Done through the shell's `kill`
/// builtin since the crate forbids `unsafe` and has no libc binding; `-KILL -pid` is the
/// spelling dash accepts (it rejects `--`).
pub(crate) async fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid else { return };
    let _ = Command::new("sh")
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .arg("-c")
        .arg(format!("kill -KILL -{pid} 2>/dev/null"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

fn render(status: &str, stdout: (String, bool), stderr: (String, bool)) -> String {
    let mut out = format!("{status}\n");
    for (name, (text, truncated)) in [("stdout", stdout), ("stderr", stderr)] {
        if text.is_empty() && !truncated {
            continue;
        }
        out.push_str(&format!("--- {name} ---\n{text}"));
        if !text.ends_with('\n') {
            out.push('\n');
        }
        if truncated {
            out.push_str(&format!("[{name} truncated at {MAX_STREAM_BYTES} bytes]\n"));
        }
    }
    out
}

/// `shell {command, timeout_secs?}`. `Unsafe`: a command can do anything, once.
pub struct Shell;

#[async_trait]
impl Tool for Shell {
    fn name(&self) -> &str {
        "shell"
    }

    fn description(&self) -> &str {
        "Run a command with `sh -c` in the workspace root. Returns the exit code, then \
         stdout and stderr (each truncated past a size cap). The command is killed when it \
         exceeds its timeout. No stdin: interactive commands will not work. The environment \
         holds only PATH, LANG and HOME (the workspace root)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command line."},
                "timeout_secs": {"type": "integer", "minimum": 1, "description": "Kill the command after this many seconds (capped by the host's limit)."}
            },
            "required": ["command"],
            "additionalProperties": false
        })
    }

    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Unsafe
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let ShellArgs {
            command,
            timeout_secs,
        } = ShellArgs::parse(&args, ctx.settings.shell_timeout_secs.max(1))?;

        ctx.workspace.ensure().await?;
        seal_host()?;
        let mut child = spawn(&command, ctx.workspace.root())?;
        let pid = child.id();

        let out = Arc::new(Mutex::new(Captured::default()));
        let err = Arc::new(Mutex::new(Captured::default()));
        let mut readers = Vec::new();
        if let Some(p) = child.stdout.take() {
            readers.push(tokio::spawn(drain(p, out.clone())));
        }
        if let Some(p) = child.stderr.take() {
            readers.push(tokio::spawn(drain(p, err.clone())));
        }
        let readers = futures::future::join_all(readers);

        let end = tokio::select! {
            s = child.wait() => End::Exited(s),
            _ = tokio::time::sleep(Duration::from_secs(timeout_secs)) => End::TimedOut,
            _ = ctx.cancel.cancelled() => End::Cancelled,
        };
        if !matches!(end, End::Exited(_)) {
            kill_group(pid).await;
            let _ = child.kill().await;
        }
        // Leftover background processes holding the pipes open would keep the readers
        // waiting; after a grace period they are killed with the group.
        if tokio::time::timeout(DRAIN_GRACE, readers).await.is_err() {
            kill_group(pid).await;
        }
        let (stdout, stderr) = (take(&out), take(&err));
        // The command may have written anything: the next file tool's write measures the
        // workspace again against its quota.
        ctx.workspace.forget_usage();
        end.report(timeout_secs, stdout, stderr)
    }
}

/// `shell`'s arguments, checked: the command line and its timeout, capped by the host's.
struct ShellArgs {
    command: String,
    timeout_secs: u64,
}

impl ShellArgs {
    fn parse(args: &Value, max: u64) -> Result<ShellArgs, ToolError> {
        let a = Args::parse(args, &["command", "timeout_secs"])?;
        let command = a.str("command")?;
        if command.trim().is_empty() {
            return Err(ToolError::InvalidArguments(
                "field `command` is empty".into(),
            ));
        }
        let timeout_secs = match a.opt_u64("timeout_secs")? {
            Some(0) => {
                return Err(ToolError::InvalidArguments(
                    "field `timeout_secs` must be at least 1".into(),
                ));
            }
            Some(t) => t.min(max),
            None => max,
        };
        Ok(ShellArgs {
            command: command.to_string(),
            timeout_secs,
        })
    }
}

/// `sh -c command` in `root`, in a process group of its own (so that what it starts is
/// killed with it), with no stdin and both outputs piped.
fn spawn(command: &str, root: &std::path::Path) -> Result<tokio::process::Child, ToolError> {
    let mut child = Command::new("sh");
    confine_env(&mut child, root);
    child
        .arg("-c")
        .arg(command)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ToolError::Failed(format!("cannot start sh: {e}")))
}

/// How a command's run ended.
enum End {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    Cancelled,
}

impl End {
    /// The tool's result: the exit line and both outputs, an error result unless the
    /// command succeeded.
    fn report(
        self,
        timeout_secs: u64,
        stdout: (String, bool),
        stderr: (String, bool),
    ) -> Result<ToolOutput, ToolError> {
        match self {
            End::Exited(Ok(status)) => {
                let content = render(&exit_line(status), stdout, stderr);
                Ok(if status.success() {
                    ToolOutput::ok(content)
                } else {
                    ToolOutput::error(content)
                })
            }
            End::Exited(Err(e)) => Err(ToolError::Failed(format!(
                "waiting for the command failed: {e}"
            ))),
            End::TimedOut => Ok(ToolOutput::error(render(
                &format!("timed out after {timeout_secs} s (killed)"),
                stdout,
                stderr,
            ))),
            End::Cancelled => Err(ToolError::Failed(
                "cancelled; the command was killed".into(),
            )),
        }
    }
}

/// `exit code N`, or the signal that killed the command.
fn exit_line(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => {
            use std::os::unix::process::ExitStatusExt;
            match status.signal() {
                Some(sig) => format!("killed by signal {sig}"),
                None => "exit status unknown".to_string(),
            }
        }
    }
}
