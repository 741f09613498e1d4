-- agentq: retention of finished session trees.
--
-- `keep = "result"` drops a tree's transcript and keeps its rows: `pruned_at` says when,
-- so that the retention pass does not take the same tree again. Its scan walks roots in
-- order of their finish; this index leaves out the roots pruned already, so a pass
-- keeping results does not read every tree it kept before finding one to prune.
ALTER TABLE sessions ADD COLUMN pruned_at timestamptz;

CREATE INDEX sessions_retention_idx
    ON sessions (finished_at)
    WHERE parent_id IS NULL AND finished_at IS NOT NULL AND pruned_at IS NULL;

-- The usage of sessions retention deleted, one row each: `GET /v1/admin/costs` adds these
-- to the live sessions', so deleting a session never changes what a tenant spent.
CREATE TABLE retired_usage (
    id                   text        NOT NULL PRIMARY KEY,
    tenant               text        NOT NULL,
    model                text,
    created_at           timestamptz NOT NULL,
    input_tokens         bigint      NOT NULL CHECK (input_tokens >= 0),
    output_tokens        bigint      NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens    bigint      NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens   bigint      NOT NULL CHECK (cache_write_tokens >= 0),
    reasoning_tokens     bigint      NOT NULL CHECK (reasoning_tokens >= 0),
    web_search_requests  bigint      NOT NULL CHECK (web_search_requests >= 0)
);

CREATE INDEX retired_usage_created_idx ON retired_usage (created_at);
