//! `agentq watch ID`: follow a session live over `GET /v1/sessions/{id}/events` (SSE).
//! The server replays the session from its start, then tails it; this prints text deltas
//! inline and tool calls and results one line each; a call held for approval is shown with
//! the commands that decide it. A dropped connection is resumed with
//! `Last-Event-ID` (bounded retries with backoff), so nothing is printed twice and nothing
//! is skipped. A `reset` event (a worker died mid-step and another redoes it) is shown as
//! a notice: a terminal cannot take back what it printed. Event data is read as the types
//! the scheduler sends (the agent's events, and the `reset` and completion events of
//! `agentq-api`). Exit status: 0 when the session completed, 1 when it failed, was
//! cancelled, is unknown or could not be followed.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use serde_json::Value;

use agentq_agent::event::AgentEvent;
use agentq_agent::spec::ExitReason;
use agentq_api::events::{self, CompletionEvent, ResetEvent};
use agentq_core::SessionStatus;
use agentq_core::config::Settings;
use agentq_core::protocol::EventKind;

use crate::client::api::{ApiArgs, KEY_HINT};
use crate::client::show::{decide_commands, one_line, shell_word};

const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Tool arguments and results are shown up to this many characters.
const SHOW_CHARS: usize = 160;

#[derive(Args, Debug)]
pub struct WatchArgs {
    pub id: String,
    /// Print each event as one JSON line (`{"id","event","data"}`) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Give up after this many failed connection attempts in a row.
    #[arg(long, default_value_t = 10)]
    pub max_retries: u32,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// An incremental `text/event-stream` parser (the WHATWG rules this API needs: `id`,
/// `event`, multi-line `data`, comments, CRLF or LF line ends).
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    id: Option<String>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    /// Feed bytes; returns the events completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]);
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                if !self.data.is_empty() || self.event.is_some() {
                    out.push(SseEvent {
                        id: self.id.take(),
                        event: self.event.take().unwrap_or_else(|| "message".into()),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                self.id = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "id" => self.id = Some(value.to_string()),
                "event" => self.event = Some(value.to_string()),
                "data" => self.data.push(value.to_string()),
                _ => {}
            }
        }
        out
    }
}

/// Turns events into terminal output.
struct Printer {
    json: bool,
    /// The session followed, for the commands that decide on its held calls.
    session: String,
    /// A text delta left the cursor mid-line.
    mid_line: bool,
}

fn short(s: &str) -> String {
    one_line(s, SHOW_CHARS)
}

impl Printer {
    fn line(&mut self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        if self.mid_line {
            writeln!(out)?;
            self.mid_line = false;
        }
        writeln!(out, "{text}")
    }

    /// Print one event; returns the session's finish reason when it was the last one.
    fn handle(
        &mut self,
        out: &mut impl Write,
        ev: &SseEvent,
    ) -> std::io::Result<Option<Option<ExitReason>>> {
        let completed = (EventKind::parse(&ev.event) == Some(EventKind::SessionCompleted))
            .then(|| serde_json::from_str::<CompletionEvent>(&ev.data).ok());
        let finished = completed
            .as_ref()
            .map(|c| c.as_ref().and_then(|c| c.finish_reason));
        if self.json {
            let data: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
            let line = serde_json::json!({"id": ev.id, "event": ev.event, "data": data});
            writeln!(out, "{line}")?;
            out.flush()?;
            return Ok(finished);
        }
        if let Some(c) = completed {
            self.completion(out, c.as_ref())?;
        } else if ev.event == events::RESET {
            let seq = serde_json::from_str::<ResetEvent>(&ev.data)
                .map_or_else(|_| "?".to_string(), |r| r.seq.to_string());
            self.line(
                out,
                &format!("[the step at position {seq} is being redone by another worker]"),
            )?;
        } else if let Ok(agent) = serde_json::from_str::<AgentEvent>(&ev.data) {
            self.agent_event(out, agent)?;
        }
        out.flush()?;
        Ok(finished)
    }

