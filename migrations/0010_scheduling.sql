-- agentq: priorities, fair share across tenants and batches, concurrency caps.
--
-- The Redis stream of a queue is a short delivery buffer; past its depth (or for a tenant
-- or batch with a cap on running sessions) a new session stays `queued` in the store with
-- `held` set, and the scheduler's dispatcher moves it into the stream as the buffer
-- drains, by priority, then by weighted fair share across tenants and across the batches
-- of a tenant.
ALTER TABLE sessions
    ADD COLUMN priority integer NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9),
    -- The `POST /v1/sessions/batch` request that created the session (NULL: alone).
    ADD COLUMN batch_id text,
    -- At most this many sessions of the batch running or in the buffer at once.
    ADD COLUMN batch_max_running integer CHECK (batch_max_running > 0),
    -- Queued without a stream entry on purpose: the dispatcher adds it, not the sweeper.
    ADD COLUMN held boolean NOT NULL DEFAULT false,
    -- Times the session was redriven after a failure: a parent is told of each outcome
    -- once (its notification is keyed by child and retry).
    ADD COLUMN retries integer NOT NULL DEFAULT 0 CHECK (retries >= 0);

-- The dispatcher's read: each (tenant, batch) group's held sessions, best first, from
-- the index alone (an ordered index-only scan, no sort: with 100,000 held rows about as
-- cheap as reading the index once, which the dispatcher does only when half a buffer is
-- free).
CREATE INDEX sessions_held_idx
    ON sessions (queue, tenant, batch_id, priority DESC, id, batch_max_running)
    WHERE held AND status = 'queued';

-- What each tenant and batch has running or in the buffer (caps and fair share).
CREATE INDEX sessions_active_idx
    ON sessions (queue, tenant, batch_id)
    WHERE status IN ('queued', 'running') AND NOT held;

-- The sweeper's read of sessions without a stream entry leaves held ones to the
-- dispatcher: its index must not hold them (a large backlog would be read every pass).
DROP INDEX sessions_unenqueued_idx;
CREATE INDEX sessions_unenqueued_idx
    ON sessions (created_at)
    WHERE status IN ('queued', 'running') AND enqueued_at IS NULL AND NOT held;
