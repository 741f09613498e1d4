-- agentq: tenants and API keys.
--
-- Every session belongs to a tenant (the tenant of the API key that created it; a child
-- inherits its parent's). Rows from before belong to the tenant `default`, which is what
-- a keyless `agentq dev` and every earlier client used.
--
-- Idempotency keys are per tenant: two tenants may each use `order-42`. Each key is bound
-- to a hash of the request it came with, so a repeat with a different body is refused
-- rather than answered with the first session (NULL on rows from before: their repeats
-- are accepted as they always were).

ALTER TABLE sessions
    ADD COLUMN tenant text NOT NULL DEFAULT 'default',
    ADD COLUMN idempotency_hash text;

DROP INDEX sessions_idempotency_key_idx;
CREATE UNIQUE INDEX sessions_tenant_idempotency_key_idx
    ON sessions (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- A tenant's listing, newest first.
CREATE INDEX sessions_tenant_id_idx ON sessions (tenant, id DESC);

-- API keys. A key is `aq_<id>_<secret>`; only the SHA-256 of the whole key is stored
-- (hex), so a database dump does not hand out working keys. `scopes` is a comma-separated
-- list of scope names.
CREATE TABLE api_keys (
    id           text        NOT NULL PRIMARY KEY,
    tenant       text        NOT NULL,
    scopes       text        NOT NULL,
    label        text,
    secret_hash  text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz
);