    fn agent_event(&mut self, out: &mut impl Write, ev: AgentEvent) -> std::io::Result<()> {
        match ev {
            AgentEvent::TextDelta { text } => {
                write!(out, "{text}")?;
                self.mid_line = !text.ends_with('\n');
            }
            AgentEvent::ThinkingDelta { .. } | AgentEvent::IterationStarted { .. } => {}
            AgentEvent::ToolCall {
                name, arguments, ..
            } => {
                let args = short(&arguments.to_string());
                self.line(out, &format!("→ {name}({args})"))?;
            }
            AgentEvent::ToolResult {
                name,
                content,
                is_error,
                ..
            } => {
                let mark = if is_error { "✗" } else { "←" };
                self.line(out, &format!("{mark} {name}: {}", short(&content)))?;
            }
            AgentEvent::ApprovalRequested {
                id,
                name,
                arguments,
            } => {
                let args = short(&arguments.to_string());
                self.line(
                    out,
                    &format!(
                        "⏸ {name}({args}) awaits approval, call {}: {}",
                        shell_word(&id),
                        decide_commands(&self.session, &id)
                    ),
                )?;
            }
            AgentEvent::ApprovalDecided {
                id,
                name,
                approved,
                reason,
            } => {
                let verdict = match (approved, reason) {
                    (true, _) => "approved".to_string(),
                    (false, Some(r)) => format!("denied: {}", short(&r)),
                    (false, None) => "denied".to_string(),
                };
                self.line(out, &format!("▶ {name} call {} {verdict}", shell_word(&id)))?;
            }
            AgentEvent::IterationCompleted { .. } if self.mid_line => {
                writeln!(out)?;
                self.mid_line = false;
            }
            AgentEvent::IterationCompleted { .. } => {}
            AgentEvent::Error { message, retrying } => {
                let retrying = if retrying { " (retrying)" } else { "" };
                self.line(out, &format!("! {message}{retrying}"))?;
            }
            AgentEvent::SessionWaiting { reason, wake_at } => {
                let until = wake_at
                    .map(|t| format!(" until {}", t.to_rfc3339()))
                    .unwrap_or_default();
                self.line(out, &format!("… waiting for {}{until}", short(&reason)))?;
            }
            AgentEvent::RateLimited { wait_ms, reason } => {
                let secs = wait_ms as f64 / 1000.0;
                self.line(out, &format!("… rate limit ({reason}): waiting {secs:.1}s"))?;
            }
            // Read as a `CompletionEvent` (its finish reason may be null).
            AgentEvent::SessionCompleted { .. } => {}
        }
        Ok(())
    }

    fn completion(
        &mut self,
        out: &mut impl Write,
        c: Option<&CompletionEvent>,
    ) -> std::io::Result<()> {
        let Some(c) = c else {
            return self.line(out, "[session finished]");
        };
        let reason = c.finish_reason.map(|r| r.as_str()).unwrap_or_default();
        self.line(
            out,
            &format!(
                "[session finished: {reason}; {} iterations; {} input / {} output tokens]",
                c.iterations, c.usage.input_tokens, c.usage.output_tokens,
            ),
        )?;
        if let Some(e) = &c.error {
            self.line(out, &format!("error: {e}"))?;
        }
        Ok(())
    }
}

fn backoff(failures: u32) -> Duration {
    let exp = BACKOFF_MIN.saturating_mul(1u32 << failures.min(8));
    exp.min(BACKOFF_MAX)
}

