-- Mirrors migrations/0028_worker_liveness.sql: one liveness row per worker, and the mark
-- of a finished session whose settle steps are done.
CREATE TABLE workers (
    id          TEXT    NOT NULL PRIMARY KEY,
    expires_at  INTEGER NOT NULL,
    started_at  INTEGER NOT NULL
) STRICT;

ALTER TABLE sessions ADD COLUMN announced_at INTEGER;
UPDATE sessions SET announced_at = COALESCE(finished_at, updated_at)
WHERE status IN ('completed', 'failed', 'cancelled');
CREATE INDEX sessions_unannounced_idx ON sessions (finished_at)
    WHERE announced_at IS NULL AND status IN ('completed', 'failed', 'cancelled');
