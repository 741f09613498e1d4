-- agentq: what a waiting session waits for, and when it wakes by itself.
--
-- A session suspended for a rate limit waits without a lease or a slot until `wake_at`;
-- the sweeper re-queues those whose time has come, oldest first, through the index below.
-- `wait_reason` names the wait (`children`, `approval`, `rate_limit`, `budget`) for the
-- API, the metrics, and the budget side, which wakes its own parked sessions.
ALTER TABLE sessions ADD COLUMN wait_reason text;
ALTER TABLE sessions ADD COLUMN wake_at timestamptz;

CREATE INDEX sessions_wake_at_idx
    ON sessions (wake_at) WHERE status = 'waiting' AND wake_at IS NOT NULL;

CREATE INDEX sessions_wait_reason_idx
    ON sessions (tenant, wait_reason) WHERE status = 'waiting';
