-- agentq: what the LLM calls in flight of a tenant with a budget may still spend.
--
-- Each call of such a tenant holds its worst case (prompt estimate plus max_tokens, and
-- its price) from its start to its end, when the hold becomes the call's real spend in
-- `tenant_spend`. A call starts only while the tenant's spend plus every other call's
-- hold is below its budget, so a tenant ends within its budget plus one call, however
-- many calls run at once on however many workers. A worker that dies mid-call leaves its
-- hold to expire.
CREATE TABLE tenant_holds (
    id          text        PRIMARY KEY,
    tenant      text        NOT NULL,
    tokens      bigint      NOT NULL CHECK (tokens >= 0),
    cost_nanos  bigint      NOT NULL CHECK (cost_nanos >= 0),
    expires_at  timestamptz NOT NULL
);

CREATE INDEX tenant_holds_tenant_idx ON tenant_holds (tenant, expires_at);
