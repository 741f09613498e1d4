-- Mirrors migrations/0025_hot_leases.sql: running sessions by owner, not by lease expiry
-- (a renewal then rewrites no index entry).
DROP INDEX IF EXISTS sessions_running_lease_idx;
CREATE INDEX sessions_running_owner_idx ON sessions (lease_owner) WHERE status = 'running';
