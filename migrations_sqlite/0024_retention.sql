-- Mirrors migrations/0024_retention.sql: trees whose transcript retention dropped, and
-- the usage of the sessions it deleted.
ALTER TABLE sessions ADD COLUMN pruned_at INTEGER;

CREATE INDEX sessions_retention_idx
    ON sessions (finished_at)
    WHERE parent_id IS NULL AND finished_at IS NOT NULL AND pruned_at IS NULL;

CREATE TABLE retired_usage (
    id                   TEXT    NOT NULL PRIMARY KEY,
    tenant               TEXT    NOT NULL,
    model                TEXT,
    created_at           INTEGER NOT NULL,
    input_tokens         INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens        INTEGER NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens    INTEGER NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens   INTEGER NOT NULL CHECK (cache_write_tokens >= 0),
    reasoning_tokens     INTEGER NOT NULL CHECK (reasoning_tokens >= 0),
    web_search_requests  INTEGER NOT NULL CHECK (web_search_requests >= 0)
) STRICT;

CREATE INDEX retired_usage_created_idx ON retired_usage (created_at);
