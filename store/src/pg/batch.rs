//! The two statements every session in flight waits on, each one round trip for a whole
//! batch: the group commit of checkpoints and the heartbeat of a worker's leases. The
//! commit runs on its own connections ([`super::commit_conns`]), the heartbeat on the
//! writer pool, both with generic plans of key lookups (see [`super::KEYED_PLANS`]); they
//! are benchmarked: their texts and their parameters' types are part of their performance.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::model::Lease;
use crate::protocol::phase_name;
use crate::sql::record::SessionRecord;
use crate::sql::statements::POSTGRES as SQL;
use crate::store::{Committed, LeaseStatus};

use super::params::{Params, one_row, unnest, unnest_ordered};
use super::{PgStore, secs};

/// The outcome's columns, written by a batch in which a session finishes. A statement
/// that names `status` in its `SET` has Postgres evaluate the conditions of the triggers
/// on `status` changes (migrations 0020, 0030) for each row, rebuilding them from their
/// stored text once per statement: a batch that finishes nothing leaves them out.
const FINISH_SET: &str = "
        status = COALESCE(c.status, s.status),
        finish_reason = CASE WHEN c.status IS NULL THEN s.finish_reason ELSE c.finish_reason END,
        result = CASE WHEN c.status IS NULL THEN s.result ELSE c.result END,
        error = CASE WHEN c.status IS NULL THEN s.error ELSE c.error END,
        finished_at = CASE WHEN c.status IS NULL THEN s.finished_at ELSE now() END,
        lease_owner = CASE WHEN c.status IS NULL THEN s.lease_owner ELSE NULL END,
        lease_expires_at = CASE WHEN c.status IS NULL THEN s.lease_expires_at ELSE NULL END,";

/// A finished session's row and spec, in the answer of a batch in which one finishes.
const FINISHED_ROW: &str = "
        CASE WHEN c.status IS NOT NULL THEN to_json(s.*)::text END AS fin,
        CASE WHEN c.status IS NOT NULL THEN (SELECT p.spec::text FROM session_specs p
            WHERE p.root_id = s.root_id AND p.id = s.id) END AS fin_spec";

/// Group commit: the checkpoints of many sessions in one statement (one round trip), each
/// fenced by its own lease. Each update is fenced by its lease; the new messages are
/// inserted only from the update's output, so a fenced-off worker writes nothing at all,
/// and only past the stored history, so a retry after an ambiguous failure is harmless.
/// With an outcome the row becomes terminal and the lease is given up in the same
/// statement. `c` is one array per column (one element per checkpoint; a lone checkpoint's
/// `c` is one row of single values), `m` one per new message; the answer is the ids whose
/// lease held, with the row of each that finished. A batch that changes files has
/// [`files_ctes`] before the answer. A batch that finishes no session neither binds nor
/// writes the outcome's columns ([`FINISH_SET`]).
fn checkpoint_batch(checkpoints: &str, messages: &str, files: &str, finishing: bool) -> String {
    let (finish_set, finished) = if finishing {
        (FINISH_SET, FINISHED_ROW)
    } else {
        ("", "NULL::text AS fin, NULL::text AS fin_spec")
    };
    format!(
        "
WITH c AS (
    -- The checkpoints in key order, each carrying its columns through the lock to the
    -- update, so that nothing joins them back to the rows they locked.
    SELECT * FROM {checkpoints} ORDER BY c.root_id, c.id
), locked AS (
    -- Row locks in key order, as the group claim takes them, so that two multi-row
    -- writes of one worker's sessions never wait on each other in a cycle: one lookup
    -- per key (a `LATERAL` subquery, never a join that a plan made on a small table
    -- could turn into a scan of the whole table).
    SELECT c.*, l.stored_len FROM c
    CROSS JOIN LATERAL (
        SELECT s.history_len AS stored_len FROM sessions s
        WHERE s.root_id = c.root_id AND s.id = c.id
          AND s.lease_epoch = c.epoch AND s.lease_owner = c.owner
        LIMIT 1
        FOR UPDATE OF s
    ) l
), upd AS (
    UPDATE sessions s SET
        iteration = c.iteration,
        input_tokens = c.input_tokens,
        output_tokens = c.output_tokens,
        cache_read_tokens = c.cache_read_tokens,
        cache_write_tokens = c.cache_write_tokens,
        reasoning_tokens = c.reasoning_tokens,
        web_search_requests = c.web_search_requests,
        drain_rounds = c.drain_rounds,
        free_iteration = c.free_iteration,
        phase = c.phase,
        started_at = c.started_at,{finish_set}
        turn_base = c.turn_base,
        not_started = c.not_started::jsonb,
        bg_cursor = c.bg_cursor,
        msg_cursor = c.msg_cursor,
        history_len = c.history_len,
        -- Progress: a run that saves new steps is not a crash loop, so the count of
        -- claims that died without finishing starts again.
        attempts = CASE WHEN c.has_new THEN 0 ELSE s.attempts END,
        model_used = COALESCE(c.model_used, s.model_used),
        updated_at = now()
    FROM locked c
    WHERE s.root_id = c.root_id AND s.id = c.id
      AND s.lease_epoch = c.epoch AND s.lease_owner = c.owner
    -- A finished session's row comes back whole: its worker needs it (to tell the parent,
    -- start a follow-up, publish the result), and a read after the commit would be one
    -- more statement per session.
    RETURNING s.root_id, s.id, c.stored_len, {finished}
), ins AS (
    -- Only messages not stored yet, so that a retry after an ambiguous failure, or an
    -- overlapping window, stores nothing twice: the row lock orders this against every
    -- other write of the session's messages, and `history_len` says how far they go (a
    -- row from before it was kept checks its stored seqs instead).
    INSERT INTO messages (root_id, session_id, seq, body)
    SELECT upd.root_id::uuid, upd.id::uuid, m.seq, m.body::json
    FROM {messages}
    JOIN upd ON upd.id = m.id
    WHERE m.seq >= COALESCE(upd.stored_len, 0)
      AND (upd.stored_len IS NOT NULL OR NOT EXISTS (
          SELECT 1 FROM messages x
          WHERE x.root_id = upd.root_id::uuid AND x.session_id = upd.id::uuid
            AND x.seq = m.seq))
){files}
SELECT id, fin, fin_spec FROM upd"
    )
}

