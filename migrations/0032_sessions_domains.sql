-- agentq: the value rules of `sessions` (and of `messages`) as domains instead of table CHECK
-- constraints.
--
-- Postgres evaluates every CHECK constraint of a table on every insert and update of a
-- row, whichever columns the statement writes, and rebuilds each one for every statement
-- from its stored text (parse, plan, compile). `sessions` had 28 of them, which cost a
-- statement that updates one row (a lone checkpoint, a claim) about as much again as the
-- update itself. A domain's rule is kept compiled per connection and applies only where
-- a statement writes a value of the column: the same rules, checked on every value
-- written, at a fraction of the cost (docs/benchmarks.md, "The value rules of sessions").
--
-- Without a rule a domain changes nothing stored, so the columns change type without a
-- rewrite of the table; the rules are then added back on the domains. They are added NOT
-- VALID, since the constraints dropped in this same transaction held for every stored
-- row: validating them again would scan the table once per domain for nothing. Postgres
-- builds again the nine partial indexes of `sessions` whose condition names a changed
-- column (one scan of the table each, under its lock; they hold only live or waiting
-- sessions, so what they write is small) and keeps the others as they are.
CREATE DOMAIN count_bigint AS bigint;
CREATE DOMAIN count_int AS integer;
CREATE DOMAIN positive_int AS integer;
CREATE DOMAIN session_priority AS integer;
CREATE DOMAIN session_status AS text;
CREATE DOMAIN session_phase AS text;

-- A trigger's condition names `status`, so the triggers go while its type changes.
DROP TRIGGER sessions_webhook_update ON sessions;
DROP TRIGGER sessions_webhook_insert ON sessions;
DROP TRIGGER sessions_unannounced_update ON sessions;
DROP TRIGGER sessions_unannounced_insert ON sessions;

ALTER TABLE sessions
    DROP CONSTRAINT sessions_bg_cursor_check,
    DROP CONSTRAINT sessions_budget_allowance_check,
    DROP CONSTRAINT sessions_budget_children_spent_check,
    DROP CONSTRAINT sessions_budget_consumed_check,
    DROP CONSTRAINT sessions_budget_held_check,
    DROP CONSTRAINT sessions_cache_read_tokens_check,
    DROP CONSTRAINT sessions_cache_write_tokens_check,
    DROP CONSTRAINT sessions_followup_cursor_check,
    DROP CONSTRAINT sessions_input_tokens_check,
    DROP CONSTRAINT sessions_msg_cursor_check,
    DROP CONSTRAINT sessions_output_tokens_check,
    DROP CONSTRAINT sessions_reasoning_tokens_check,
    DROP CONSTRAINT sessions_tree_sessions_check,
    DROP CONSTRAINT sessions_wake_seq_check,
    DROP CONSTRAINT sessions_web_search_requests_check,
    DROP CONSTRAINT sessions_attempts_check,
    DROP CONSTRAINT sessions_batch_max_running_check,
    DROP CONSTRAINT sessions_depth_check,
    DROP CONSTRAINT sessions_drain_rounds_check,
    DROP CONSTRAINT sessions_fork_at_check,
    DROP CONSTRAINT sessions_history_len_check,
    DROP CONSTRAINT sessions_iteration_check,
    DROP CONSTRAINT sessions_priority_check,
    DROP CONSTRAINT sessions_retries_check,
    DROP CONSTRAINT sessions_takeovers_check,
    DROP CONSTRAINT sessions_turn_base_check,
    DROP CONSTRAINT sessions_phase_check,
    DROP CONSTRAINT sessions_status_check,
    ALTER COLUMN bg_cursor TYPE count_bigint,
    ALTER COLUMN budget_allowance TYPE count_bigint,
    ALTER COLUMN budget_children_spent TYPE count_bigint,
    ALTER COLUMN budget_consumed TYPE count_bigint,
    ALTER COLUMN budget_held TYPE count_bigint,
    ALTER COLUMN cache_read_tokens TYPE count_bigint,
    ALTER COLUMN cache_write_tokens TYPE count_bigint,
    ALTER COLUMN followup_cursor TYPE count_bigint,
    ALTER COLUMN input_tokens TYPE count_bigint,
    ALTER COLUMN msg_cursor TYPE count_bigint,
    ALTER COLUMN output_tokens TYPE count_bigint,
    ALTER COLUMN reasoning_tokens TYPE count_bigint,
    ALTER COLUMN tree_sessions TYPE count_bigint,
    ALTER COLUMN wake_seq TYPE count_bigint,
    ALTER COLUMN web_search_requests TYPE count_bigint,
    ALTER COLUMN attempts TYPE count_int,
    ALTER COLUMN depth TYPE count_int,
    ALTER COLUMN drain_rounds TYPE count_int,
    ALTER COLUMN iteration TYPE count_int,
    ALTER COLUMN retries TYPE count_int,
    ALTER COLUMN takeovers TYPE count_int,
    ALTER COLUMN turn_base TYPE count_int,
    ALTER COLUMN batch_max_running TYPE positive_int,
    ALTER COLUMN fork_at TYPE positive_int,
    ALTER COLUMN history_len TYPE positive_int,
    ALTER COLUMN priority TYPE session_priority,
    ALTER COLUMN status TYPE session_status,
    ALTER COLUMN phase TYPE session_phase;

-- A checkpoint also inserts its messages: their one rule, on the same terms.
ALTER TABLE messages
    DROP CONSTRAINT messages_seq_check,
    ALTER COLUMN seq TYPE count_int;

ALTER DOMAIN count_bigint ADD CONSTRAINT count_bigint_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN count_int ADD CONSTRAINT count_int_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN positive_int ADD CONSTRAINT positive_int_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN session_priority ADD CONSTRAINT session_priority_check
    CHECK (VALUE BETWEEN 0 AND 9) NOT VALID;
ALTER DOMAIN session_status ADD CONSTRAINT session_status_check
    CHECK (VALUE IN ('queued', 'running', 'waiting', 'awaiting_approval', 'completed',
                     'failed', 'cancelled')) NOT VALID;
ALTER DOMAIN session_phase ADD CONSTRAINT session_phase_check
    CHECK (VALUE IN ('plan', 'act')) NOT VALID;

-- The triggers again, as migrations 0020 and 0030 made them.
CREATE TRIGGER sessions_webhook_update AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_approval'))
    EXECUTE FUNCTION webhook_session_event();

CREATE TRIGGER sessions_webhook_insert AFTER INSERT ON sessions FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_approval'))
    EXECUTE FUNCTION webhook_session_event();

CREATE TRIGGER sessions_unannounced_update AFTER UPDATE OF status ON sessions FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (NEW.status IN ('completed', 'failed', 'cancelled')
               OR OLD.status IN ('completed', 'failed', 'cancelled')))
    EXECUTE FUNCTION session_unannounced();

CREATE TRIGGER sessions_unannounced_insert AFTER INSERT ON sessions FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION session_unannounced();
