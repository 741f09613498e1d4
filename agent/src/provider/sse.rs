//! Server-sent events: an incremental parser ([`SseParser`]) that yields the same events for
//! any split of the byte stream, and a stream adapter ([`sse_events`]) over a
//! `reqwest::Response` with an idle-between-chunks timeout (and no total timeout).
//!
//! Parsing follows the WHATWG "event stream interpretation" rules, with one deliberate
//! departure: [`SseParser::finish`] emits a final event that is not followed by a blank
//! line, because recorded and truncated-but-complete bodies often end that way.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::error::{Error, Result};

/// One SSE event. `event` is the `event:` field (None when absent), `data` the joined
/// `data:` lines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
    pub id: Option<String>,
}

/// Incremental SSE parser. Feed it bytes as they arrive; it returns the events completed so
/// far. Lines are cut on bytes (`\r`, `\n` are never part of a multi-byte UTF-8 sequence), and
/// each line is decoded only once complete, so UTF-8 split across chunks is handled.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` starting the next chunk belongs to that
    /// line end and must be skipped.
    after_cr: bool,
    /// Whether the first line has been started (the BOM may only appear there).
    started: bool,
    data: String,
    event: String,
    /// The spec's "last event ID buffer": it persists across events until reset.
    last_id: String,
    /// A line or an event grew past [`MAX_EVENT_BYTES`]: its bytes were dropped and the
    /// rest of the body is ignored.
    overflow: bool,
}

/// The most bytes one line or one event may hold: a whole answer's worth, so that an
/// endpoint streaming one line (or one event) without end cannot take the worker's memory.
pub const MAX_EVENT_BYTES: usize = crate::bounds::MAX_RESPONSE_BYTES;

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A line or event went past [`MAX_EVENT_BYTES`]; nothing more is parsed.
    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Whether what is buffered is past [`MAX_EVENT_BYTES`]; if so, drop it for good.
    fn check_size(&mut self) -> bool {
        if self.line.len().saturating_add(self.data.len()) > MAX_EVENT_BYTES {
            self.overflow = true;
            self.line = Vec::new();
            self.data = String::new();
        }
        self.overflow
    }

    /// Feed the next chunk of the body; returns the events it completes.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.overflow {
            return out;
        }
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if rest[0] == b'\n' {
                rest = &rest[1..];
            }
        }
        while let Some(pos) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.line.extend_from_slice(&rest[..pos]);
            if self.check_size() {
                return out;
            }
            self.end_line(&mut out);
            if self.check_size() {
                return out;
            }
            if rest[pos] == b'\r' {
                match rest.get(pos + 1) {
                    Some(b'\n') => rest = &rest[pos + 2..],
                    Some(_) => rest = &rest[pos + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[pos + 1..];
            }
        }
        if rest.len() > MAX_EVENT_BYTES.saturating_sub(self.line.len()) {
            self.overflow = true;
            self.line = Vec::new();
            self.data = String::new();
            return out;
        }
        self.line.extend_from_slice(rest);
        self.check_size();
        out
    }

    /// End of stream: process an unterminated last line and emit a pending event as if
    /// a blank line had followed.
    pub fn finish(&mut self) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.overflow {
            return out;
        }
        if !self.line.is_empty() {
            self.end_line(&mut out);
        }
        self.after_cr = false;
        self.emit_event(&mut out);
        out
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) {
        let mut bytes = std::mem::take(&mut self.line);
        if !self.started {
            self.started = true;
            if bytes.starts_with(BOM) {
                bytes.drain(..BOM.len());
            }
        }
        if bytes.is_empty() {
            self.emit_event(out);
            return;
        }
        let line = String::from_utf8_lossy(&bytes);
        self.field(&line);
        // Keep the allocation for the next line.
        bytes.clear();
        self.line = bytes;
    }

    fn field(&mut self, line: &str) {
        if line.starts_with(':') {
            return;
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => self.event = value.to_string(),
            "id" if !value.contains('\0') => self.last_id = value.to_string(),
            // `retry` is a browser reconnection hint; our callers decide retries themselves.
            _ => {}
        }
    }

    /// The event the lines so far make up, if it has data (the spec calls this
    /// "dispatching" it; named apart from the scheduler's dispatcher).
    fn emit_event(&mut self, out: &mut Vec<SseEvent>) {
        let event = std::mem::take(&mut self.event);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        out.push(SseEvent {
            event: (!event.is_empty()).then_some(event),
            data,
            id: (!self.last_id.is_empty()).then(|| self.last_id.clone()),
        });
    }
}

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

struct State {
    body: Option<ByteStream>,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
    idle: Duration,
}

