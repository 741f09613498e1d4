-- Mirrors migrations/0008_rate_limit_waits.sql: what a waiting session waits for, and
-- when it wakes by itself (unix microseconds).

ALTER TABLE sessions ADD COLUMN wait_reason TEXT;
ALTER TABLE sessions ADD COLUMN wake_at INTEGER;

CREATE INDEX sessions_wake_at_idx
    ON sessions (wake_at) WHERE status = 'waiting' AND wake_at IS NOT NULL;

CREATE INDEX sessions_wait_reason_idx
    ON sessions (tenant, wait_reason) WHERE status = 'waiting';
