-- Per-turn iteration allowance (follow-up messages start a new turn) and the calls held
-- back before they ran (awaiting approval), so a resumed run knows they never started.
ALTER TABLE sessions
    ADD COLUMN turn_base integer NOT NULL DEFAULT 0 CHECK (turn_base >= 0),
    ADD COLUMN not_started jsonb NOT NULL DEFAULT '[]'::jsonb;
