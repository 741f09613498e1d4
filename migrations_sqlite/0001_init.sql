-- agentq embedded mode (SQLite): the same tables and columns as migrations/0001_init.sql,
-- in SQLite's dialect; each file here mirrors the Postgres migration of the same number.
-- core/src/sqlite.rs owns these tables.
--
-- Representation:
-- - timestamps are INTEGER unix microseconds, UTC (Postgres' timestamptz precision, so
--   a state read back compares equal on both backends); every "now" is computed by the
--   store in Rust and bound, never taken from SQLite's clock;
-- - JSON (spec, message bodies) is TEXT;
-- - booleans are INTEGER 0/1.
-- STRICT tables: a value of the wrong type is an error, not a silent conversion.

CREATE TABLE sessions (
    id                  TEXT    NOT NULL,
    root_id             TEXT    NOT NULL,
    parent_id           TEXT,
    depth               INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0),
    queue               TEXT    NOT NULL,
    status              TEXT    NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'waiting', 'awaiting_approval',
                          'completed', 'failed', 'cancelled')),
    finish_reason       TEXT,
    spec                TEXT    NOT NULL,

    -- The loop's scalar state (agentq_agent::state::SessionState); the history is in
    -- `messages`.
    iteration           INTEGER NOT NULL DEFAULT 0 CHECK (iteration >= 0),
    input_tokens        INTEGER NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cache_read_tokens   INTEGER NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0),
    cache_write_tokens  INTEGER NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
    reasoning_tokens    INTEGER NOT NULL DEFAULT 0 CHECK (reasoning_tokens >= 0),
    drain_rounds        INTEGER NOT NULL DEFAULT 0 CHECK (drain_rounds >= 0),
    free_iteration      INTEGER NOT NULL DEFAULT 0 CHECK (free_iteration IN (0, 1)),
    phase               TEXT    NOT NULL DEFAULT 'act' CHECK (phase IN ('plan', 'act')),
    started_at          INTEGER,

    result              TEXT,
    error               TEXT,

    -- The lease. Every write a worker makes is conditional on (lease_owner, lease_epoch);
    -- each claim bumps the epoch, which fences off the previous holder.
    lease_owner         TEXT,
    lease_epoch         INTEGER NOT NULL DEFAULT 0,
    lease_expires_at    INTEGER,
    -- Claims since the session last ran cleanly (reset by a graceful release).
    attempts            INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    cancel_requested    INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
    -- Set once the session has a queue entry; the sweeper re-adds queued rows without one.
    enqueued_at         INTEGER,
    idempotency_key     TEXT,

    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    finished_at         INTEGER,

    PRIMARY KEY (root_id, id),
    UNIQUE (id)
) STRICT;

CREATE UNIQUE INDEX sessions_idempotency_key_idx
    ON sessions (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Listing newest first, filtered by status (unfiltered listing walks the UNIQUE (id) index).
CREATE INDEX sessions_status_id_idx ON sessions (status, id DESC);

-- Children of a session (fan-in, listing by parent).
CREATE INDEX sessions_parent_id_idx ON sessions (parent_id, id DESC) WHERE parent_id IS NOT NULL;

-- The sweeper: queued rows that never got their queue entry.
CREATE INDEX sessions_unenqueued_idx
    ON sessions (created_at) WHERE status = 'queued' AND enqueued_at IS NULL;

-- Append-only history: one row per agentq_agent::schema::Message; message i of a
-- session's history has seq i. A checkpoint inserts only the new rows. WITHOUT ROWID: the
-- rows are clustered by their key, so a session's history is read in one range scan.
CREATE TABLE messages (
    root_id     TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 0),
    role        TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (root_id, session_id, seq),
    FOREIGN KEY (root_id, session_id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;
