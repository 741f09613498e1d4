-- agentq: how many times a session was taken over: claimed by a worker while another
-- still held its lease on paper, expired (the holder died or stopped renewing). An
-- operator reads it to tell a session that ran once from one that crashed workers.
ALTER TABLE sessions ADD COLUMN takeovers integer NOT NULL DEFAULT 0 CHECK (takeovers >= 0);
