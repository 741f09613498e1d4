-- agentq: a lease renewal is a HOT update again.
--
-- `sessions_running_lease_idx` indexed the lease's expiry, so every heartbeat of every
-- running session wrote a new row version and an entry in each of the table's indexes
-- (790 B of WAL per renewal, never HOT). Running sessions are found by their owner
-- instead, a column a renewal does not change: the sweeper's search for expired leases
-- reads the running sessions (a partial index, a few rows per worker's slot) and filters
-- by expiry, which costs far less than the renewals did.
DROP INDEX IF EXISTS sessions_running_lease_idx;
CREATE INDEX sessions_running_owner_idx ON sessions (lease_owner) WHERE status = 'running';
