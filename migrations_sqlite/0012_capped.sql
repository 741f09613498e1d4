-- Mirrors migrations/0012_capped.sql: a capped session is held for the dispatcher
-- whenever it goes back to the queue.
ALTER TABLE sessions ADD COLUMN capped INTEGER NOT NULL DEFAULT 0 CHECK (capped IN (0, 1));
