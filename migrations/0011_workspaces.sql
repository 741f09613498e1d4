-- agentq: durable workspaces. A session tree's files are a manifest (path -> content)
-- written with the checkpoint of the tool result that changed it, and the contents are
-- blobs keyed by their SHA-256, stored once however many trees hold them.

-- Every content any manifest holds or held. `data` holds the bytes when the database is
-- the blob store (the default); with an external store (S3) the row is only the index
-- the collector and the upload check read, and `data` stays NULL. `touched_at` is reset
-- by every upload and every check that found the blob present, so a blob about to be
-- referenced by a commit is younger than the collector's grace period.
CREATE TABLE blobs (
    sha256      text        NOT NULL PRIMARY KEY,
    size        bigint      NOT NULL CHECK (size >= 0),
    data        bytea,
    touched_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX blobs_touched_idx ON blobs (touched_at);

-- A tree's committed files. The root session's row owns them: deleting it deletes them.
-- Reads go through here only (never a blob by its hash from the API), so a tenant reaches
-- only the contents its own trees hold.
CREATE TABLE workspace_files (
    root_id          text        NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path             text        NOT NULL,
    sha256           text        NOT NULL,
    size             bigint      NOT NULL CHECK (size >= 0),
    modified_at_seq  bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (root_id, path)
);

-- The collector's question: is this blob referenced anywhere?
CREATE INDEX workspace_files_sha256_idx ON workspace_files (sha256);

-- Finished trees whose workspaces expire: by when the root finished.
CREATE INDEX sessions_finished_root_idx
    ON sessions (finished_at) WHERE parent_id IS NULL AND finished_at IS NOT NULL;
