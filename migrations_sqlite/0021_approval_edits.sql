-- Mirrors migrations/0021_approval_edits.sql: edited arguments of an approval, and a
-- tenant's sessions awaiting a decision.
ALTER TABLE approvals ADD COLUMN arguments TEXT;

CREATE INDEX sessions_awaiting_approval_idx
    ON sessions (tenant, id) WHERE status = 'awaiting_approval';
