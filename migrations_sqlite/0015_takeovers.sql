-- Mirrors migrations/0015_takeovers.sql: how many times a session was taken over from a
-- worker whose lease had expired.
ALTER TABLE sessions ADD COLUMN takeovers INTEGER NOT NULL DEFAULT 0 CHECK (takeovers >= 0);
