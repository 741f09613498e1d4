-- Mirrors migrations/0011_workspaces.sql: content-addressed blobs and each tree's
-- manifest of committed files.

CREATE TABLE blobs (
    sha256      TEXT    NOT NULL PRIMARY KEY,
    size        INTEGER NOT NULL CHECK (size >= 0),
    data        BLOB,
    touched_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX blobs_touched_idx ON blobs (touched_at);

CREATE TABLE workspace_files (
    root_id          TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path             TEXT    NOT NULL,
    sha256           TEXT    NOT NULL,
    size             INTEGER NOT NULL CHECK (size >= 0),
    modified_at_seq  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (root_id, path)
) STRICT;

CREATE INDEX workspace_files_sha256_idx ON workspace_files (sha256);

CREATE INDEX sessions_finished_root_idx
    ON sessions (finished_at) WHERE parent_id IS NULL AND finished_at IS NOT NULL;
