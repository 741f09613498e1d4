//! A checkpoint taken off a `SessionState`: the new messages already serialized and the
//! row's scalars already range-checked, owned, so that it can wait in a worker's
//! group-commit batch while the session's task waits for its acknowledgement, and be
//! written by either store without touching the state again. Its texts are in their
//! stored form already (`crate::sql::escape`), which both stores write as they are.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use agentq_agent::spec::ExitReason;
use agentq_agent::state::{Phase, SessionState};

use crate::rowconv::{to_i32, to_i64};
use crate::sql::escape::{escape_text, to_stored_json};
use crate::workspace::{FileChange, sha256_hex};
use crate::{Error, Lease, Result, SessionStatus};

/// `state.messages[from..]` and the row's scalars, fenced by `lease`.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub lease: Lease,
    /// The seq of `messages[0]`; with no message, where the next one goes.
    pub from: i32,
    /// The JSON body of each new message (its role is inside), as stored.
    pub messages: Vec<String>,
    pub iteration: i32,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub reasoning_tokens: i64,
    pub web_search_requests: i64,
    pub drain_rounds: i32,
    pub free_iteration: bool,
    pub phase: Phase,
    pub started_at: Option<DateTime<Utc>>,
    pub turn_base: i32,
    /// JSON array of the sub-agents planned but not started, as stored.
    pub not_started: String,
    pub bg_cursor: i64,
    pub msg_cursor: i64,
    /// Set on the final checkpoint: the run is over and the lease is given up with it.
    pub finish: Option<Finish>,
    /// The whole history's length (the state's, whatever the window).
    pub history_len: i32,
    /// The workspace changes this step commits to its tree's manifest (their blobs are
    /// stored already); empty for a step that changed no file, which then writes exactly
    /// what it wrote before workspaces were durable.
    pub files: Vec<FileChange>,
    /// Contents of `files` the commit carries itself, by key: stored in the same
    /// statement as the manifest change that references them (a store that keeps
    /// contents in the database offers this, [`crate::blob::BlobStore::inline_limit`]);
    /// the other contents of `files` were stored before. Each key is its bytes' SHA-256,
    /// which whoever reads the bytes checks (a wrong key would serve other trees the wrong
    /// content).
    pub blobs: Vec<(String, Arc<Vec<u8>>)>,
    /// The model the run calls, for the row's `model_used`; `None` keeps what is stored.
    pub model_used: Option<String>,
}

/// The terminal part of a final checkpoint; its texts as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub status: SessionStatus,
    pub reason: ExitReason,
    pub result: Option<String>,
    pub error: Option<String>,
}

impl Checkpoint {
    pub fn new(lease: &Lease, state: &SessionState, from: usize) -> Result<Self> {
        let too_long = || Error::invalid("messages", "history too long");
        let new = state.messages.get(from..).unwrap_or_default();
        // Every seq must fit the column, not only the first.
        let end = from.checked_add(new.len()).ok_or_else(too_long)?;
        i32::try_from(end).map_err(|_| too_long())?;
        let from = i32::try_from(from).map_err(|_| too_long())?;
        let history_len = i32::try_from(state.messages.len()).map_err(|_| too_long())?;
        let mut messages = Vec::with_capacity(new.len());
        for m in new {
            messages.push(to_stored_json(m)?);
        }
        let u = &state.usage;
        Ok(Checkpoint {
            lease: lease.clone(),
            from,
            messages,
            iteration: to_i32(state.iteration, "iteration")?,
            input_tokens: to_i64(u.input_tokens, "input_tokens")?,
            output_tokens: to_i64(u.output_tokens, "output_tokens")?,
            cache_read_tokens: to_i64(u.cache_read_tokens, "cache_read_tokens")?,
            cache_write_tokens: to_i64(u.cache_write_tokens, "cache_write_tokens")?,
            reasoning_tokens: to_i64(u.reasoning_tokens, "reasoning_tokens")?,
            web_search_requests: to_i64(u.web_search_requests, "web_search_requests")?,
            drain_rounds: to_i32(state.drain_rounds, "drain_rounds")?,
            free_iteration: state.free_iteration,
            phase: state.phase,
            started_at: state.started_at,
            turn_base: to_i32(state.turn_base, "turn_base")?,
            not_started: to_stored_json(&state.not_started)?,
            bg_cursor: to_i64(state.bg_cursor, "bg_cursor")?,
            msg_cursor: to_i64(state.msg_cursor, "msg_cursor")?,
            finish: state.outcome.as_ref().map(|o| Finish {
                status: SessionStatus::for_exit(o.reason),
                reason: o.reason,
                result: o.result.as_deref().map(|r| escape_text(r).into_owned()),
                error: o.error.as_deref().map(|e| escape_text(e).into_owned()),
            }),
            history_len,
            files: Vec::new(),
            blobs: Vec::new(),
            model_used: None,
        })
    }

