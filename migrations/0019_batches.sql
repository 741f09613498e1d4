-- agentq: batches as objects of the API (`/v1/batches`), scoped by tenant like sessions.
-- A batch's sessions carry its id (`sessions.batch_id`, 0010); what they did (counts by
-- status and finish reason, tokens, first start, last finish) is read from them through
-- the partial index of 0016 when the batch is read. Nothing here is written as its
-- sessions run: a checkpoint does the same work in a batch as alone.
CREATE TABLE batches (
    id           text        NOT NULL PRIMARY KEY,
    tenant       text        NOT NULL,
    -- The caller's metadata: a JSON object.
    metadata     json        NOT NULL,
    -- At most this many of its sessions running or buffered at once (also on each
    -- session, `batch_max_running`, where the dispatcher reads it).
    max_running  integer     CHECK (max_running > 0),
    -- The sessions it was created with.
    items        bigint      NOT NULL CHECK (items >= 0),
    created_at   timestamptz NOT NULL,
    -- Set by the first cancel of the batch.
    cancelled_at timestamptz
);

-- A tenant's batches, newest first (`GET /v1/batches`).
CREATE INDEX batches_tenant_idx ON batches (tenant, id);

-- The client's name of an item (`custom_id`), unique within its batch: results are
-- matched to their requests by it, so two items of one name would be ambiguous.
ALTER TABLE sessions ADD COLUMN custom_id text;
CREATE UNIQUE INDEX sessions_batch_custom_id_idx
    ON sessions (batch_id, custom_id) WHERE custom_id IS NOT NULL;