/// A batch's manifest changes, part of the same statement: only for sessions whose lease
/// held (from `upd`), a deletion where the content is NULL, else an upsert. `f` is one
/// array per column (one element per change: session id, path, content key, size, seq);
/// a (tree, path) appears once in a batch; `gone` is its first three columns, for the
/// deletions. `b` are the contents the checkpoints carry (key, size, bytes; each key
/// once), stored here with the rows that reference them, whatever became of the leases:
/// a content no commit references is the collector's after its grace period, and one
/// another session's commit references must not depend on whose lease held.
fn files_ctes(gone: &str, files: &str, blobs: &str) -> String {
    format!(
        ", bput AS (
    INSERT INTO blobs (sha256, size, data)
    SELECT * FROM {blobs}
    ON CONFLICT (sha256) DO UPDATE SET touched_at = now(),
        data = COALESCE(blobs.data, EXCLUDED.data)
), fdel AS (
    DELETE FROM workspace_files w
    USING {gone}, upd
    WHERE f.sha256 IS NULL AND upd.id = f.id AND w.root_id = upd.root_id
      AND w.path = f.path
), fput AS (
    INSERT INTO workspace_files (root_id, path, sha256, size, modified_at_seq)
    SELECT upd.root_id, f.path, f.sha256, f.size, f.seq
    FROM {files}
    JOIN upd ON upd.id = f.id
    WHERE f.sha256 IS NOT NULL
    ON CONFLICT (root_id, path) DO UPDATE SET sha256 = EXCLUDED.sha256,
        size = EXCLUDED.size, modified_at_seq = EXCLUDED.modified_at_seq
), fver AS (
    -- Every change also as a version, for a fork's files as of a step (`sql::fork`): the
    -- root's own at the history length it commits; a sub-agent's at the root's next.
    INSERT INTO workspace_versions (root_id, path, sha256, size, step_len)
    SELECT upd.root_id, f.path, f.sha256, f.size,
        CASE WHEN upd.id = upd.root_id THEN f.seq + 1
             ELSE COALESCE((SELECT r.history_len FROM sessions r WHERE r.id = upd.root_id), 0) + 1
        END
    FROM {files}
    JOIN upd ON upd.id = f.id
)"
    )
}

