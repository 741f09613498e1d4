-- Sub-agents, suspension, approvals and steering (DESIGN §5).
--
-- A session that waits (for children, a human, a message) holds no lease and no worker
-- slot. Whatever may wake it appends to its inbox and bumps `wake_seq` under the row lock,
-- so a session suspending at the same moment sees the bump and goes straight back to the
-- queue instead of sleeping through it. Delivery into the history is exactly once: the
-- checkpoint that injects inbox items advances the session's cursor in the same row.

ALTER TABLE sessions
    ADD COLUMN wake_seq          bigint NOT NULL DEFAULT 0 CHECK (wake_seq >= 0),
    -- Inbox positions already delivered: background child results, steering messages.
    ADD COLUMN bg_cursor         bigint NOT NULL DEFAULT 0 CHECK (bg_cursor >= 0),
    ADD COLUMN msg_cursor        bigint NOT NULL DEFAULT 0 CHECK (msg_cursor >= 0),
    -- The last `enqueue` message that was started as a follow-up turn.
    ADD COLUMN followup_cursor   bigint NOT NULL DEFAULT 0 CHECK (followup_cursor >= 0),
    -- While awaiting approval: when an unanswered request counts as denied (`timeout`).
    ADD COLUMN approval_deadline timestamptz;

CREATE TABLE inbox (
    root_id     text        NOT NULL,
    session_id  text        NOT NULL,
    -- The session's wake_seq when the item arrived: unique and increasing per session.
    seq         bigint      NOT NULL,
    -- child_result (background child), child_done (foreground child), message, followup
    kind        text        NOT NULL,
    -- Makes a repeated notification (a redelivered completion) a no-op.
    dedupe      text        NOT NULL,
    payload     jsonb       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (root_id, session_id, seq),
    UNIQUE (root_id, session_id, dedupe),
    FOREIGN KEY (root_id, session_id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
);

CREATE TABLE approvals (
    root_id       text        NOT NULL,
    session_id    text        NOT NULL,
    tool_call_id  text        NOT NULL,
    approve       boolean     NOT NULL,
    reason        text,
    decided_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (root_id, session_id, tool_call_id),
    FOREIGN KEY (root_id, session_id) REFERENCES sessions (root_id, id) ON DELETE CASCADE
);

-- The sweeper: approvals that ran out of time.
CREATE INDEX sessions_approval_deadline_idx
    ON sessions (approval_deadline) WHERE status = 'awaiting_approval';
