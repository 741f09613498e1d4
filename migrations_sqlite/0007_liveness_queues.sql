-- Mirrors migrations/0007_liveness_queues.sql: running sessions by lease expiry (the
-- sweeper re-queues those whose lease ran out), and the queues an admin created.

CREATE INDEX sessions_running_lease_idx
    ON sessions (lease_expires_at) WHERE status = 'running';

CREATE TABLE queues (
    name        TEXT    NOT NULL PRIMARY KEY,
    created_at  INTEGER NOT NULL
) STRICT;
