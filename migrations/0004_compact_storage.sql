-- agentq: less storage and fewer writes per step.
--
-- `messages` is the table that grows with every step, and its key is stored twice per
-- message (in the row and in the primary-key index, whose
-- pages sit about half full because many sessions append to their own key ranges at
-- once). So:
--
-- * the ids are stored as 16-byte `uuid` (they are UUID v7 strings everywhere else, and
--   in the API) instead of 36-character text: ~40 bytes less per row and per index entry;
-- * the body is `json` rather than `jsonb`: the history is written once per step and read
--   back whole, never queried into, so the exact text is stored (smaller than jsonb for
--   small objects) and a checkpoint does not pay for the conversion;
-- * the foreign key to `sessions` is dropped: rows are only ever inserted by a checkpoint
--   (or a session's creation) joined to its session's own row in the same statement, so
--   it could not fail, and it cost every insert a lookup and a lock on the session row.
--   Deleting a session now deletes its messages explicitly.
--
-- The column changes rewrite `messages`: on a large installation, run `agentq migrate`
-- in a quiet hour.

ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_root_id_session_id_fkey;

ALTER TABLE messages
    ALTER COLUMN root_id TYPE uuid USING root_id::uuid,
    ALTER COLUMN session_id TYPE uuid USING session_id::uuid,
    ALTER COLUMN body TYPE json USING body::json;

-- Every checkpoint updates its session's row. With full pages the new row version goes to
-- another page: the update is not HOT, so it also writes a new entry into every index of
-- `sessions`, and the table grows by a row per step until VACUUM comes by. Half-full
-- pages leave room for the next versions on the same page, where they are HOT (no index
-- writes) and pruned in place.
ALTER TABLE sessions SET (fillfactor = 50);
