-- agentq: schedules (`/v1/schedules`). A tenant's schedule fires a session from its
-- template at each time of a cron expression in a time zone, or every N seconds. The
-- scheduler processes' fire loops claim due rows with a lease (`lease_token`, until
-- `lease_until`; `FOR UPDATE SKIP LOCKED` so claimers side by side never take the same
-- row); the session a fire creates carries an idempotency key made of (schedule, fire
-- time), so a claimer killed between creating it and recording the fire leaves the next
-- claimer to find the same session instead of making a second.

CREATE TABLE schedules (
    id                   text        NOT NULL PRIMARY KEY,
    tenant               text        NOT NULL,
    -- Exactly one of `cron` (with `timezone`) and `every_secs`.
    cron                 text,
    timezone             text        NOT NULL,
    every_secs           bigint,
    -- The `POST /v1/sessions` body each fire sends, as JSON text.
    template             text        NOT NULL,
    -- skip | buffer_one | cancel_other | allow_all
    overlap              text        NOT NULL,
    catchup_window_secs  bigint      NOT NULL,
    description          text,
    paused               boolean     NOT NULL DEFAULT false,
    -- The next fire time not yet handled.
    next_fire_at         timestamptz NOT NULL,
    -- A fire kept for later by `buffer_one` (its time), started when the last one ends.
    buffered_fire_at     timestamptz,
    -- The session the last started fire created (what overlap looks at).
    last_session_id      text,
    lease_token          text,
    lease_until          timestamptz,
    -- When the lease was first taken: a claimer taking over from one that died keeps it,
    -- so it judges the same fire times late (past the catch-up window) as the dead one did.
    claimed_at           timestamptz,
    created_at           timestamptz NOT NULL
);

CREATE INDEX schedules_tenant_idx ON schedules (tenant, id);
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE NOT paused;

-- What each fire did: one row per (schedule, fire time), so a fire is recorded once.
CREATE TABLE schedule_fires (
    schedule_id  text        NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    fire_time    timestamptz NOT NULL,
    -- started | skipped | buffered | missed | failed
    outcome      text        NOT NULL,
    session_id   text,
    -- The session `cancel_other` cancelled for this fire.
    cancelled_session_id text,
    error        text,
    -- Fired by `POST /v1/schedules/{id}/trigger` rather than by the clock.
    manual       boolean     NOT NULL DEFAULT false,
    recorded_at  timestamptz NOT NULL,
    PRIMARY KEY (schedule_id, fire_time)
);
