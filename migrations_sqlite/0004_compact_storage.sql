-- Mirrors migrations/0004_compact_storage.sql, as far as SQLite has the same things.
--
-- * The foreign key from `messages` to `sessions` goes, as on Postgres: rows are only ever
--   inserted by a checkpoint or a follow-up whose fenced update of the session's own row
--   matched in the same transaction, so it could not fail, and it cost every insert a
--   lookup of the session. SQLite cannot drop a constraint, so the table is rebuilt with
--   the same columns, key and rows.
-- * Postgres' other changes have no SQLite counterpart: ids stay TEXT (SQLite has no
--   16-byte uuid type), bodies are TEXT already (the exact JSON text, as Postgres' `json`),
--   and there is no fillfactor.

CREATE TABLE messages_rebuilt (
    root_id     TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 0),
    role        TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (root_id, session_id, seq)
) STRICT, WITHOUT ROWID;

INSERT INTO messages_rebuilt (root_id, session_id, seq, role, body, created_at)
SELECT root_id, session_id, seq, role, body, created_at FROM messages;

DROP TABLE messages;
ALTER TABLE messages_rebuilt RENAME TO messages;
