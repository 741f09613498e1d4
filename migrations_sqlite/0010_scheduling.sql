-- Mirrors migrations/0010_scheduling.sql: a session's priority, its batch and the batch's
-- cap on running sessions, and `held` for a queued session that waits in the store for
-- the dispatcher rather than in the stream.
ALTER TABLE sessions
    ADD COLUMN priority INTEGER NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE sessions ADD COLUMN batch_id TEXT;
ALTER TABLE sessions
    ADD COLUMN batch_max_running INTEGER CHECK (batch_max_running > 0);
ALTER TABLE sessions ADD COLUMN held INTEGER NOT NULL DEFAULT 0 CHECK (held IN (0, 1));
ALTER TABLE sessions ADD COLUMN retries INTEGER NOT NULL DEFAULT 0 CHECK (retries >= 0);

CREATE INDEX sessions_held_idx
    ON sessions (queue, tenant, batch_id, priority DESC, id, batch_max_running)
    WHERE held AND status = 'queued';

CREATE INDEX sessions_active_idx
    ON sessions (queue, tenant, batch_id)
    WHERE status IN ('queued', 'running') AND NOT held;

-- The sweeper's read of sessions without a stream entry leaves held ones to the
-- dispatcher: its index must not hold them (a large backlog would be read every pass).
DROP INDEX sessions_unenqueued_idx;
CREATE INDEX sessions_unenqueued_idx
    ON sessions (created_at)
    WHERE status IN ('queued', 'running') AND enqueued_at IS NULL AND NOT held;