    /// The same checkpoint, committing `files` too, with the contents in `blobs` stored by
    /// the commit itself (their keys as [`Checkpoint::blobs`] requires).
    pub fn with_files(
        mut self,
        files: Vec<FileChange>,
        blobs: Vec<(String, Arc<Vec<u8>>)>,
    ) -> Self {
        debug_assert!(blobs.iter().all(|(k, d)| sha256_hex(d) == *k));
        self.files = files;
        self.blobs = blobs;
        self
    }

    /// The same checkpoint, recording that the run calls `model`.
    pub fn with_model(mut self, model: Option<String>) -> Self {
        self.model_used = model;
        self
    }

    /// What a run keeps of this checkpoint once it is committed, until its next commit:
    /// the row's values, for [`Checkpoint::changes_nothing_after`] and for how far the
    /// history is stored (`from`, now where the next message goes), without what is
    /// stored and no longer needed: the new messages' bodies, the file changes and the
    /// contents they carried. Kept whole, a step's messages (a tool's whole output among
    /// them, as JSON) would be held a second time beside the run's history.
    pub fn committed(mut self) -> Self {
        // `new` checked that the end fits; a checkpoint built otherwise keeps its
        // messages rather than a wrong position.
        if let Some(end) = i32::try_from(self.messages.len())
            .ok()
            .and_then(|n| self.from.checked_add(n))
        {
            self.from = end;
            self.messages = Vec::new();
        }
        self.files = Vec::new();
        self.blobs = Vec::new();
        self
    }

    /// The history position a file this checkpoint changes was last modified at: the
    /// seq of the step's last message.
    pub fn file_seq(&self) -> i64 {
        i64::from(self.history_len).saturating_sub(1).max(0)
    }

    /// Whether writing `self` right after `prev` (of the same lease) would store nothing
    /// new: no message to add, and every scalar of the row, the outcome included, as
    /// `prev` left it.
    pub fn changes_nothing_after(&self, prev: &Checkpoint) -> bool {
        self.messages.is_empty()
            && self.lease == prev.lease
            && self.history_len == prev.history_len
            && self.iteration == prev.iteration
            && self.input_tokens == prev.input_tokens
            && self.output_tokens == prev.output_tokens
            && self.cache_read_tokens == prev.cache_read_tokens
            && self.cache_write_tokens == prev.cache_write_tokens
            && self.reasoning_tokens == prev.reasoning_tokens
            && self.web_search_requests == prev.web_search_requests
            && self.drain_rounds == prev.drain_rounds
            && self.free_iteration == prev.free_iteration
            && self.phase == prev.phase
            && self.started_at == prev.started_at
            && self.turn_base == prev.turn_base
            && self.not_started == prev.not_started
            && self.bg_cursor == prev.bg_cursor
            && self.msg_cursor == prev.msg_cursor
            && self.finish == prev.finish
            && self.model_used == prev.model_used
            && self.files.is_empty()
    }

    /// The seq of each new message, in order.
    pub fn seqs(&self) -> impl Iterator<Item = i32> + '_ {
        // `new` checked that the last one fits.
        (0..self.messages.len()).map(|i| self.from + i as i32)
    }
}
