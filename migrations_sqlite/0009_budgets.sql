-- Mirrors migrations/0009_budgets.sql: the tree budget's ledger on the session rows, the
-- cap on a tree's sessions, tenant budgets set through the admin API and tenant spend
-- per UTC day.

ALTER TABLE sessions ADD COLUMN budget_allowance INTEGER CHECK (budget_allowance >= 0);
ALTER TABLE sessions ADD COLUMN budget_held INTEGER NOT NULL DEFAULT 0 CHECK (budget_held >= 0);
ALTER TABLE sessions ADD COLUMN budget_children_spent INTEGER NOT NULL DEFAULT 0
    CHECK (budget_children_spent >= 0);
ALTER TABLE sessions ADD COLUMN budget_returned INTEGER NOT NULL DEFAULT 0
    CHECK (budget_returned IN (0, 1));
ALTER TABLE sessions ADD COLUMN tree_sessions INTEGER NOT NULL DEFAULT 1 CHECK (tree_sessions >= 0);

CREATE INDEX sessions_budget_unreturned_idx ON sessions (id)
    WHERE budget_allowance IS NOT NULL AND budget_returned = 0;

CREATE TABLE tenant_budgets (
    tenant      TEXT    NOT NULL PRIMARY KEY,
    period      TEXT    NOT NULL CHECK (period IN ('day', 'month')),
    tokens      INTEGER CHECK (tokens >= 0),
    usd_nanos   INTEGER CHECK (usd_nanos >= 0),
    on_budget   TEXT    NOT NULL CHECK (on_budget IN ('park', 'fail')),
    updated_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE tenant_spend (
    tenant      TEXT    NOT NULL,
    day         TEXT    NOT NULL,
    tokens      INTEGER NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    cost_nanos  INTEGER NOT NULL DEFAULT 0 CHECK (cost_nanos >= 0),
    PRIMARY KEY (tenant, day)
) STRICT;
