-- Mirrors migrations/0003_inbox.sql: inbox, approvals, wake counter and cursors.

ALTER TABLE sessions ADD COLUMN wake_seq INTEGER NOT NULL DEFAULT 0 CHECK (wake_seq >= 0);
ALTER TABLE sessions ADD COLUMN bg_cursor INTEGER NOT NULL DEFAULT 0 CHECK (bg_cursor >= 0);
ALTER TABLE sessions ADD COLUMN msg_cursor INTEGER NOT NULL DEFAULT 0 CHECK (msg_cursor >= 0);
ALTER TABLE sessions ADD COLUMN followup_cursor INTEGER NOT NULL DEFAULT 0 CHECK (followup_cursor >= 0);
ALTER TABLE sessions ADD COLUMN approval_deadline INTEGER;

CREATE TABLE inbox (
    root_id     TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    dedupe      TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (root_id, session_id, seq),
    UNIQUE (root_id, session_id, dedupe),
    FOREIGN KEY (root_id, session_id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
) STRICT;

CREATE TABLE approvals (
    root_id       TEXT    NOT NULL,
    session_id    TEXT    NOT NULL,
    tool_call_id  TEXT    NOT NULL,
    approve       INTEGER NOT NULL CHECK (approve IN (0, 1)),
    reason        TEXT,
    decided_at    INTEGER NOT NULL,
    PRIMARY KEY (root_id, session_id, tool_call_id),
    FOREIGN KEY (root_id, session_id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
) STRICT;

CREATE INDEX sessions_approval_deadline_idx
    ON sessions (approval_deadline) WHERE status = 'awaiting_approval';
