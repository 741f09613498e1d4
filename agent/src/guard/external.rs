//! The hooks an operator configures instead of writing Rust: an HTTP webhook or a command,
//! asked at one hook point with a JSON description of the event. At PreToolUse the answer
//! is a verdict ([`super::verdict`]); the other points only observe, and what they answer
//! is ignored. A hook that does not answer in time, fails, or answers something that is
//! not a verdict gets its configured behaviour, is logged and is counted through the
//! [`Observer`] (`hook_call`).
//!
//! A webhook is POSTed to with no redirects followed and a total timeout. A command gets
//! the event on stdin and answers on stdout, with a cleared environment (`PATH` and `LANG`
//! only), in its own process group, which is killed at the timeout.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use globset::{Glob, GlobSet, GlobSetBuilder};
use reqwest::header::{HeaderName, HeaderValue};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tracing::warn;

use super::hook::{Behavior, Hook, HookContext, HookDecision, HookPoint, bounded};
use super::verdict::parse_verdict;
use crate::error::{Error, Result};
use crate::observe::Observer;
use crate::schema::{Arguments, ToolCall};
use crate::spec::ExitReason;
use crate::tools::ToolOutput;

/// The most of an answer read; a longer one is not a verdict.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The most of a tool's output a PostToolUse event carries (cut at a character boundary).
pub const MAX_EVENT_OUTPUT_BYTES: usize = 64 * 1024;
/// The most of a command's stderr kept for the log.
const MAX_STDERR_BYTES: usize = 4 * 1024;
/// Connecting never gets more than this, even under a longer total timeout.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a hook is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookTarget {
    /// POSTed to, with `header` (name, value) on every request when set.
    Webhook {
        url: String,
        header: Option<(String, String)>,
    },
    /// Run with the event on stdin; the answer is its stdout.
    Command { argv: Vec<String> },
}

/// One configured hook.
#[derive(Debug, Clone)]
pub struct HookOptions {
    pub point: HookPoint,
    pub target: HookTarget,
    /// For the whole exchange: connecting, sending, answering (or the command's run).
    pub timeout: Duration,
    /// PreToolUse only: the decision when no answer came in time.
    pub on_timeout: Behavior,
    /// PreToolUse only: the decision when the hook failed or its answer is not a verdict.
    pub on_error: Behavior,
    /// Tool points only: the hook is asked only about tools whose name matches one of
    /// these globs; `None` asks about every tool.
    pub tools: Option<Vec<String>>,
}

enum Target {
    Webhook {
        client: reqwest::Client,
        url: reqwest::Url,
        header: Option<(HeaderName, HeaderValue)>,
    },
    Command {
        argv: Vec<String>,
    },
}

/// Why a hook gave no usable answer.
enum Failure {
    Timeout,
    /// Unreachable, a non-2xx status, a command that could not start or exited non-zero.
    Error(String),
    /// An answer that is not a verdict (or too long).
    Invalid(String),
}

impl Failure {
    fn outcome(&self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Error(_) => "error",
            Failure::Invalid(_) => "invalid",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Timeout => f.write_str("no answer in time"),
            Failure::Error(e) | Failure::Invalid(e) => f.write_str(e),
        }
    }
}

/// A webhook or command hook at one point.
pub struct ExternalHook {
    point: HookPoint,
    target: Target,
    /// For logs: the URL without its query, or the program.
    label: String,
    timeout: Duration,
    on_timeout: Behavior,
    on_error: Behavior,
    tools: Option<GlobSet>,
    observer: Arc<dyn Observer>,
}

/// The JSON a hook is sent.
#[derive(Serialize)]
struct Event<'a> {
    event: &'static str,
    session_id: &'a str,
    tenant: &'a str,
    iteration: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool: Option<ToolRef<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_truncated: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

#[derive(Serialize)]
struct ToolRef<'a> {
    id: &'a str,
    name: &'a str,
    arguments: &'a Arguments,
}

impl<'a> Event<'a> {
    fn new(point: HookPoint, ctx: &HookContext<'a>) -> Self {
        Event {
            event: point.as_str(),
            session_id: ctx.session_id,
            tenant: ctx.tenant,
            iteration: ctx.iteration,
            prompt: None,
            tool: None,
            output: None,
            output_truncated: None,
            is_error: None,
            reason: None,
        }
    }

    fn with_call(mut self, call: &'a ToolCall) -> Self {
        self.tool = Some(ToolRef {
            id: &call.id,
            name: &call.name,
            arguments: &call.arguments,
        });
        self
    }
}

