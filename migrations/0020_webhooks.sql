-- agentq: signed webhooks (`/v1/webhooks`). A tenant's endpoints, and the outbox of
-- deliveries to them: one row per (endpoint, event), written by the triggers below in the
-- SAME transaction as the session change it announces, whichever path makes it (a
-- worker's finish or group commit, a cancel, the sweeper, a suspension for approval), so
-- a crash can neither lose nor invent one. The row is also the delivery's state
-- (attempts, next attempt, dead letter): the scheduler's delivery loop claims due rows
-- with `FOR UPDATE SKIP LOCKED`.
--
-- Hot path: the triggers fire only on a change of `status` into a finished or
-- approval-awaiting state (the `WHEN` clause is evaluated without entering the
-- function), and then cost one probe of `webhook_endpoints_tenant_idx`, which finds
-- nothing for a tenant without endpoints.

CREATE TABLE webhook_endpoints (
    id                 text        NOT NULL PRIMARY KEY,
    tenant             text        NOT NULL,
    url                text        NOT NULL,
    -- The subscribed event types between commas, with a comma at each end
    -- (`,session.completed,batch.completed,`), so a type matches as `,type,`.
    events             text        NOT NULL,
    -- Filters: only sessions of this queue, only this batch's.
    queue              text,
    batch_id           text,
    description        text,
    -- The salt the signing secret is derived from (with the operator's key, which the
    -- database never holds): a reader of this table cannot sign.
    secret_salt        text        NOT NULL,
    -- The previous salt after a rotation: both sign until `old_expires_at`.
    old_secret_salt    text,
    old_expires_at     timestamptz,
    created_at         timestamptz NOT NULL,
    -- Set when deliveries failed continuously for too long (or by nothing else); the
    -- owner reads why, and `POST /v1/webhooks/{id}/enable` clears it.
    disabled_at        timestamptz,
    disabled_reason    text,
    -- Since when every attempt failed (NULL after a success).
    failing_since      timestamptz,
    last_failure_at    timestamptz,
    last_failure       text,
    last_success_at    timestamptz
);

CREATE INDEX webhook_endpoints_tenant_idx ON webhook_endpoints (tenant, id);

CREATE TABLE webhook_deliveries (
    -- The `webhook-id` of every attempt: `msg_` and the event's time in hex, so ids sort
    -- by time.
    id              text        NOT NULL PRIMARY KEY,
    endpoint_id     text        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    event           text        NOT NULL,
    session_id      text,
    batch_id        text,
    queue           text,
    -- The session's status and finish reason as the change left them.
    status          text,
    finish_reason   text,
    -- `session.waiting`: the held calls' ids (JSON array).
    held            text,
    -- Makes a repeated announcement a no-op (`batch.completed` once per endpoint).
    dedupe          text,
    occurred_at     timestamptz NOT NULL,
    -- pending (to send, or being sent), delivered, dead (out of retries: a dead letter).
    state           text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- Retries stop this long after `retry_from` (set at the event, reset by a redrive).
    retry_from      timestamptz NOT NULL,
    -- When a claimer may take it; a claim moves it past the attempt's lease.
    next_attempt_at timestamptz NOT NULL,
    last_attempt_at timestamptz,
    last_status     integer,
    last_error      text,
    delivered_at    timestamptz,
    UNIQUE (endpoint_id, dedupe)
);

CREATE INDEX webhook_deliveries_due_idx
    ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint_idx ON webhook_deliveries (endpoint_id, id);

-- A batch session finished while its tenant has a `batch.completed` endpoint: the
-- delivery loop checks whether the batch is complete and, once it is, writes its
-- announcement (deduplicated). Insert-only, so finishing sessions of one batch never
-- wait on each other's row lock.
CREATE TABLE webhook_batch_checks (
    id          text        NOT NULL PRIMARY KEY,
    batch_id    text        NOT NULL,
    tenant      text        NOT NULL,
    queue       text        NOT NULL,
    created_at  timestamptz NOT NULL
);

CREATE FUNCTION webhook_session_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ev text := CASE NEW.status
        WHEN 'completed' THEN 'session.completed'
        WHEN 'awaiting_approval' THEN 'session.waiting'
        ELSE 'session.failed' END;
    at timestamptz := clock_timestamp();
    stamp text := lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 14, '0');
BEGIN
    INSERT INTO webhook_deliveries (id, endpoint_id, event, session_id, batch_id, queue,
        status, finish_reason, held, occurred_at, retry_from, next_attempt_at)
    SELECT 'msg_' || stamp || replace(gen_random_uuid()::text, '-', ''), e.id, ev, NEW.id,
        NEW.batch_id, NEW.queue, NEW.status, NEW.finish_reason,
        CASE WHEN ev = 'session.waiting' THEN NEW.not_started::text END, at, at, at
    FROM webhook_endpoints e
    WHERE e.tenant = NEW.tenant AND e.disabled_at IS NULL
      AND position(',' || ev || ',' IN e.events) > 0
      AND (e.queue IS NULL OR e.queue = NEW.queue)
      AND (e.batch_id IS NULL OR e.batch_id = NEW.batch_id);
    IF NEW.batch_id IS NOT NULL AND ev <> 'session.waiting' AND EXISTS (
        SELECT 1 FROM webhook_endpoints e
        WHERE e.tenant = NEW.tenant AND e.disabled_at IS NULL
          AND position(',batch.completed,' IN e.events) > 0
          AND (e.queue IS NULL OR e.queue = NEW.queue)
          AND (e.batch_id IS NULL OR e.batch_id = NEW.batch_id)) THEN
        INSERT INTO webhook_batch_checks (id, batch_id, tenant, queue, created_at)
        VALUES (gen_random_uuid()::text, NEW.batch_id, NEW.tenant, NEW.queue, at);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER sessions_webhook_update AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_approval'))
    EXECUTE FUNCTION webhook_session_event();

CREATE TRIGGER sessions_webhook_insert AFTER INSERT ON sessions FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_approval'))
    EXECUTE FUNCTION webhook_session_event();
