-- agentq: one row per tenant with a budget holding what a hold must check, so that
-- letting a call start is one conditional update of that row instead of an advisory lock,
-- a sum over every hold in flight and a sum over the period's days.
--
-- `day`/`month` name the UTC day (`YYYY-MM-DD`) and month (`YYYY-MM`) the spend counters
-- are for: a counter of an earlier period counts as zero, and the next spend starts it
-- again. `held_*` is the sum of the tenant's rows in `tenant_holds`; a hold that expires
-- (its worker died) stays counted until a refused hold recounts them, so drift can only
-- refuse, never admit, and is mended before a refusal is reported.
CREATE TABLE tenant_ledger (
    tenant           text   PRIMARY KEY,
    day              text   NOT NULL,
    day_tokens       bigint NOT NULL DEFAULT 0 CHECK (day_tokens >= 0),
    day_cost_nanos   bigint NOT NULL DEFAULT 0 CHECK (day_cost_nanos >= 0),
    month            text   NOT NULL,
    month_tokens     bigint NOT NULL DEFAULT 0 CHECK (month_tokens >= 0),
    month_cost_nanos bigint NOT NULL DEFAULT 0 CHECK (month_cost_nanos >= 0),
    held_tokens      bigint NOT NULL DEFAULT 0 CHECK (held_tokens >= 0),
    held_cost_nanos  bigint NOT NULL DEFAULT 0 CHECK (held_cost_nanos >= 0)
);

-- What was spent and held before this table existed.
INSERT INTO tenant_ledger (tenant, day, day_tokens, day_cost_nanos, month, month_tokens,
                           month_cost_nanos, held_tokens, held_cost_nanos)
SELECT t.tenant, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD'),
       COALESCE((SELECT sum(tokens) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND s.day = to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')), 0),
       COALESCE((SELECT sum(cost_nanos) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND s.day = to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')), 0),
       to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM'),
       COALESCE((SELECT sum(tokens) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND s.day LIKE to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM') || '-%'), 0),
       COALESCE((SELECT sum(cost_nanos) FROM tenant_spend s WHERE s.tenant = t.tenant
                   AND s.day LIKE to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM') || '-%'), 0),
       COALESCE((SELECT sum(tokens) FROM tenant_holds h WHERE h.tenant = t.tenant), 0),
       COALESCE((SELECT sum(cost_nanos) FROM tenant_holds h WHERE h.tenant = t.tenant), 0)
FROM (SELECT tenant FROM tenant_spend UNION SELECT tenant FROM tenant_holds) t;