/// A worker's heartbeat in one statement: its liveness row renewed (`beat`, the shared
/// statement, with `worker` and `ttl` as its parameters), and what each of its leases `l`
/// (one array per column of a lease) shows, read without writing any session row. The
/// answer keeps the input order.
fn heartbeat(beat: &str, leases: &str) -> String {
    format!(
        "
WITH beat AS (
    {beat}
    RETURNING 1
), l AS (
    SELECT * FROM {leases}
)
SELECT l.id,
    COALESCE(s.lease_epoch = l.epoch AND s.lease_owner = l.owner, false) AS held,
    -- Lost only if the row shows another holder: a lease given up by its holder keeps
    -- its epoch and has no owner.
    NOT COALESCE(s.lease_epoch = l.epoch
                 AND (s.lease_owner IS NULL OR s.lease_owner = l.owner), false) AS lost,
    COALESCE(s.lease_epoch = l.epoch AND s.lease_owner = l.owner AND s.cancel_requested,
             false) AS cancel,
    -- Statistics that say `sessions` is empty (see `PgStore::analyze_sessions`).
    (SELECT c.reltuples = 0 FROM pg_class c WHERE c.oid = 'sessions'::regclass) AS stats_empty
FROM l LEFT JOIN LATERAL (
    -- One lookup per lease: as a join, a plan made while `sessions` was empty read the
    -- whole table once per lease.
    SELECT s.lease_epoch, s.lease_owner, s.cancel_requested FROM sessions s
    WHERE s.root_id = l.root_id AND s.id = l.id
    LIMIT 1
) s ON true
ORDER BY l.ord"
    )
}

/// A finished row as the final checkpoint returns it: the row's JSON object (`to_json`)
/// and its spec's JSON text, joined into one object here rather than by Postgres (whose
/// `jsonb` merge would parse and re-encode both).
fn finished_record(mut row: String, spec: &str) -> Option<SessionRecord> {
    if !row.ends_with('}') {
        return None;
    }
    row.pop();
    row.push_str(",\"spec\":");
    row.push_str(spec);
    row.push('}');
    serde_json::from_str(&row).ok()
}

/// The group commit's parameters: one array per column of [`checkpoint_batch`], one
/// element per checkpoint, and one array per column of the new messages.
#[derive(Default)]
struct BatchColumns<'a> {
    roots: Vec<&'a str>,
    ids: Vec<&'a str>,
    epochs: Vec<i64>,
    owners: Vec<&'a str>,
    iterations: Vec<i32>,
    input: Vec<i64>,
    output: Vec<i64>,
    cache_read: Vec<i64>,
    cache_write: Vec<i64>,
    reasoning: Vec<i64>,
    web_searches: Vec<i64>,
    drain_rounds: Vec<i32>,
    free_iteration: Vec<bool>,
    phases: Vec<&'a str>,
    started_at: Vec<Option<DateTime<Utc>>>,
    statuses: Vec<Option<&'a str>>,
    reasons: Vec<Option<&'a str>>,
    results: Vec<Option<&'a str>>,
    errors: Vec<Option<&'a str>>,
    turn_base: Vec<i32>,
    not_started: Vec<&'a str>,
    bg_cursor: Vec<i64>,
    msg_cursor: Vec<i64>,
    has_new: Vec<bool>,
    history_len: Vec<i32>,
    model_used: Vec<Option<&'a str>>,
    m_ids: Vec<&'a str>,
    m_seqs: Vec<i32>,
    m_bodies: Vec<&'a str>,
    f_ids: Vec<&'a str>,
    f_paths: Vec<&'a str>,
    f_keys: Vec<Option<&'a str>>,
    f_sizes: Vec<i64>,
    f_seqs: Vec<i64>,
    b_keys: Vec<&'a str>,
    b_sizes: Vec<i64>,
    b_data: Vec<&'a [u8]>,
}

