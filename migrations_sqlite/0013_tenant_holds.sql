-- Mirrors migrations/0013_tenant_holds.sql: the worst case of each LLM call in flight of a
-- tenant with a budget. `expires_at` in microseconds since the epoch.
CREATE TABLE tenant_holds (
    id          TEXT    NOT NULL PRIMARY KEY,
    tenant      TEXT    NOT NULL,
    tokens      INTEGER NOT NULL CHECK (tokens >= 0),
    cost_nanos  INTEGER NOT NULL CHECK (cost_nanos >= 0),
    expires_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX tenant_holds_tenant_idx ON tenant_holds (tenant, expires_at);
