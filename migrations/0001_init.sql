-- agentq: sessions and their append-only message history (DESIGN §3).
--
-- Every key leads with root_id (the session tree's root) so that a whole tree can later
-- live on one shard of a distributed Postgres. Session ids are UUID v7 strings: they sort
-- by creation time, so "newest first" is "id DESC".

CREATE TABLE sessions (
    id                  text        NOT NULL,
    root_id             text        NOT NULL,
    parent_id           text,
    depth               integer     NOT NULL DEFAULT 0 CHECK (depth >= 0),
    queue               text        NOT NULL,
    status              text        NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'waiting', 'awaiting_approval',
                          'completed', 'failed', 'cancelled')),
    finish_reason       text,
    spec                jsonb       NOT NULL,

    -- The loop's scalar state (agentq_agent::state::SessionState); the history is in
    -- `messages`.
    iteration           integer     NOT NULL DEFAULT 0 CHECK (iteration >= 0),
    input_tokens        bigint      NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens       bigint      NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cache_read_tokens   bigint      NOT NULL DEFAULT 0 CHECK (cache_read_tokens >= 0),
    cache_write_tokens  bigint      NOT NULL DEFAULT 0 CHECK (cache_write_tokens >= 0),
    reasoning_tokens    bigint      NOT NULL DEFAULT 0 CHECK (reasoning_tokens >= 0),
    drain_rounds        integer     NOT NULL DEFAULT 0 CHECK (drain_rounds >= 0),
    free_iteration      boolean     NOT NULL DEFAULT false,
    phase               text        NOT NULL DEFAULT 'act' CHECK (phase IN ('plan', 'act')),
    started_at          timestamptz,

    result              text,
    error               text,

    -- The lease. Every write a worker makes is conditional on (lease_owner, lease_epoch);
    -- each claim bumps the epoch, which fences off the previous holder.
    lease_owner         text,
    lease_epoch         bigint      NOT NULL DEFAULT 0,
    lease_expires_at    timestamptz,
    -- Claims since the session last ran cleanly (reset by a graceful release).
    attempts            integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    cancel_requested    boolean     NOT NULL DEFAULT false,
    -- Set once the session has a stream entry; the sweeper re-adds queued rows without one.
    enqueued_at         timestamptz,
    idempotency_key     text,

    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz,

    PRIMARY KEY (root_id, id),
    UNIQUE (id)
);

CREATE UNIQUE INDEX sessions_idempotency_key_idx
    ON sessions (idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Listing newest first, filtered by status (unfiltered listing walks the UNIQUE (id) index).
CREATE INDEX sessions_status_id_idx ON sessions (status, id DESC);

-- Children of a session (fan-in, listing by parent).
CREATE INDEX sessions_parent_id_idx ON sessions (parent_id, id DESC) WHERE parent_id IS NOT NULL;

-- The sweeper: queued rows that never got their stream entry.
CREATE INDEX sessions_unenqueued_idx
    ON sessions (created_at) WHERE status = 'queued' AND enqueued_at IS NULL;

-- Append-only history: one row per agentq_agent::schema::Message; message i of a
-- session's history has seq i. A checkpoint inserts only the new rows, so what it writes
-- does not grow with the history.
CREATE TABLE messages (
    root_id     text        NOT NULL,
    session_id  text        NOT NULL,
    seq         integer     NOT NULL CHECK (seq >= 0),
    role        text        NOT NULL,
    body        jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (root_id, session_id, seq),
    FOREIGN KEY (root_id, session_id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
);
