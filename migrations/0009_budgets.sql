-- agentq: budgets of session trees and tenants.
--
-- A session tree shares one token budget. A child's allowance is drawn from its parent's
-- remaining budget when it is spawned and what it did not spend goes back when it ends:
--   remaining(parent) = allowance - own usage (input + output tokens)
--                       - budget_held - budget_children_spent
-- A root's allowance is its spec's token_budget (budget_allowance stays NULL); a child's
-- is stored here. Own usage is the row's token counters the checkpoint writes anyway, so
-- a checkpoint never writes more for budgets.
ALTER TABLE sessions ADD COLUMN budget_allowance bigint CHECK (budget_allowance >= 0);
-- The allowances of children that have not given theirs back yet.
ALTER TABLE sessions ADD COLUMN budget_held bigint NOT NULL DEFAULT 0 CHECK (budget_held >= 0);
-- What children that gave their allowance back spent (their whole subtree).
ALTER TABLE sessions ADD COLUMN budget_children_spent bigint NOT NULL DEFAULT 0
    CHECK (budget_children_spent >= 0);
-- Set once the allowance went back to the parent, so that it goes back once.
ALTER TABLE sessions ADD COLUMN budget_returned boolean NOT NULL DEFAULT false;
-- On a root: how many sessions its tree has created (itself included); the cap on a
-- tree's sessions is checked and counted against it in the spawn's transaction.
ALTER TABLE sessions ADD COLUMN tree_sessions bigint NOT NULL DEFAULT 1 CHECK (tree_sessions >= 0);

-- Finished children whose allowance did not go back (their worker died in between, or
-- they were cancelled or dead-lettered without a run): the sweeper returns them.
CREATE INDEX sessions_budget_unreturned_idx ON sessions (id)
    WHERE budget_allowance IS NOT NULL AND budget_returned = false;

-- Tenant budgets set through the admin API; they override the configured ones.
CREATE TABLE tenant_budgets (
    tenant      text        NOT NULL PRIMARY KEY,
    period      text        NOT NULL CHECK (period IN ('day', 'month')),
    tokens      bigint      CHECK (tokens >= 0),
    usd_nanos   bigint      CHECK (usd_nanos >= 0),
    on_budget   text        NOT NULL CHECK (on_budget IN ('park', 'fail')),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- What each tenant spent per UTC day (a month is the sum of its days): one upsert per
-- LLM call of a tenant that has a budget.
CREATE TABLE tenant_spend (
    tenant      text        NOT NULL,
    day         text        NOT NULL,
    tokens      bigint      NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    cost_nanos  bigint      NOT NULL DEFAULT 0 CHECK (cost_nanos >= 0),
    PRIMARY KEY (tenant, day)
);
