-- agentq: a cap on running sessions holds for a session every time it is queued, not
-- only when it was created.
--
-- A session of a tenant or batch with a cap on running sessions (or a sub-agent of such
-- a tree) is `capped`: whenever it goes back to the queue (woken by a child's result, a
-- decision, a follow-up, the end of a rate-limit wait, a raised budget, a retry) it is
-- held for the dispatcher instead of entering the stream at once, so sessions that were
-- waiting (and not counted) cannot all return past the cap together.
ALTER TABLE sessions ADD COLUMN capped boolean NOT NULL DEFAULT false;
