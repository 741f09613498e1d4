-- Mirrors migrations/0022_schedules.sql: schedules and the history of their fires.
-- SQLite has one writer at a time, so the claim needs no row lock; the lease and the
-- idempotency key of each fire's session work as on Postgres.

CREATE TABLE schedules (
    id                   TEXT    NOT NULL PRIMARY KEY,
    tenant               TEXT    NOT NULL,
    cron                 TEXT,
    timezone             TEXT    NOT NULL,
    every_secs           INTEGER,
    template             TEXT    NOT NULL,
    overlap              TEXT    NOT NULL,
    catchup_window_secs  INTEGER NOT NULL,
    description          TEXT,
    paused               INTEGER NOT NULL DEFAULT 0,
    next_fire_at         INTEGER NOT NULL,
    buffered_fire_at     INTEGER,
    last_session_id      TEXT,
    lease_token          TEXT,
    lease_until          INTEGER,
    claimed_at           INTEGER,
    created_at           INTEGER NOT NULL
) STRICT;

CREATE INDEX schedules_tenant_idx ON schedules (tenant, id);
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE schedule_fires (
    schedule_id  TEXT    NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    fire_time    INTEGER NOT NULL,
    outcome      TEXT    NOT NULL,
    session_id   TEXT,
    cancelled_session_id TEXT,
    error        TEXT,
    manual       INTEGER NOT NULL DEFAULT 0,
    recorded_at  INTEGER NOT NULL,
    PRIMARY KEY (schedule_id, fire_time)
) STRICT;
