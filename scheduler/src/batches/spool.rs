//! The spool of a batch being created: its items, checked, written one JSON line each to
//! an unnamed temporary file (in `TMPDIR`, gone with the handle, whatever ends the
//! request) as the upload is read, then read back a chunk at a time while the store
//! inserts them. So a batch is never whole in the scheduler's memory, and the store's
//! transaction never waits on the client's network: it opens once every item was
//! checked, and only reads this file.

use serde::{Deserialize, Serialize};
use tokio::fs::File;
use tokio::io::{AsyncBufReadExt, AsyncSeekExt, AsyncWriteExt, BufReader, BufWriter};

use agentq_core::NewSession;

use crate::error::ApiError;

/// One checked item: where the client wrote it (`requests[3]`, `line 17`), its session
/// (without its batch placement, set when it is inserted) and its `custom_id`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub at: String,
    pub session: NewSession,
    pub custom_id: Option<String>,
}

/// A spool being written.
pub(crate) struct SpoolWriter {
    file: BufWriter<File>,
    line: Vec<u8>,
}

impl SpoolWriter {
    pub(crate) async fn new() -> Result<SpoolWriter, ApiError> {
        let file = tokio::task::spawn_blocking(tempfile::tempfile)
            .await
            .map_err(|e| spool_error("create", &e))?
            .map_err(|e| spool_error("create", &e))?;
        Ok(SpoolWriter {
            file: BufWriter::with_capacity(256 * 1024, File::from_std(file)),
            line: Vec::new(),
        })
    }

    pub(crate) async fn push(&mut self, entry: &Entry) -> Result<(), ApiError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, entry).map_err(|e| spool_error("encode", &e))?;
        self.line.push(b'\n');
        self.file
            .write_all(&self.line)
            .await
            .map_err(|e| spool_error("write", &e))
    }

    /// Everything written, to be read from the start.
    pub(crate) async fn finish(mut self) -> Result<SpoolReader, ApiError> {
        self.file
            .flush()
            .await
            .map_err(|e| spool_error("write", &e))?;
        let mut file = self.file.into_inner();
        file.rewind().await.map_err(|e| spool_error("rewind", &e))?;
        Ok(SpoolReader {
            file: BufReader::with_capacity(256 * 1024, file),
            line: String::new(),
        })
    }
}

/// A written spool, read from the start.
pub(crate) struct SpoolReader {
    file: BufReader<File>,
    line: String,
}

impl SpoolReader {
    /// The next entry and its size in the spool, `None` after the last.
    pub(crate) async fn next(&mut self) -> Result<Option<(Entry, usize)>, ApiError> {
        self.line.clear();
        let n = self
            .file
            .read_line(&mut self.line)
            .await
            .map_err(|e| spool_error("read", &e))?;
        if n == 0 {
            return Ok(None);
        }
        let entry = serde_json::from_str(&self.line).map_err(|e| spool_error("decode", &e))?;
        Ok(Some((entry, n)))
    }
}

/// The spool failed (the temporary directory is missing, full or not writable): the
/// scheduler's fault, logged with its cause; the client is told to retry.
fn spool_error(what: &str, e: &dyn std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "cannot {what} the spool file of a batch (in TMPDIR)");
    ApiError::Unavailable("the scheduler cannot spool the batch now; retry later".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use agentq_agent::spec::SessionSpec;

    use super::*;

    #[tokio::test]
    async fn entries_come_back_in_order_and_whole() {
        let mut w = SpoolWriter::new().await.unwrap();
        let mut sessions = Vec::new();
        for i in 0..3 {
            let mut s = NewSession::root(SessionSpec::new(format!("p{i}\nwith a newline")), "q");
            s.idempotency_key = Some(format!("k{i}"));
            sessions.push(s.clone());
            w.push(&Entry {
                at: format!("line {i}"),
                session: s,
                custom_id: (i != 1).then(|| format!("c{i}")),
            })
            .await
            .unwrap();
        }
        let mut r = w.finish().await.unwrap();
        for (i, s) in sessions.into_iter().enumerate() {
            let (e, n) = r.next().await.unwrap().unwrap();
            assert!(n > 10);
            assert_eq!(e.at, format!("line {i}"));
            assert_eq!(e.session, s);
            assert_eq!(e.custom_id.is_some(), i != 1);
        }
        assert!(r.next().await.unwrap().is_none());
    }
}
