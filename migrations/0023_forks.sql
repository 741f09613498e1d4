-- agentq: forking a session from any step.
--
-- * A fork's history is the first `fork_at` messages of the session `forked_from`
--   followed by its own, stored under its own id from position `fork_at` on: the prefix is
--   never copied. `forked_from` is always the session whose own messages hold position
--   `fork_at - 1` (a fork of a fork inside its origin's prefix points past it), so a
--   history is read by walking at most a bounded chain of origins. Retention must keep
--   every session some `forked_from` names.
-- * `workspace_versions` keeps every change of a tree's files (a NULL content: deleted),
--   so the files as of any step can be found again: `step_len` is the root's history
--   length at the first of its checkpoints that could see the change (the root's own
--   change: the length its checkpoint wrote; a sub-agent's: one past the root's stored
--   length then). The files as of the step that ends at history length P are, per path,
--   the latest version with `step_len <= P`. Contents stay blobs, shared; `ver` orders two
--   versions of one path with the same `step_len`.
--   A tree's files from before this migration are kept as of step 0 (their earlier
--   versions were never stored): a fork of such a tree starts from its latest files.

ALTER TABLE sessions
    ADD COLUMN forked_from text,
    ADD COLUMN fork_at integer CHECK (fork_at >= 1);

CREATE INDEX sessions_forked_from_idx ON sessions (forked_from) WHERE forked_from IS NOT NULL;

CREATE TABLE workspace_versions (
    ver       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    root_id   text   NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    path      text   NOT NULL,
    sha256    text,
    size      bigint NOT NULL CHECK (size >= 0),
    step_len  integer NOT NULL CHECK (step_len >= 0)
);

CREATE INDEX workspace_versions_root_idx ON workspace_versions (root_id, step_len);
-- The collector's question, as for `workspace_files`.
CREATE INDEX workspace_versions_sha256_idx ON workspace_versions (sha256);

INSERT INTO workspace_versions (root_id, path, sha256, size, step_len)
SELECT root_id, path, sha256, size, 0 FROM workspace_files;
