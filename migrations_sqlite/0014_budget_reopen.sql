-- Mirrors migrations/0014_budget_reopen.sql: what a child that gave its allowance back
-- counts in its parent's budget_children_spent.
ALTER TABLE sessions ADD COLUMN budget_consumed INTEGER CHECK (budget_consumed >= 0);
