-- agentq: the finished sessions whose settle steps (parent told, follow-up started,
-- completion published) are not done yet, one small row each, instead of a mark on the
-- session's row. Setting that mark rewrote the whole session row after its terminal
-- commit, and since the mark was part of an index's condition the rewrite added an entry
-- to every index of `sessions`: it cost about a fifth of the Postgres time of a session.
-- A row here is made by a trigger in the statement that makes the session terminal
-- (whichever statement it is: a worker's commit, a cancel, the sweeper), and deleted once
-- the steps are done; a session that leaves its terminal state (a follow-up) leaves it.
CREATE TABLE unannounced (
    id          text        NOT NULL PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    finished_at timestamptz NOT NULL
);
CREATE INDEX unannounced_finished_idx ON unannounced (finished_at);

INSERT INTO unannounced (id, finished_at)
SELECT id, COALESCE(finished_at, updated_at) FROM sessions
WHERE announced_at IS NULL AND status IN ('completed', 'failed', 'cancelled');
DROP INDEX sessions_unannounced_idx;
ALTER TABLE sessions DROP COLUMN announced_at;

CREATE FUNCTION session_unannounced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        INSERT INTO unannounced (id, finished_at)
        VALUES (NEW.id, COALESCE(NEW.finished_at, now()))
        ON CONFLICT (id) DO UPDATE SET finished_at = EXCLUDED.finished_at;
    ELSE
        DELETE FROM unannounced WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_unannounced_update AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status IN ('completed', 'failed', 'cancelled')
               OR OLD.status IN ('completed', 'failed', 'cancelled')))
    EXECUTE FUNCTION session_unannounced();

CREATE TRIGGER sessions_unannounced_insert AFTER INSERT ON sessions FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION session_unannounced();
