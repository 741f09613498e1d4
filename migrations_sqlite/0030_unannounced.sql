-- Mirrors migrations/0030_unannounced.sql: the finished sessions whose settle steps are
-- not done yet, one row each, made and cleared by triggers on the session's status.
CREATE TABLE unannounced (
    id          TEXT    NOT NULL PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    finished_at INTEGER NOT NULL
) STRICT;
CREATE INDEX unannounced_finished_idx ON unannounced (finished_at);

INSERT INTO unannounced (id, finished_at)
SELECT id, COALESCE(finished_at, updated_at) FROM sessions
WHERE announced_at IS NULL AND status IN ('completed', 'failed', 'cancelled');
DROP INDEX sessions_unannounced_idx;
ALTER TABLE sessions DROP COLUMN announced_at;

CREATE TRIGGER sessions_unannounced_finish AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN OLD.status IS NOT NEW.status AND NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    INSERT INTO unannounced (id, finished_at)
    VALUES (NEW.id, COALESCE(NEW.finished_at,
                             CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)))
    ON CONFLICT (id) DO UPDATE SET finished_at = excluded.finished_at;
END;

CREATE TRIGGER sessions_unannounced_reopen AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN OLD.status IS NOT NEW.status AND OLD.status IN ('completed', 'failed', 'cancelled')
     AND NEW.status NOT IN ('completed', 'failed', 'cancelled')
BEGIN
    DELETE FROM unannounced WHERE id = NEW.id;
END;

CREATE TRIGGER sessions_unannounced_insert AFTER INSERT ON sessions FOR EACH ROW
    WHEN NEW.status IN ('completed', 'failed', 'cancelled')
BEGIN
    INSERT INTO unannounced (id, finished_at)
    VALUES (NEW.id, COALESCE(NEW.finished_at,
                             CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)));
END;