/// Compiles tool-name globs; the error names the bad one.
pub(crate) fn tool_globs(globs: &[String]) -> Result<GlobSet> {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        b.add(Glob::new(g).map_err(|e| Error::Config(format!("tool glob `{g}`: {e}")))?);
    }
    b.build()
        .map_err(|e| Error::Config(format!("tool globs: {e}")))
}

impl ExternalHook {
    /// Checks the target (an http(s) URL without credentials, a valid header; a program)
    /// and the globs; builds the webhook's client once.
    pub fn new(opts: HookOptions, observer: Arc<dyn Observer>) -> Result<Self> {
        if opts.timeout.is_zero() {
            return Err(Error::Config("the timeout must be positive".into()));
        }
        let (target, label) = match opts.target {
            HookTarget::Webhook { url, header } => {
                let url = reqwest::Url::parse(&url)
                    .map_err(|e| Error::Config(format!("url `{url}`: {e}")))?;
                if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                    return Err(Error::Config("url: must be http(s)://host…".into()));
                }
                if !url.username().is_empty() || url.password().is_some() {
                    return Err(Error::Config(
                        "url: must not carry credentials; use a header read from the environment"
                            .into(),
                    ));
                }
                let header = match header {
                    Some((name, value)) => {
                        let name = HeaderName::from_bytes(name.as_bytes())
                            .map_err(|e| Error::Config(format!("header `{name}`: {e}")))?;
                        let mut value = HeaderValue::from_str(&value).map_err(|_| {
                            Error::Config(format!("the value of header `{name}` is not valid"))
                        })?;
                        value.set_sensitive(true);
                        Some((name, value))
                    }
                    None => None,
                };
                let client = reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(opts.timeout.min(MAX_CONNECT_TIMEOUT))
                    .timeout(opts.timeout)
                    .build()
                    .map_err(|e| Error::Config(format!("webhook client: {e}")))?;
                let mut shown = url.clone();
                shown.set_query(None);
                (
                    Target::Webhook {
                        client,
                        url,
                        header,
                    },
                    shown.to_string(),
                )
            }
            HookTarget::Command { argv } => {
                let Some(program) = argv.first().filter(|p| !p.trim().is_empty()) else {
                    return Err(Error::Config("command: must name a program".into()));
                };
                let label = program.clone();
                (Target::Command { argv }, label)
            }
        };
        let tools = opts.tools.as_deref().map(tool_globs).transpose()?;
        Ok(ExternalHook {
            point: opts.point,
            target,
            label,
            timeout: opts.timeout,
            on_timeout: opts.on_timeout,
            on_error: opts.on_error,
            tools,
            observer,
        })
    }

    pub fn point(&self) -> HookPoint {
        self.point
    }

    fn applies_to(&self, tool: &str) -> bool {
        self.tools.as_ref().is_none_or(|g| g.is_match(tool))
    }

    /// Send the event; the answer's bytes.
    async fn exchange(&self, event: &Event<'_>) -> Result<Vec<u8>, Failure> {
        let body = serde_json::to_vec(event).map_err(|e| Failure::Error(e.to_string()))?;
        match &self.target {
            Target::Webhook {
                client,
                url,
                header,
            } => {
                let send = async {
                    let mut req = client
                        .post(url.clone())
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .body(body);
                    if let Some((name, value)) = header {
                        req = req.header(name.clone(), value.clone());
                    }
                    let mut resp = req.send().await.map_err(transport)?;
                    let status = resp.status();
                    if !status.is_success() {
                        return Err(Failure::Error(format!("answered HTTP {status}")));
                    }
                    let mut answer = Vec::new();
                    while let Some(chunk) = resp.chunk().await.map_err(transport)? {
                        if answer.len().saturating_add(chunk.len()) > MAX_ANSWER_BYTES {
                            return Err(Failure::Invalid(format!(
                                "the answer is longer than {MAX_ANSWER_BYTES} bytes"
                            )));
                        }
                        answer.extend_from_slice(&chunk);
                    }
                    Ok(answer)
                };
                // The client's own timeout covers the same span; this one also bounds a
                // body that trickles in.
                tokio::time::timeout(self.timeout, send)
                    .await
                    .unwrap_or(Err(Failure::Timeout))
            }
            Target::Command { argv } => self.run_command(argv, &body).await,
        }
    }

    async fn run_command(&self, argv: &[String], body: &[u8]) -> Result<Vec<u8>, Failure> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Failure::Error("no program".into()))?;
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        let lang = std::env::var_os("LANG").unwrap_or_else(|| "C.UTF-8".into());
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("LANG", lang)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Failure::Error(format!("cannot start: {e}")))?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let work = async {
            let write = async {
                if let Some(mut stdin) = stdin {
                    // A command that answers without reading its input closes the pipe
                    // early: not a failure.
                    let _ = stdin.write_all(body).await;
                }
            };
            let ((), out, err) = tokio::join!(
                write,
                read_capped(stdout, MAX_ANSWER_BYTES),
                read_capped(stderr, MAX_STDERR_BYTES)
            );
            let status = child
                .wait()
                .await
                .map_err(|e| Failure::Error(format!("waiting for it: {e}")))?;
            if !status.success() {
                let err = String::from_utf8_lossy(&err.0);
                let first = err.lines().next().unwrap_or("").trim();
                return Err(Failure::Error(format!("exited with {status}: {first}")));
            }
            let (out, overflowed) = out;
            if overflowed {
                return Err(Failure::Invalid(format!(
                    "the answer is longer than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            Ok(out)
        };
        let r = tokio::time::timeout(self.timeout, work).await;
        if r.is_err() {
            crate::tools::shell::kill_group(pid).await;
        }
        // Dropping the child kills it if it is still there.
        r.unwrap_or(Err(Failure::Timeout))
    }

    fn failed(&self, f: &Failure) {
        warn!(point = %self.point, hook = %self.label, outcome = f.outcome(), error = %f, "hook gave no usable answer");
        self.observer.hook_call(self.point.as_str(), f.outcome());
    }

    /// An observing point: the answer does not matter, only whether the hook took it.
    async fn notify(&self, event: &Event<'_>) {
        match self.exchange(event).await {
            Ok(_) => self.observer.hook_call(self.point.as_str(), "ok"),
            Err(f) => self.failed(&f),
        }
    }
}

fn transport(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout
    } else {
        // The URL may carry a token in its query: not in the logs.
        Failure::Error(format!("request failed: {}", e.without_url()))
    }
}

/// Read a pipe to its end, keeping the first `cap` bytes; whether more came. Reading goes
/// on past the cap so the child never blocks on a full pipe.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut overflowed = false;
    let Some(mut pipe) = pipe else {
        return (kept, overflowed);
    };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, overflowed),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    overflowed = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

