-- Mirrors the number of migrations/0032_sessions_domains.sql, which moves the value rules
-- of Postgres's `sessions` from table constraints to domains for their cost there. SQLite
-- has no domains, and its CHECK constraints cost nothing per statement: nothing changes.
SELECT 1;
