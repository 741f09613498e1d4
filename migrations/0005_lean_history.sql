-- agentq: a session's fixed cost, and its first claim, made smaller.
--
-- * The first message of every history is the user's prompt (`SessionState::new`), and the
--   prompt is already in the spec, so it is no longer stored as message 0: a store that
--   finds no seq 0 puts `Message::user(spec.prompt)` in front, as it always has. Rows
--   written before keep their stored copy; both read back the same.
-- * `history_len` is the history's length as the last write left it (message 0 included).
--   A claim reads `messages` only when something past message 0 may be stored (more than
--   one, or NULL: a row from before this column, whose length is unknown), so a fresh
--   session's first claim is one statement instead of two. Every write that adds messages
--   sets it in the same statement.
-- * `messages.role` goes: nothing reads it (the body holds the role), and it cost every row
--   a few bytes and a column to write.
-- * `spec` becomes `json`: it is written once and read back whole, never queried into, and
--   `jsonb` stores a small object ~30 % larger than its text. Every update of the session
--   row (two per step) copies it, so that is paid on every version of the row.
--
-- The `spec` change rewrites `sessions`: on a large installation, run `agentq migrate` in a
-- quiet hour.

ALTER TABLE sessions ADD COLUMN history_len integer CHECK (history_len >= 1);

ALTER TABLE messages DROP COLUMN role;

ALTER TABLE sessions ALTER COLUMN spec TYPE json USING spec::json;
