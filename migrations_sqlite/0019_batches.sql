-- Mirrors migrations/0019_batches.sql: batches as objects of the API, and the client's
-- name of each item of one (`custom_id`), unique within its batch.
CREATE TABLE batches (
    id           TEXT    NOT NULL PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    metadata     TEXT    NOT NULL,
    max_running  INTEGER CHECK (max_running > 0),
    items        INTEGER NOT NULL CHECK (items >= 0),
    created_at   INTEGER NOT NULL,
    cancelled_at INTEGER
) STRICT;

CREATE INDEX batches_tenant_idx ON batches (tenant, id);

ALTER TABLE sessions ADD COLUMN custom_id TEXT;
CREATE UNIQUE INDEX sessions_batch_custom_id_idx
    ON sessions (batch_id, custom_id) WHERE custom_id IS NOT NULL;
