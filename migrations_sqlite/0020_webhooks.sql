-- Mirrors migrations/0020_webhooks.sql: webhook endpoints and the outbox of deliveries,
-- written by the triggers below in the same transaction as the session change they
-- announce. A trigger cannot be handed "now" by the store, so these take the event's time
-- from SQLite's clock (unix microseconds, as every timestamp here).

CREATE TABLE webhook_endpoints (
    id                 TEXT    NOT NULL PRIMARY KEY,
    tenant             TEXT    NOT NULL,
    url                TEXT    NOT NULL,
    events             TEXT    NOT NULL,
    queue              TEXT,
    batch_id           TEXT,
    description        TEXT,
    secret_salt        TEXT    NOT NULL,
    old_secret_salt    TEXT,
    old_expires_at     INTEGER,
    created_at         INTEGER NOT NULL,
    disabled_at        INTEGER,
    disabled_reason    TEXT,
    failing_since      INTEGER,
    last_failure_at    INTEGER,
    last_failure       TEXT,
    last_success_at    INTEGER
) STRICT;

CREATE INDEX webhook_endpoints_tenant_idx ON webhook_endpoints (tenant, id);

CREATE TABLE webhook_deliveries (
    id              TEXT    NOT NULL PRIMARY KEY,
    endpoint_id     TEXT    NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event           TEXT    NOT NULL,
    session_id      TEXT,
    batch_id        TEXT,
    queue           TEXT,
    status          TEXT,
    finish_reason   TEXT,
    held            TEXT,
    dedupe          TEXT,
    occurred_at     INTEGER NOT NULL,
    state           TEXT    NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    retry_from      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    last_attempt_at INTEGER,
    last_status     INTEGER,
    last_error      TEXT,
    delivered_at    INTEGER,
    UNIQUE (endpoint_id, dedupe)
) STRICT;

CREATE INDEX webhook_deliveries_due_idx
    ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, id);

CREATE TABLE webhook_batch_checks (
    id          TEXT    NOT NULL PRIMARY KEY,
    batch_id    TEXT    NOT NULL,
    tenant      TEXT    NOT NULL,
    queue       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

-- The event of a status (`session.completed`, `.waiting`, `.failed`) is spelt out in each
-- statement: a trigger has no variables.
CREATE TRIGGER sessions_webhook_update AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN OLD.status IS NOT NEW.status
     AND NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_approval')
BEGIN
    INSERT INTO webhook_deliveries (id, endpoint_id, event, session_id, batch_id, queue,
        status, finish_reason, held, occurred_at, retry_from, next_attempt_at)
    SELECT 'msg_' || printf('%014x', t.now) || lower(hex(randomblob(16))), e.id, t.ev,
        NEW.id, NEW.batch_id, NEW.queue, NEW.status, NEW.finish_reason,
        CASE WHEN t.ev = 'session.waiting' THEN NEW.not_started END, t.now, t.now, t.now
    FROM (SELECT CASE NEW.status WHEN 'completed' THEN 'session.completed'
                    WHEN 'awaiting_approval' THEN 'session.waiting'
                    ELSE 'session.failed' END AS ev,
                 CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) AS now) t
    JOIN webhook_endpoints e ON e.tenant = NEW.tenant
    WHERE e.disabled_at IS NULL
      AND instr(e.events, ',' || t.ev || ',') > 0
      AND (e.queue IS NULL OR e.queue = NEW.queue)
      AND (e.batch_id IS NULL OR e.batch_id = NEW.batch_id);
    INSERT INTO webhook_batch_checks (id, batch_id, tenant, queue, created_at)
    SELECT lower(hex(randomblob(16))), NEW.batch_id, NEW.tenant, NEW.queue,
        CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)
    WHERE NEW.batch_id IS NOT NULL AND NEW.status <> 'awaiting_approval' AND EXISTS (
        SELECT 1 FROM webhook_endpoints e
        WHERE e.tenant = NEW.tenant AND e.disabled_at IS NULL
          AND instr(e.events, ',batch.completed,') > 0
          AND (e.queue IS NULL OR e.queue = NEW.queue)
          AND (e.batch_id IS NULL OR e.batch_id = NEW.batch_id));
END;

CREATE TRIGGER sessions_webhook_insert AFTER INSERT ON sessions FOR EACH ROW
    WHEN NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_approval')
BEGIN
    INSERT INTO webhook_deliveries (id, endpoint_id, event, session_id, batch_id, queue,
        status, finish_reason, held, occurred_at, retry_from, next_attempt_at)
    SELECT 'msg_' || printf('%014x', t.now) || lower(hex(randomblob(16))), e.id, t.ev,
        NEW.id, NEW.batch_id, NEW.queue, NEW.status, NEW.finish_reason,
        CASE WHEN t.ev = 'session.waiting' THEN NEW.not_started END, t.now, t.now, t.now
    FROM (SELECT CASE NEW.status WHEN 'completed' THEN 'session.completed'
                    WHEN 'awaiting_approval' THEN 'session.waiting'
                    ELSE 'session.failed' END AS ev,
                 CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) AS now) t
    JOIN webhook_endpoints e ON e.tenant = NEW.tenant
    WHERE e.disabled_at IS NULL
      AND instr(e.events, ',' || t.ev || ',') > 0
      AND (e.queue IS NULL OR e.queue = NEW.queue)
      AND (e.batch_id IS NULL OR e.batch_id = NEW.batch_id);
    INSERT INTO webhook_batch_checks (id, batch_id, tenant, queue, created_at)
    SELECT lower(hex(randomblob(16))), NEW.batch_id, NEW.tenant, NEW.queue,
        CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)
    WHERE NEW.batch_id IS NOT NULL AND NEW.status <> 'awaiting_approval' AND EXISTS (
        SELECT 1 FROM webhook_endpoints e
        WHERE e.tenant = NEW.tenant AND e.disabled_at IS NULL
          AND instr(e.events, ',batch.completed,') > 0
          AND (e.queue IS NULL OR e.queue = NEW.queue)
          AND (e.batch_id IS NULL OR e.batch_id = NEW.batch_id));
END;
