-- agentq: approvals across sessions, and approvals with edited arguments.
--
-- A person who approves a held call may change its arguments: the call then runs with
-- these (a JSON object, as text) instead of the model's, after the same checks a
-- model's call passes. NULL: it runs as the model made it.
ALTER TABLE approvals ADD COLUMN arguments text;

-- `GET /v1/approvals`: a tenant's sessions awaiting a decision, oldest first. Its columns
-- never change once a row exists and `status` is indexed already, so a checkpoint's
-- update stays a HOT update; a row is in it only while it awaits approval.
CREATE INDEX sessions_awaiting_approval_idx
    ON sessions (tenant, id) WHERE status = 'awaiting_approval';
