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
-- * `messages.role` and `messages.created_at` go: nothing reads them (the body holds the
--   role; the session's `updated_at` and its event stream say when steps happened), and
--   with its alignment the timestamp alone cost a message row ~12 bytes.
-- * `messages` loses its unique key (root_id, session_id, seq) for a plain index on
--   (root_id, session_id). Many sessions append to their own key ranges at once, so the
--   unique index's pages sat two-thirds full at ~50 bytes an entry: ~75 bytes per message.
--   A non-unique index deduplicates a session's entries into one posting list, ~6 bytes
--   per message. What the key guaranteed, that no message is stored twice, the writes now
--   ensure themselves: every statement that adds messages holds the session row's lock
--   and stores only seqs from `history_len` on (and a row from before this column checks
--   its stored seqs). Reads sort a session's rows by seq.
-- * The spec moves to `session_specs`, as `json`. Every step updates the session row, and
--   on its half-filled pages each session leaves several versions of it, each with a
--   copy of the spec (written once, never changed, read only by a claim or a listing):
--   out of the row it is stored once. `json` rather than `jsonb`: it is read back whole,
--   never queried into, and `jsonb` stores a small object ~30 % larger than its text.
--
-- Copying the specs out is one pass over `sessions`: on a large installation, run
-- `agentq migrate` in a quiet hour.

ALTER TABLE sessions ADD COLUMN history_len integer CHECK (history_len >= 1);

ALTER TABLE messages DROP COLUMN role, DROP COLUMN created_at;

ALTER TABLE messages DROP CONSTRAINT messages_pkey;
CREATE INDEX messages_session_idx ON messages (root_id, session_id);

CREATE TABLE session_specs (
    root_id  text NOT NULL,
    id       text NOT NULL,
    spec     json NOT NULL,
    PRIMARY KEY (root_id, id),
    FOREIGN KEY (root_id, id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
);
INSERT INTO session_specs (root_id, id, spec) SELECT root_id, id, spec::json FROM sessions;
ALTER TABLE sessions DROP COLUMN spec;
