-- Mirrors migrations/0029_tenant_ledger.sql: each tenant's spend of its latest day and
-- month and what its calls in flight hold, in one row.
CREATE TABLE tenant_ledger (
    tenant           TEXT    NOT NULL PRIMARY KEY,
    day              TEXT    NOT NULL,
    day_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (day_tokens >= 0),
    day_cost_nanos   INTEGER NOT NULL DEFAULT 0 CHECK (day_cost_nanos >= 0),
    month            TEXT    NOT NULL,
    month_tokens     INTEGER NOT NULL DEFAULT 0 CHECK (month_tokens >= 0),
    month_cost_nanos INTEGER NOT NULL DEFAULT 0 CHECK (month_cost_nanos >= 0),
    held_tokens      INTEGER NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    held_cost_nanos  INTEGER NOT NULL DEFAULT 0 CHECK (held_cost_nanos >= 0)
) STRICT;

INSERT INTO tenant_ledger (tenant, day, day_tokens, day_cost_nanos, month, month_tokens,
                           month_cost_nanos, held_tokens, held_cost_nanos)
SELECT t.tenant, strftime('%Y-%m-%d', 'now'),
       COALESCE((SELECT sum(tokens) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND s.day = strftime('%Y-%m-%d', 'now')), 0),
       COALESCE((SELECT sum(cost_nanos) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND s.day = strftime('%Y-%m-%d', 'now')), 0),
       strftime('%Y-%m', 'now'),
       COALESCE((SELECT sum(tokens) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND substr(s.day, 1, 7) = strftime('%Y-%m', 'now')), 0),
       COALESCE((SELECT sum(cost_nanos) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND substr(s.day, 1, 7) = strftime('%Y-%m', 'now')), 0),
       COALESCE((SELECT sum(tokens) FROM tenant_holds h WHERE h.tenant = t.tenant), 0),
       COALESCE((SELECT sum(cost_nanos) FROM tenant_holds h WHERE h.tenant = t.tenant), 0)
FROM (SELECT tenant FROM tenant_spend UNION SELECT tenant FROM tenant_holds) t;
