//! The connection's I/O wrappers: a request body with a deadline ([`DeadlineBody`]), a
//! socket that answers hyper's own refusals with the API's JSON body
//! ([`JsonParseErrors`]), and one whose stalled writes fail ([`WriteDeadline`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::ApiError;

use super::answer::{MAX_HEADER_BYTES, MAX_URI_BYTES, raw_response};

/// The request body, failing once `deadline` has passed.
pub(super) struct DeadlineBody {
    inner: Incoming,
    deadline: tokio::time::Instant,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl DeadlineBody {
    pub(super) fn new(
        inner: Incoming,
        deadline: tokio::time::Instant,
        timed_out: Arc<AtomicBool>,
    ) -> Self {
        DeadlineBody {
            inner,
            deadline,
            sleep: None,
            timed_out,
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        // The timer only exists for bodies that are waited for.
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.as_mut().poll(cx).is_ready() {
            this.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request body was not received in time",
            )))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The connection's socket, answering with the API's JSON body where hyper itself
/// refuses a request head (414, 431) with an empty one.
///
/// hyper writes such an answer as one buffer holding only a head with
/// `content-length: 0`, and closes the connection after it. A buffer like that is
/// recognised whole and replaced; nothing else can match it, since the API's answers
/// are JSON (no raw line breaks) and writes are not vectored (so a head is never split
/// from its buffer's start).
pub(super) struct JsonParseErrors<S> {
    inner: S,
    /// A replacement answer still to be written, and how much of it was.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonParseErrors<S> {
    pub(super) fn new(inner: S) -> Self {
        JsonParseErrors {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The JSON answer for a head hyper wrote for a request it could not parse, if `buf`
/// is one.
fn replacement(buf: &[u8]) -> Option<Vec<u8>> {
    if buf.len() > 512 {
        return None;
    }
    let head = std::str::from_utf8(buf).ok()?;
    let rest = head.strip_prefix("HTTP/1.1 ")?;
    if !head.ends_with("\r\n\r\n")
        || !head
            .to_ascii_lowercase()
            .contains("\r\ncontent-length: 0\r\n")
    {
        return None;
    }
    let err = match rest.get(..4)? {
        "414 " => ApiError::UriTooLong(format!(
            "the request target is too long; at most {MAX_URI_BYTES} bytes are read"
        )),
        "431 " => ApiError::HeadersTooLarge(format!(
            "the request head is too large; at most {MAX_HEADER_BYTES} bytes of headers are read"
        )),
        _ => return None,
    };
    Some(raw_response(&err, &[]))
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if let Some(answer) = replacement(buf) {
            this.pending = answer;
            // Taken whole: what is left goes out with the next write, flush or shutdown.
            if let Poll::Ready(Err(e)) = this.poll_pending(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

/// A connection whose writes fail once one has waited `limit` for the peer to take bytes
/// (the wait is counted from the first write that could not proceed; any progress ends
/// it), so that the connection and its slot are given up.
pub(super) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(super) fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `poll` as a write: pending past the deadline is an error.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut S, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll(&mut self.inner, cx) {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let sleep = self.stalled.get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(
                        tokio::time::Instant::now()
                            .checked_add(limit)
                            .unwrap_or_else(tokio::time::Instant::now),
                    ))
                });
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client took no bytes within the write timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .guard(cx, |s, cx| Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().guard(cx, |s, cx| Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut()
            .guard(cx, |s, cx| Pin::new(s).poll_shutdown(cx))
    }

    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_hyper_parse_error_heads_are_replaced() {
        let date = "date: Tue, 01 Dec 2026 14:00:00 GMT\r\n";
        let head = format!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n{date}\r\n"
        );
        let got = String::from_utf8(replacement(head.as_bytes()).unwrap()).unwrap();
        assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
        assert!(got.contains("\"code\":\"headers_too_large\""), "{got}");
        let head = format!("HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n{date}\r\n");
        assert!(replacement(head.as_bytes()).is_some());
        // An answer with a body, another status, or part of one: left alone.
        let with_body =
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 2\r\n\r\n{}";
        assert!(replacement(with_body.as_bytes()).is_none());
        let other = format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{date}\r\n");
        assert!(replacement(other.as_bytes()).is_none());
        assert!(replacement(b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n").is_none());
    }
}
