-- agentq: liveness in the store, one row per worker.
--
-- A worker renews one row per heartbeat (`workers.expires_at`) instead of the lease of
-- every session it runs: a session's lease holds while its owner's row is live (or, for
-- a claim not yet covered by a heartbeat and for workers from before this table, while
-- the session's own `lease_expires_at` is ahead). A renewal rewrites one small row whose
-- only index is its key: a HOT update, whatever the number of sessions it covers.
CREATE TABLE workers (
    id          text        NOT NULL PRIMARY KEY,
    expires_at  timestamptz NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);

-- A finished session's settle steps (its parent told, its follow-up started, its
-- completion published) are done once `announced_at` is set. The queue entry is acked at
-- the claim, so a worker that dies between the terminal commit and these steps leaves no
-- redelivery behind: the store finds such sessions here and settles them again.
ALTER TABLE sessions ADD COLUMN announced_at timestamptz;
UPDATE sessions SET announced_at = COALESCE(finished_at, updated_at)
WHERE status IN ('completed', 'failed', 'cancelled');
CREATE INDEX sessions_unannounced_idx ON sessions (finished_at)
    WHERE announced_at IS NULL AND status IN ('completed', 'failed', 'cancelled');