#[async_trait]
impl Hook for ExternalHook {
    async fn session_start(&self, ctx: &HookContext<'_>) {
        if self.point == HookPoint::SessionStart {
            let mut event = Event::new(self.point, ctx);
            event.prompt = Some(ctx.prompt);
            self.notify(&event).await;
        }
    }

    async fn session_end(&self, ctx: &HookContext<'_>, reason: ExitReason) {
        if self.point == HookPoint::SessionEnd {
            let mut event = Event::new(self.point, ctx);
            event.reason = Some(reason.as_str());
            self.notify(&event).await;
        }
    }

    async fn pre_tool_use(&self, ctx: &HookContext<'_>, call: &ToolCall) -> HookDecision {
        if self.point != HookPoint::PreToolUse || !self.applies_to(&call.name) {
            return HookDecision::Allow;
        }
        let event = Event::new(self.point, ctx).with_call(call);
        let failure = match self.exchange(&event).await {
            Ok(answer) => match parse_verdict(&String::from_utf8_lossy(&answer)) {
                Ok(decision) => {
                    let outcome = match decision {
                        HookDecision::Allow => "allow",
                        HookDecision::Deny(_) => "deny",
                    };
                    self.observer.hook_call(self.point.as_str(), outcome);
                    return decision;
                }
                Err(why) => Failure::Invalid(why),
            },
            Err(f) => f,
        };
        self.failed(&failure);
        // The model learns that the hook failed, not how (that is in the log).
        let (behavior, why) = match failure {
            Failure::Timeout => (
                self.on_timeout,
                format!(
                    "the hook did not answer within {} ms",
                    self.timeout.as_millis()
                ),
            ),
            Failure::Error(_) => (self.on_error, "the hook failed".to_string()),
            Failure::Invalid(_) => (self.on_error, "the hook gave no valid verdict".to_string()),
        };
        match behavior {
            Behavior::Allow => HookDecision::Allow,
            Behavior::Deny => HookDecision::Deny(why),
        }
    }

    async fn post_tool_use(&self, ctx: &HookContext<'_>, call: &ToolCall, output: &ToolOutput) {
        if self.point != HookPoint::PostToolUse || !self.applies_to(&call.name) {
            return;
        }
        let content = bounded(&output.content, MAX_EVENT_OUTPUT_BYTES);
        let mut event = Event::new(self.point, ctx).with_call(call);
        event.output = Some(content);
        event.output_truncated = Some(content.len() < output.content.len());
        event.is_error = Some(output.is_error);
        self.notify(&event).await;
    }
}