/// `agentq watch ID`
pub async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let base = match &args.api.api_url {
        Some(u) if !u.trim().is_empty() => u.clone(),
        _ => Settings::load_only(None, |k| std::env::var(k).ok(), &["api_url"])?.api_url,
    };
    let url = format!(
        "{}/v1/sessions/{}/events",
        base.trim_end_matches('/'),
        args.id
    );
    // No overall timeout: the stream lasts as long as the session. The server's
    // keep-alive comments arrive every 15 s; a read silent for much longer means the
    // connection is gone.
    let http = reqwest::Client::builder()
        .default_headers(args.api.headers()?)
        .connect_timeout(Duration::from_secs(5))
        .read_timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")?;
    let mut printer = Printer {
        json: args.json,
        session: args.id.clone(),
        mid_line: false,
    };
    let mut stdout = std::io::stdout();
    let mut last_id: Option<String> = None;
    let mut failures = 0u32;
    loop {
        let mut req = http.get(&url).header("accept", "text/event-stream");
        if let Some(id) = &last_id {
            req = req.header("last-event-id", id);
        }
        let why = match req.send().await {
            Err(e) => format!("cannot reach {base}: {e}"),
            Ok(resp) if resp.status().as_u16() == 404 => {
                eprintln!("agentq: session {} not found", args.id);
                return Ok(ExitCode::from(1));
            }
            Ok(resp) if resp.status().is_client_error() => {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                eprintln!("agentq: the API refused to stream events: HTTP {status}: {body}");
                if matches!(status.as_u16(), 401 | 403) {
                    eprintln!("agentq: {}", KEY_HINT);
                }
                return Ok(ExitCode::from(1));
            }
            Ok(resp) if !resp.status().is_success() => {
                format!("the API answered HTTP {}", resp.status())
            }
            Ok(resp) => {
                let mut parser = SseParser::default();
                let mut body = resp.bytes_stream();
                let mut why = "the server closed the stream".to_string();
                while let Some(chunk) = body.next().await {
                    let chunk = match chunk {
                        Ok(c) => c,
                        Err(e) => {
                            why = format!("the stream broke: {e}");
                            break;
                        }
                    };
                    for ev in parser.feed(&chunk) {
                        if let Some(id) = &ev.id {
                            last_id = Some(id.clone());
                        }
                        failures = 0;
                        if let Some(reason) = printer.handle(&mut stdout, &ev)? {
                            let completed = reason.is_some_and(|r| {
                                SessionStatus::for_exit(r) == SessionStatus::Completed
                            });
                            return Ok(if completed {
                                ExitCode::SUCCESS
                            } else {
                                ExitCode::from(1)
                            });
                        }
                    }
                }
                why
            }
        };
        failures += 1;
        if failures > args.max_retries {
            eprintln!("agentq: giving up after {failures} attempts: {why}");
            return Ok(ExitCode::from(1));
        }
        eprintln!("agentq: {why}; reconnecting (attempt {failures})");
        tokio::time::sleep(backoff(failures)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn parses_events_split_anywhere() {
        let text = ": keep-alive\n\nid: 1-0\nevent: text_delta\ndata: {\"text\":\"hé\"}\n\n\
                    event: reset\r\ndata: {\"seq\":3}\r\n\r\nid: 2-0\ndata: a\ndata: b\n\n";
        let bytes = text.as_bytes();
        // Byte by byte (splitting the UTF-8 of "é" too) gives the same as all at once.
        let mut p = SseParser::default();
        let mut one_by_one = Vec::new();
        for b in bytes {
            one_by_one.extend(p.feed(std::slice::from_ref(b)));
        }
        let all = SseParser::default().feed(bytes);
        assert_eq!(one_by_one, all);
        assert_eq!(
            all,
            vec![
                SseEvent {
                    id: Some("1-0".into()),
                    event: "text_delta".into(),
                    data: "{\"text\":\"hé\"}".into()
                },
                SseEvent {
                    id: None,
                    event: "reset".into(),
                    data: "{\"seq\":3}".into()
                },
                SseEvent {
                    id: Some("2-0".into()),
                    event: "message".into(),
                    data: "a\nb".into()
                },
            ]
        );
    }

    #[test]
    fn prints_compactly_and_reports_the_finish() {
        let mut p = Printer {
            json: false,
            session: "s1".into(),
            mid_line: false,
        };
        let mut out = Vec::new();
        let ev = |event: &str, data: &str| SseEvent {
            id: None,
            event: event.into(),
            data: data.into(),
        };
        assert_eq!(
            p.handle(
                &mut out,
                &ev(
                    "text_delta",
                    r#"{"type":"text_delta","text":"Hello","seq":1}"#
                )
            )
            .unwrap(),
            None
        );
        p.handle(
            &mut out,
            &ev(
                "tool_call",
                r#"{"type":"tool_call","id":"c1","name":"http_fetch","arguments":{"url":"http://x"},"seq":1}"#,
            ),
        )
        .unwrap();
        p.handle(
            &mut out,
            &ev(
                "tool_result",
                r#"{"type":"tool_result","id":"c1","name":"http_fetch","content":"ok\nfine","is_error":false,"seq":2}"#,
            ),
        )
        .unwrap();
        p.handle(
            &mut out,
            &ev(
                "approval_requested",
                r#"{"type":"approval_requested","id":"c2","name":"write_file","arguments":{"path":"a.txt"},"seq":1}"#,
            ),
        )
        .unwrap();
        p.handle(
            &mut out,
            &ev(
                "approval_decided",
                r#"{"type":"approval_decided","id":"c2","name":"write_file","approved":false,"reason":"not today","seq":2}"#,
            ),
        )
        .unwrap();
        let done = p
            .handle(
                &mut out,
                &ev(
                    "session_completed",
                    r#"{"type":"session_completed","finish_reason":"stop","result":"42","error":null,"iterations":2,"usage":{"input_tokens":5,"output_tokens":7},"seq":3}"#,
                ),
            )
            .unwrap();
        assert_eq!(done, Some(Some(ExitReason::Stop)));
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(
                "Hello\n→ http_fetch({\"url\":\"http://x\"})\n← http_fetch: ok fine\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "⏸ write_file({\"path\":\"a.txt\"}) awaits approval, call c2: \
                 agentq approve s1 c2  |  agentq deny s1 c2 --reason '...'\n\
                 ▶ write_file call c2 denied: not today\n"
            ),
            "{text}"
        );
        assert!(text.contains("[session finished: stop; 2 iterations; 5 input / 7 output tokens]"));
    }

    #[test]
    fn resets_rebuilt_completions_and_errors() {
        let mut p = Printer {
            json: false,
            session: "s1".into(),
            mid_line: false,
        };
        let mut out = Vec::new();
        let ev = |event: &str, data: &str| SseEvent {
            id: None,
            event: event.into(),
            data: data.into(),
        };
        p.handle(&mut out, &ev("reset", r#"{"seq":3}"#)).unwrap();
        p.handle(
            &mut out,
            &ev(
                "error",
                r#"{"type":"error","message":"rate limited","retrying":true,"seq":3}"#,
            ),
        )
        .unwrap();
        // A completion rebuilt from a dead-lettered row has no finish reason.
        let done = p
            .handle(
                &mut out,
                &ev(
                    "session_completed",
                    r#"{"type":"session_completed","finish_reason":null,"result":null,"error":"gave up","iterations":1,"usage":{},"seq":4}"#,
                ),
            )
            .unwrap();
        assert_eq!(done, Some(None));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "[the step at position 3 is being redone by another worker]\n\
             ! rate limited (retrying)\n\
             [session finished: ; 1 iterations; 0 input / 0 output tokens]\n\
             error: gave up\n"
        );
    }

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(30), BACKOFF_MAX);
    }
}
