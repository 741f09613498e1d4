//! The lines of a JSON Lines upload, read from the body as it arrives: one line in memory
//! at a time (with what arrived after it), never the body. Bounded: a line longer than
//! the line limit is refused as soon as that many bytes are buffered without a newline,
//! a body past the upload limit as soon as it is, each a 413 naming the line; the bytes
//! buffered are held on the decode budget (`http::decode`), as a batch body's are.

use axum::body::Bytes;
use futures::{Stream, StreamExt};

use crate::error::ApiError;
use crate::http::decode::Grant;

/// Buffered bytes before the read ones are dropped from the front (moving the rest).
const COMPACT_AT: usize = 64 * 1024;

/// The upload's lines, numbered from 1 (see the module docs).
pub(crate) struct Lines<S> {
    body: S,
    buf: Vec<u8>,
    /// Where the next line starts in `buf`.
    start: usize,
    /// Where the search for its newline resumes.
    scanned: usize,
    line: u64,
    read: u64,
    done: bool,
    max_line: usize,
    max_upload: u64,
    grant: Grant,
}

impl<S, E> Lines<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    pub(crate) fn new(body: S, max_line: usize, max_upload: u64, grant: Grant) -> Self {
        Lines {
            body,
            buf: Vec::new(),
            start: 0,
            scanned: 0,
            line: 0,
            read: 0,
            done: false,
            max_line,
            max_upload,
            grant,
        }
    }

    /// The next line (its number, its bytes without the line end), `None` after the last.
    /// A last line without a newline counts; `\r\n` ends a line as `\n` does.
    pub(crate) async fn next_line(&mut self) -> Result<Option<(u64, &[u8])>, ApiError> {
        loop {
            if let Some(i) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                let end = self.scanned + i;
                if end - self.start > self.max_line {
                    return Err(self.too_long());
                }
                return Ok(Some(self.take(end, end + 1)));
            }
            self.scanned = self.buf.len();
            if self.buf.len() - self.start > self.max_line {
                return Err(self.too_long());
            }
            if self.done {
                if self.start == self.buf.len() {
                    return Ok(None);
                }
                let end = self.buf.len();
                return Ok(Some(self.take(end, end)));
            }
            self.fill().await?;
        }
    }

    /// The line from `start` to `end` (its terminator ends at `next`).
    fn take(&mut self, end: usize, next: usize) -> (u64, &[u8]) {
        self.line = self.line.saturating_add(1);
        let start = self.start;
        let end = if end > start && self.buf[end - 1] == b'\r' {
            end - 1
        } else {
            end
        };
        self.start = next;
        self.scanned = next;
        (self.line, &self.buf[start..end])
    }

    /// Read the next piece of the body (or learn that it ended).
    async fn fill(&mut self) -> Result<(), ApiError> {
        if self.start >= COMPACT_AT {
            self.buf.drain(..self.start);
            self.scanned -= self.start;
            self.start = 0;
        }
        let Some(piece) = self.body.next().await else {
            self.done = true;
            return Ok(());
        };
        let piece = piece
            .map_err(|e| ApiError::InvalidJson(format!("cannot read the request body: {e}")))?;
        self.read = self
            .read
            .saturating_add(u64::try_from(piece.len()).unwrap_or(u64::MAX));
        if self.read > self.max_upload {
            return Err(ApiError::TooLarge {
                field: Some(format!("line {}", self.line.saturating_add(1))),
                message: format!(
                    "the upload is larger than {} bytes; split the batch",
                    self.max_upload
                ),
            });
        }
        self.buf.extend_from_slice(&piece);
        // What is buffered, on the budget: about a line, however long the upload.
        if self.buf.len() > self.grant.held {
            self.grant.take(self.buf.len() - self.grant.held)?;
        }
        Ok(())
    }

    fn too_long(&self) -> ApiError {
        ApiError::TooLarge {
            field: Some(format!("line {}", self.line.saturating_add(1))),
            message: format!("a line is longer than {} bytes", self.max_line),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::http::decode::DecodeBudget;

    fn lines(
        pieces: &[&'static str],
        max_line: usize,
        max_upload: u64,
    ) -> Lines<impl Stream<Item = Result<Bytes, String>> + Unpin> {
        let body = futures::stream::iter(
            pieces
                .iter()
                .map(|p| Ok::<_, String>(Bytes::from_static(p.as_bytes())))
                .collect::<Vec<_>>(),
        );
        let grant = DecodeBudget::new(64 * 1024 * 1024).grant("t");
        Lines::new(body, max_line, max_upload, grant)
    }

    async fn all(
        mut l: Lines<impl Stream<Item = Result<Bytes, String>> + Unpin>,
    ) -> Result<Vec<(u64, String)>, ApiError> {
        let mut out = Vec::new();
        while let Some((n, line)) = l.next_line().await? {
            out.push((n, String::from_utf8(line.to_vec()).unwrap()));
        }
        Ok(out)
    }

    #[tokio::test]
    async fn lines_across_pieces_with_any_ending() {
        let got = all(lines(
            &["{\"a\"", ":1}\n\n{\"b\":2}\r", "\n{\"c\"", ":3}"],
            100,
            1000,
        ))
        .await
        .unwrap();
        let want = [
            (1, "{\"a\":1}"),
            (2, ""),
            (3, "{\"b\":2}"),
            (4, "{\"c\":3}"),
        ];
        assert_eq!(
            got,
            want.iter()
                .map(|(n, s)| (*n, s.to_string()))
                .collect::<Vec<_>>()
        );
        assert!(all(lines(&[], 10, 10)).await.unwrap().is_empty());
        assert_eq!(all(lines(&["x\n"], 10, 10)).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_long_line_or_a_large_upload_is_refused_naming_the_line() {
        let e = all(lines(&["ok\n", "0123456789", "0123456789\n"], 12, 1000))
            .await
            .unwrap_err();
        assert_eq!(e.status().as_u16(), 413);
        assert_eq!(e.field(), Some("line 2"));
        // Refused before the line's end arrives.
        let e = all(lines(&["ok\n", "0123456789012345"], 12, 1000))
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some("line 2"));
        let e = all(lines(&["a\n", "b\n", "c\n"], 12, 5)).await.unwrap_err();
        assert_eq!((e.status().as_u16(), e.field()), (413, Some("line 3")));
    }
}