impl<'a> BatchColumns<'a> {
    fn of(batch: &[&'a Checkpoint]) -> Self {
        let n = batch.len();
        let mut c = BatchColumns {
            roots: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            epochs: Vec::with_capacity(n),
            owners: Vec::with_capacity(n),
            iterations: Vec::with_capacity(n),
            input: Vec::with_capacity(n),
            output: Vec::with_capacity(n),
            cache_read: Vec::with_capacity(n),
            cache_write: Vec::with_capacity(n),
            reasoning: Vec::with_capacity(n),
            web_searches: Vec::with_capacity(n),
            drain_rounds: Vec::with_capacity(n),
            free_iteration: Vec::with_capacity(n),
            phases: Vec::with_capacity(n),
            started_at: Vec::with_capacity(n),
            statuses: Vec::with_capacity(n),
            reasons: Vec::with_capacity(n),
            results: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            turn_base: Vec::with_capacity(n),
            not_started: Vec::with_capacity(n),
            bg_cursor: Vec::with_capacity(n),
            msg_cursor: Vec::with_capacity(n),
            has_new: Vec::with_capacity(n),
            history_len: Vec::with_capacity(n),
            model_used: Vec::with_capacity(n),
            ..BatchColumns::default()
        };
        for cp in batch {
            let l = &cp.lease;
            c.roots.push(l.root_id.as_str());
            c.ids.push(l.session_id.as_str());
            c.epochs.push(l.epoch);
            c.owners.push(l.owner.as_str());
            c.iterations.push(cp.iteration);
            c.input.push(cp.input_tokens);
            c.output.push(cp.output_tokens);
            c.cache_read.push(cp.cache_read_tokens);
            c.cache_write.push(cp.cache_write_tokens);
            c.reasoning.push(cp.reasoning_tokens);
            c.web_searches.push(cp.web_search_requests);
            c.drain_rounds.push(cp.drain_rounds);
            c.free_iteration.push(cp.free_iteration);
            c.phases.push(phase_name(cp.phase));
            c.started_at.push(cp.started_at);
            let f = cp.finish.as_ref();
            c.statuses.push(f.map(|f| f.status.as_str()));
            c.reasons.push(f.map(|f| f.reason.as_str()));
            c.results.push(f.and_then(|f| f.result.as_deref()));
            c.errors.push(f.and_then(|f| f.error.as_deref()));
            c.turn_base.push(cp.turn_base);
            c.not_started.push(cp.not_started.as_str());
            c.bg_cursor.push(cp.bg_cursor);
            c.msg_cursor.push(cp.msg_cursor);
            c.has_new.push(!cp.messages.is_empty());
            c.history_len.push(cp.history_len);
            c.model_used.push(cp.model_used.as_deref());
            for (seq, body) in cp.seqs().zip(&cp.messages) {
                c.m_ids.push(l.session_id.as_str());
                c.m_seqs.push(seq);
                c.m_bodies.push(body.as_str());
            }
        }
        c.add_files(batch);
        c.add_blobs(batch);
        c
    }

    /// The contents the batch carries, each key once (an upsert may not touch a row twice
    /// in one statement).
    fn add_blobs(&mut self, batch: &[&'a Checkpoint]) {
        let mut seen = std::collections::HashSet::new();
        for cp in batch {
            for (key, data) in &cp.blobs {
                if !seen.insert(key.as_str()) {
                    continue;
                }
                self.b_keys.push(key.as_str());
                self.b_sizes
                    .push(i64::try_from(data.len()).unwrap_or(i64::MAX));
                self.b_data.push(data.as_slice());
            }
        }
    }

    /// Whether the batch writes workspace rows: then its statement has [`files_ctes`].
    fn has_files(&self) -> bool {
        !self.f_ids.is_empty() || !self.b_keys.is_empty()
    }

    /// The manifest changes, each (tree, path) once: two sessions of one tree in a batch
    /// that changed the same path commit the later one (last writer wins, as between two
    /// commits).
    fn add_files(&mut self, batch: &[&'a Checkpoint]) {
        let mut at: HashMap<(&str, &str), usize> = HashMap::new();
        for cp in batch {
            let seq = cp.file_seq();
            for f in &cp.files {
                let key = (cp.lease.root_id.as_str(), f.path.as_str());
                let size = f
                    .blob
                    .as_ref()
                    .map_or(0, |b| i64::try_from(b.size).unwrap_or(i64::MAX));
                let sha = f.blob.as_ref().map(|b| b.sha256.as_str());
                if let Some(&i) = at.get(&key) {
                    self.f_ids[i] = cp.lease.session_id.as_str();
                    self.f_keys[i] = sha;
                    self.f_sizes[i] = size;
                    self.f_seqs[i] = seq;
                    continue;
                }
                at.insert(key, self.f_ids.len());
                self.f_ids.push(cp.lease.session_id.as_str());
                self.f_paths.push(f.path.as_str());
                self.f_keys.push(sha);
                self.f_sizes.push(size);
                self.f_seqs.push(seq);
            }
        }
    }
}

impl BatchColumns<'_> {
    /// The statement for this batch and its parameters, bound in the order the
    /// placeholders number them: the checkpoints, their messages, then (only for a batch
    /// that changes files; one that changes none runs the plain statement) the manifest
    /// changes and the contents. Its text depends only on the batch's [`Shape`], and is
    /// written once per shape.
    fn statement(&self) -> Result<(&'static str, PgArguments)> {
        let shape = self.shape();
        let text = &STATEMENTS[shape.index()];
        if let Some(text) = text.get() {
            let (_, args) = self.bind(Params::values_only(), shape)?;
            return Ok((text.as_str(), args));
        }
        let (written, args) = self.bind(Params::default(), shape)?;
        Ok((text.get_or_init(|| written).as_str(), args))
    }

    fn shape(&self) -> Shape {
        Shape {
            // A lone checkpoint (the common case on an idle worker) binds single values:
            // the same statement over a one-row table, planned and bound more cheaply.
            row: self.ids.len() == 1,
            finishing: self.statuses.iter().any(Option::is_some),
            files: self.has_files(),
        }
    }

    /// Bind the batch's values to `p`, and the statement's text (empty, and not written,
    /// if `p` writes no text).
    fn bind(&self, mut p: Params, shape: Shape) -> Result<(String, PgArguments)> {
        let text = p.writes_text();
        let Shape {
            row,
            finishing,
            files,
        } = shape;
        let mut columns = vec![
            ("root_id", p.column(&self.roots, "text", row)?),
            ("id", p.column(&self.ids, "text", row)?),
            ("epoch", p.column(&self.epochs, "bigint", row)?),
            ("owner", p.column(&self.owners, "text", row)?),
            ("iteration", p.column(&self.iterations, "int", row)?),
            ("input_tokens", p.column(&self.input, "bigint", row)?),
            ("output_tokens", p.column(&self.output, "bigint", row)?),
            (
                "cache_read_tokens",
                p.column(&self.cache_read, "bigint", row)?,
            ),
            (
                "cache_write_tokens",
                p.column(&self.cache_write, "bigint", row)?,
            ),
            (
                "reasoning_tokens",
                p.column(&self.reasoning, "bigint", row)?,
            ),
            (
                "web_search_requests",
                p.column(&self.web_searches, "bigint", row)?,
            ),
            ("drain_rounds", p.column(&self.drain_rounds, "int", row)?),
            (
                "free_iteration",
                p.column(&self.free_iteration, "bool", row)?,
            ),
            ("phase", p.column(&self.phases, "text", row)?),
            (
                "started_at",
                p.column(&self.started_at, "timestamptz", row)?,
            ),
        ];
        if finishing {
            columns.extend([
                ("status", p.column(&self.statuses, "text", row)?),
                ("finish_reason", p.column(&self.reasons, "text", row)?),
                ("result", p.column(&self.results, "text", row)?),
                ("error", p.column(&self.errors, "text", row)?),
            ]);
        }
        columns.extend([
            ("turn_base", p.column(&self.turn_base, "int", row)?),
            ("not_started", p.column(&self.not_started, "text", row)?),
            ("bg_cursor", p.column(&self.bg_cursor, "bigint", row)?),
            ("msg_cursor", p.column(&self.msg_cursor, "bigint", row)?),
            ("has_new", p.column(&self.has_new, "bool", row)?),
            ("history_len", p.column(&self.history_len, "int", row)?),
            ("model_used", p.column(&self.model_used, "text", row)?),
        ]);
        let messages = [
            ("id", p.array(&self.m_ids, "text")?),
            ("seq", p.array(&self.m_seqs, "int")?),
            ("body", p.array(&self.m_bodies, "text")?),
        ];
        let files = if files {
            self.files_ctes(&mut p)?
        } else {
            String::new()
        };
        if !text {
            return Ok((String::new(), p.into_args()));
        }
        let checkpoints = if row {
            one_row("c", &columns)
        } else {
            unnest("c", &columns)
        };
        let sql = checkpoint_batch(&checkpoints, &unnest("m", &messages), &files, finishing);
        Ok((sql, p.into_args()))
    }

    /// [`files_ctes`] with the manifest changes and the contents bound.
    fn files_ctes(&self, p: &mut Params) -> Result<String> {
        let id = p.array(&self.f_ids, "text")?;
        let path = p.array(&self.f_paths, "text")?;
        let sha256 = p.array(&self.f_keys, "text")?;
        let gone = [("id", id), ("path", path), ("sha256", sha256)];
        let mut changed = gone.to_vec();
        changed.push(("size", p.array(&self.f_sizes, "bigint")?));
        changed.push(("seq", p.array(&self.f_seqs, "bigint")?));
        let blobs = [
            p.array(&self.b_keys, "text")?,
            p.array(&self.b_sizes, "bigint")?,
            p.array(&self.b_data, "bytea")?,
        ];
        if !p.writes_text() {
            return Ok(String::new());
        }
        Ok(files_ctes(
            &unnest("f", &gone),
            &unnest("f", &changed),
            &format!("UNNEST({})", blobs.join(", ")),
        ))
    }
}

/// What the text of a batch's statement depends on: whether it is one checkpoint (bound
/// as single values), whether one finishes, whether files change.
#[derive(Clone, Copy)]
struct Shape {
    row: bool,
    finishing: bool,
    files: bool,
}

impl Shape {
    fn index(self) -> usize {
        usize::from(self.row) | usize::from(self.finishing) << 1 | usize::from(self.files) << 2
    }
}

/// The statement's text for each [`Shape`], written at its first use: writing the text
/// (about 3 KB from some thirty placeholders) was part of the 11–12 µs a lone commit
/// spent building its statement, of about 70 µs of the worker's own per lone step.
static STATEMENTS: [std::sync::OnceLock<String>; 8] = [const { std::sync::OnceLock::new() }; 8];

/// The group commit's statement for `batch` and its parameters.
pub(super) fn batch_statement(batch: &[&Checkpoint]) -> Result<(&'static str, PgArguments)> {
    BatchColumns::of(batch).statement()
}

/// The heartbeat's statement for `worker`'s `leases` and its parameters.
pub(super) fn heartbeat_statement(
    worker: &str,
    leases: &[Lease],
    ttl: Duration,
) -> Result<(String, PgArguments)> {
    let roots: Vec<&str> = leases.iter().map(|l| l.root_id.as_str()).collect();
    let ids: Vec<&str> = leases.iter().map(|l| l.session_id.as_str()).collect();
    let epochs: Vec<i64> = leases.iter().map(|l| l.epoch).collect();
    let owners: Vec<&str> = leases.iter().map(|l| l.owner.as_str()).collect();
    // The shared statement's `$1` (worker) and `$2` (ttl) come first.
    let mut p = Params::default();
    p.value(worker)?;
    p.value(secs(ttl))?;
    let leases = unnest_ordered(
        "l",
        &[
            ("root_id", p.array(&roots, "text")?),
            ("id", p.array(&ids, "text")?),
            ("epoch", p.array(&epochs, "bigint")?),
            ("owner", p.array(&owners, "text")?),
        ],
    );
    Ok((heartbeat(&SQL.beat, &leases), p.into_args()))
}

/// How often the heartbeat may analyze `sessions` at most: an analysis that could not
/// change the statistics (the role does not own the table, or it timed out) is not
/// retried on every beat.
pub(super) const ANALYSIS_EVERY: Duration = Duration::from_secs(10);

/// What [`checkpoint_batch`] answers per session whose lease held: its id, and for a
/// finished one its row's JSON and its spec's.
type Held = (String, Option<String>, Option<String>);
/// A held session's answer past its id: the finished row and its spec, when it finished.
type Answer = (Option<String>, Option<String>);

impl PgStore {
    /// [`crate::store::LeaseStore::checkpoint_batch`]: one statement for the batch.
    pub(super) async fn commit_batch(
        &self,
        batch: &[&Checkpoint],
    ) -> Result<Vec<Result<Committed>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (sql, args) = batch_statement(batch)?;
        // Given back only once the statement succeeded: one that failed, or whose future
        // was dropped part-way, leaves its connection in a state no one should reuse.
        let mut conn = self.commits.take().await?;
        let held: Vec<Held> = sqlx::query_as_with(sql, args).fetch_all(&mut conn).await?;
        self.commits.give_back(conn);
        self.answers(batch, held).await
    }

    /// One answer per checkpoint, in order, from the sessions whose lease held.
    async fn answers(
        &self,
        batch: &[&Checkpoint],
        held: Vec<Held>,
    ) -> Result<Vec<Result<Committed>>> {
        // Sorted and searched, not hashed: a batch's ids are few and each is looked up
        // once. An id answers one checkpoint at most (a batch holds a session once).
        let mut held: Vec<(String, Option<Answer>)> = held
            .into_iter()
            .map(|(id, fin, spec)| (id, Some((fin, spec))))
            .collect();
        held.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(batch.len());
        for cp in batch {
            let lease = &cp.lease;
            let found = held
                .binary_search_by(|(id, _)| id.as_str().cmp(lease.session_id.as_str()))
                .ok()
                .and_then(|at| held.get_mut(at))
                .and_then(|(_, answer)| answer.take());
            if let Some((fin, spec)) = found {
                // Committed either way; a row that does not decode is read again by the
                // caller, which then reports what is wrong with it.
                let row = fin
                    .zip(spec)
                    .and_then(|(row, spec)| finished_record(row, &spec))
                    .and_then(|r| r.into_row().ok());
                out.push(Ok(row.map(Box::new)));
            // A retried final checkpoint finds the row already finished under our epoch.
            } else if cp.finish.is_some() && self.gave_up_lease(lease, |s| s.is_terminal()).await? {
                out.push(Ok(None));
            } else {
                out.push(Err(Error::LeaseLost(lease.session_id.clone())));
            }
        }
        Ok(out)
    }

    /// Statistics of `sessions` that say it is empty, while this worker holds leases on
    /// its rows, are made again here. Postgres keeps them from the table's last analysis
    /// or vacuum, which may have found it empty (a new deployment's first minute, or
    /// after retention removed every row), until the next one, up to a minute into a
    /// burst; meanwhile it plans every statement on `sessions` as if the table had one
    /// row. Every index then looks alike, and an update joined to a batch's rows passes
    /// over a whole index instead of looking each row up, once per commit. A worker's
    /// connections keep such plans (generic plans) until the statistics change:
    /// analyzing the table has them made again from its rows. At most once per
    /// [`ANALYSIS_EVERY`], bounded by a quarter of the lease so that the next beat is not
    /// late, and skipped if another analysis holds the table; a failure is logged, never
    /// the heartbeat's.
    async fn analyze_sessions(&self, ttl: Duration) {
        {
            // Only a time is kept under the lock, valid whatever a panicking holder left.
            let mut next = self
                .next_analysis
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = tokio::time::Instant::now();
            if next.is_some_and(|at| now < at) {
                return;
            }
            *next = Some(now + ANALYSIS_EVERY);
        }
        let timeout_ms = (ttl / 4).as_millis().max(1);
        let analyzed: Result<()> = async {
            // On the main pool: the writers' connections are the commits'.
            let mut tx = self.pool.begin().await?;
            sqlx::query(&format!("SET LOCAL statement_timeout = {timeout_ms}"))
                .execute(&mut *tx)
                .await?;
            sqlx::query("ANALYZE (SKIP_LOCKED) sessions")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        if let Err(e) = analyzed {
            tracing::warn!(error = %e, "analyzing sessions, whose statistics said it was empty");
        }
    }

    /// [`crate::store::LeaseStore::heartbeat`]: one statement for the worker's row and
    /// all its leases.
    pub(super) async fn extend_leases(
        &self,
        worker: &str,
        leases: &[Lease],
        ttl: Duration,
    ) -> Result<Vec<LeaseStatus>> {
        let (sql, args) = heartbeat_statement(worker, leases, ttl)?;
        let rows: Vec<(String, bool, bool, bool, Option<bool>)> = sqlx::query_as_with(&sql, args)
            .fetch_all(&self.writer)
            .await?;
        if rows.iter().any(|r| r.4 == Some(true)) {
            self.analyze_sessions(ttl).await;
        }
        Ok(rows
            .into_iter()
            .map(
                |(session_id, held, lost, cancel_requested, _)| LeaseStatus {
                    session_id,
                    held,
                    lost,
                    cancel_requested,
                },
            )
            .collect())
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