/// The events of an SSE response body. Each wait for the next chunk (the first included) is
/// bounded by `idle`; the whole body is not. A body error or an idle timeout ends the stream
/// with one `Error::Transport`; a clean EOF flushes the parser.
pub fn sse_events(
    resp: reqwest::Response,
    idle: Duration,
) -> impl Stream<Item = Result<SseEvent>> + Send + 'static {
    let state = State {
        body: Some(Box::pin(resp.bytes_stream())),
        parser: SseParser::new(),
        ready: VecDeque::new(),
        idle,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.ready.pop_front() {
                return Some((Ok(ev), st));
            }
            let body = st.body.as_mut()?;
            match tokio::time::timeout(st.idle, body.next()).await {
                Err(_) => {
                    st.body = None;
                    let msg = format!("no data for {}s", st.idle.as_secs_f64());
                    return Some((Err(Error::Transport(msg)), st));
                }
                Ok(Some(Err(e))) => {
                    st.body = None;
                    let msg = format!("reading event stream: {}", error_chain(&e));
                    return Some((Err(Error::Transport(msg)), st));
                }
                Ok(Some(Ok(chunk))) => st.ready.extend(st.parser.push(&chunk)),
                Ok(None) => {
                    st.body = None;
                    st.ready.extend(st.parser.finish());
                }
            }
            if st.parser.overflowed() && st.body.is_some() {
                // The answer is unusable: its events so far are dropped with it.
                st.body = None;
                st.ready.clear();
                let err = Error::Stream {
                    message: format!(
                        "the provider sent a line or event over {MAX_EVENT_BYTES} bytes; the \
                         call was stopped"
                    ),
                    code: Some("response_too_large".into()),
                    retryable: false,
                };
                return Some((Err(err), st));
            }
        }
    })
}

/// The most of an error answer's body that is read: a provider's error fits many times
/// over, and a body without end neither fills memory nor becomes the session's error.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// The body of an error answer, at most [`MAX_ERROR_BODY_BYTES`] of it (as text), read
/// within `idle` in all: empty when it cannot be read, cut when it is longer.
pub(crate) async fn error_body(resp: reqwest::Response, idle: Duration) -> String {
    let mut body = Box::pin(resp.bytes_stream());
    let mut out = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = body.next().await {
            let room = MAX_ERROR_BODY_BYTES.saturating_sub(out.len());
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if out.len() >= MAX_ERROR_BODY_BYTES {
                break;
            }
        }
    };
    // A stall keeps what came before it, as a body cut by the bound is.
    let _ = tokio::time::timeout(idle, read).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// An error with its sources, since reqwest's own message ("error decoding response body")
/// hides the cause (reset, abort…).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut v = p.push(input);
        v.extend(p.finish());
        v
    }

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_string),
            data: data.to_string(),
            id: None,
        }
    }

    #[test]
    fn a_line_or_event_past_the_cap_is_refused_and_not_kept() {
        let max = crate::bounds::MAX_RESPONSE_BYTES;
        // One line that never ends.
        let mut p = SseParser::new();
        p.push(b"data: ");
        let chunk = vec![b'a'; 1024 * 1024];
        for _ in 0..=max / chunk.len() {
            assert!(p.push(&chunk).is_empty());
        }
        assert!(p.overflowed());
        assert!(
            p.line.capacity() <= max + chunk.len(),
            "{}",
            p.line.capacity()
        );
        // Many data lines of one event that never ends.
        let mut p = SseParser::new();
        let line = format!("data: {}\n", "b".repeat(1024 * 1024));
        for _ in 0..=max / (1024 * 1024) {
            assert!(p.push(line.as_bytes()).is_empty());
        }
        assert!(p.overflowed());
        assert!(
            p.data.capacity() <= max + line.len(),
            "{}",
            p.data.capacity()
        );
        assert!(p.finish().is_empty());
    }

    #[test]
    fn line_ends_comments_and_fields() {
        let input = b": hello\r\nevent: a\rdata:x\ndata:  y \r\n\r\ndata\n\nevent: skipped\n\n";
        assert_eq!(all(input), vec![ev(Some("a"), "x\n y "), ev(None, "")]);
    }

    #[test]
    fn cr_split_across_chunks_is_one_line_end() {
        let mut p = SseParser::new();
        let mut v = p.push(b"data: a\r");
        v.extend(p.push(b"\n"));
        v.extend(p.push(b"\r"));
        v.extend(p.push(b"\ndata: b\n\n"));
        assert_eq!(v, vec![ev(None, "a"), ev(None, "b")]);
    }

    #[test]
    fn utf8_split_and_bom() {
        let bytes = "\u{feff}data: héllo €\n\n".as_bytes();
        let mut p = SseParser::new();
        let mut v = Vec::new();
        for b in bytes {
            v.extend(p.push(std::slice::from_ref(b)));
        }
        assert_eq!(v, vec![ev(None, "héllo €")]);
    }

    #[test]
    fn finish_flushes_unterminated_event_and_id_persists() {
        let mut p = SseParser::new();
        let v = p.push(b"id: 7\ndata: one\n\ndata: two");
        assert_eq!(v[0].id.as_deref(), Some("7"));
        let last = p.finish();
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].data, "two");
        assert_eq!(last[0].id.as_deref(), Some("7"));
        assert!(p.finish().is_empty());
    }
}
