-- Mirrors migrations/0002_turns.sql. Per-turn iteration allowance (follow-up messages
-- start a new turn) and the calls held back before they ran (awaiting approval), so a
-- resumed run knows they never started. `not_started` is a JSON array (TEXT).
ALTER TABLE sessions
    ADD COLUMN turn_base INTEGER NOT NULL DEFAULT 0 CHECK (turn_base >= 0);
ALTER TABLE sessions
    ADD COLUMN not_started TEXT NOT NULL DEFAULT '[]';
