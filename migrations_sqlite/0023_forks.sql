-- Mirrors migrations/0023_forks.sql: a fork's origin and position, and every version of a
-- tree's files.

ALTER TABLE sessions ADD COLUMN forked_from TEXT;
ALTER TABLE sessions ADD COLUMN fork_at INTEGER CHECK (fork_at >= 1);

CREATE INDEX sessions_forked_from_idx ON sessions (forked_from) WHERE forked_from IS NOT NULL;

CREATE TABLE workspace_versions (
    ver       INTEGER NOT NULL PRIMARY KEY,
    root_id   TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path      TEXT    NOT NULL,
    sha256    TEXT,
    size      INTEGER NOT NULL CHECK (size >= 0),
    step_len  INTEGER NOT NULL CHECK (step_len >= 0)
) STRICT;

CREATE INDEX workspace_versions_root_idx ON workspace_versions (root_id, step_len);
CREATE INDEX workspace_versions_sha256_idx ON workspace_versions (sha256);

INSERT INTO workspace_versions (root_id, path, sha256, size, step_len)
SELECT root_id, path, sha256, size, 0 FROM workspace_files;
