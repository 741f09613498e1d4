-- Mirrors migrations/0006_tenants_keys.sql: sessions carry their tenant (`default` for
-- rows from before), idempotency keys are unique per tenant and bound to a request hash,
-- and API keys are stored as the SHA-256 of the key.

ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
ALTER TABLE sessions ADD COLUMN idempotency_hash TEXT;

DROP INDEX sessions_idempotency_key_idx;
CREATE UNIQUE INDEX sessions_tenant_idempotency_key_idx
    ON sessions (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE INDEX sessions_tenant_id_idx ON sessions (tenant, id DESC);

CREATE TABLE api_keys (
    id           TEXT    NOT NULL PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    scopes       TEXT    NOT NULL,
    label        TEXT,
    secret_hash  TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER,
    revoked_at   INTEGER
) STRICT;
