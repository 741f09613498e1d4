-- Mirrors migrations/0005_lean_history.sql: the same columns and tables as Postgres.
--
-- * The prompt (message 0 of every history) is no longer stored: the spec holds it, and a
--   store that finds no seq 0 puts it in front. Rows written before keep their copy; both
--   read back the same.
-- * `history_len` is the history's length as the last write left it (message 0
--   included); NULL on rows from before, whose length only their stored seqs tell. A claim
--   reads `messages` only when something past message 0 may be stored.
-- * `messages.role` and `messages.created_at` go: nothing reads them (the body holds the
--   role).
-- * The spec moves to `session_specs`: it is written once and never changed, and both
--   stores read it from there.
--
-- Unlike Postgres, `messages` keeps its primary key (root_id, session_id, seq): the table
-- is clustered by it (WITHOUT ROWID), so a session's history is one range scan, and the key
-- is what keeps a retried checkpoint from storing a message twice. Postgres dropped its
-- key for the space its half-full index pages took, which a clustered table does not pay.

ALTER TABLE sessions ADD COLUMN history_len INTEGER CHECK (history_len >= 1);

ALTER TABLE messages DROP COLUMN role;
ALTER TABLE messages DROP COLUMN created_at;

CREATE TABLE session_specs (
    root_id  TEXT NOT NULL,
    id       TEXT NOT NULL,
    spec     TEXT NOT NULL,
    PRIMARY KEY (root_id, id),
    FOREIGN KEY (root_id, id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
) STRICT;

INSERT INTO session_specs (root_id, id, spec) SELECT root_id, id, spec FROM sessions;

ALTER TABLE sessions DROP COLUMN spec;
