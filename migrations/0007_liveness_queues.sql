-- agentq: leases decide liveness, and queues are named by the operator.
--
-- The sweeper re-queues every running session whose lease expired, whatever became of
-- its stream entry: it finds them by their lease's expiry.
CREATE INDEX sessions_running_lease_idx
    ON sessions (lease_expires_at) WHERE status = 'running';

-- Queues an admin created through the API, on top of the configured ones (each queue is
-- a Redis stream and a label of the metrics, so callers may not invent them).
CREATE TABLE queues (
    name        text        NOT NULL PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);
