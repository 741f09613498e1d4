-- Retention rules set through the admin API (`/v1/admin/retention`): one per tenant or
-- per queue, each replacing the configured override of the same tenant or queue.
CREATE TABLE retention_rules (
    -- tenant | queue
    kind       text        NOT NULL,
    name       text        NOT NULL,
    days       bigint      NOT NULL CHECK (days >= 1),
    -- none | result
    keep       text        NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (kind, name)
);
