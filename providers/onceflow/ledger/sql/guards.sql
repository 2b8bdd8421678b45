-- Triggers that keep the database true to the state model (onceflow/ledger/schema.py runs them
-- after creating work_items; an Alembic revision adds them to existing ledgers). A released
-- guard is changed by a new named statement and a new revision, never by editing this text.

-- name: guard_fencing_token_function_postgresql
-- A fencing token only ever goes up: a lower one would let a fenced-out holder commit again.
CREATE OR REPLACE FUNCTION onceflow_fencing_token_never_decreases() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'work item %: fencing token may not go down (% to %)',
        OLD.work_key, OLD.fencing_token, NEW.fencing_token
        USING ERRCODE = 'check_violation';
END
$$

-- name: guard_fencing_token_trigger_postgresql
-- The WHEN clause keeps every normal update (token unchanged or + 1) free of the function call.
CREATE TRIGGER work_items_fencing_token_never_decreases
BEFORE UPDATE OF fencing_token ON work_items
FOR EACH ROW WHEN (NEW.fencing_token < OLD.fencing_token)
EXECUTE FUNCTION onceflow_fencing_token_never_decreases()

-- name: guard_fencing_token_trigger_sqlite
CREATE TRIGGER work_items_fencing_token_never_decreases
BEFORE UPDATE OF fencing_token ON work_items
FOR EACH ROW WHEN NEW.fencing_token < OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'work item: fencing token may not go down');
END

-- name: drop_guard_fencing_token_function_postgresql
DROP FUNCTION IF EXISTS onceflow_fencing_token_never_decreases()

-- name: drop_guard_fencing_token_trigger_postgresql
DROP TRIGGER IF EXISTS work_items_fencing_token_never_decreases ON work_items

-- name: drop_guard_fencing_token_trigger_sqlite
DROP TRIGGER IF EXISTS work_items_fencing_token_never_decreases

-- The state machine itself (issue 22; revision ledger_v6). The (from, to) pairs are those of
-- onceflow/ledger/states.py STATE_TABLE (tests/unit/test_ledger_guard_pairs.py checks they agree):
-- an item is created pending with token 0; it moves only along an allowed pair; it becomes done
-- only with a result; its fencing token rises only by + 1 into a new lease (from pending, or
-- over an expired lease; going down is refused by the fencing-token guard above), and a new lease
-- (another owner, or leased from another state) always takes a new token. The transitions table
-- is append-only.

-- name: guard_state_machine_function_postgresql
CREATE OR REPLACE FUNCTION onceflow_work_item_state_machine() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- (a state outside the model, a negative token: left to the CHECKs, which name themselves)
        IF (NEW.state <> 'pending' AND NEW.state IN ('leased', 'done', 'failed', 'needs_correction',
            'cancelled')) OR NEW.fencing_token > 0 THEN
            RAISE EXCEPTION 'work item %: created as % with token %, not pending with token 0',
                NEW.work_key, NEW.state, NEW.fencing_token USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    -- a state outside the model is left to ck_work_items_state, which names itself
    IF NEW.state <> OLD.state AND NEW.state IN ('pending', 'leased', 'done', 'failed',
        'needs_correction', 'cancelled') AND (OLD.state || '>' || NEW.state) NOT IN (
        'pending>leased', 'pending>done', 'pending>failed', 'pending>cancelled',
        'leased>pending', 'leased>done', 'leased>failed', 'leased>needs_correction',
        'done>pending', 'failed>pending', 'failed>done', 'failed>cancelled',
        'needs_correction>pending', 'needs_correction>cancelled') THEN
        RAISE EXCEPTION 'work item %: % to % is not a transition of the state model',
            NEW.work_key, OLD.state, NEW.state USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state = 'done' AND OLD.state <> 'done'
       AND NOT EXISTS (SELECT 1 FROM results WHERE results.work_key = NEW.work_key) THEN
        RAISE EXCEPTION 'work item %: done without a result', NEW.work_key
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.fencing_token > OLD.fencing_token AND NOT (
        NEW.fencing_token = OLD.fencing_token + 1 AND NEW.state = 'leased'
        AND (OLD.state = 'pending' OR (OLD.state = 'leased' AND OLD.lease_expires_at <= NEW.updated_at))) THEN
        RAISE EXCEPTION 'work item %: fencing token % to % (% to %): it rises by one, into a new lease only',
            NEW.work_key, OLD.fencing_token, NEW.fencing_token, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state = 'leased' AND NEW.fencing_token = OLD.fencing_token
       AND (OLD.state <> 'leased' OR NEW.lease_owner IS DISTINCT FROM OLD.lease_owner) THEN
        RAISE EXCEPTION 'work item %: a new lease (% to leased, owner %) without a new fencing token',
            NEW.work_key, OLD.state, NEW.lease_owner USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$

-- name: guard_state_machine_trigger_postgresql
CREATE TRIGGER work_items_state_machine
BEFORE INSERT OR UPDATE ON work_items
FOR EACH ROW EXECUTE FUNCTION onceflow_work_item_state_machine()

-- name: guard_transitions_append_only_function_postgresql
CREATE OR REPLACE FUNCTION onceflow_transitions_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'transitions are append-only: % refused', TG_OP USING ERRCODE = 'check_violation';
END
$$

-- name: guard_transitions_append_only_trigger_postgresql
CREATE TRIGGER transitions_append_only
BEFORE UPDATE OR DELETE ON transitions
FOR EACH ROW EXECUTE FUNCTION onceflow_transitions_append_only()

-- name: guard_transitions_no_truncate_trigger_postgresql
CREATE TRIGGER transitions_no_truncate
BEFORE TRUNCATE ON transitions
FOR EACH STATEMENT EXECUTE FUNCTION onceflow_transitions_append_only()

-- name: guard_state_machine_insert_trigger_sqlite
CREATE TRIGGER work_items_created_pending
BEFORE INSERT ON work_items
FOR EACH ROW WHEN NEW.state IN ('leased', 'done', 'failed', 'needs_correction', 'cancelled')
    OR NEW.fencing_token > 0
BEGIN
    SELECT RAISE(ABORT, 'work item: created other than pending with token 0');
END

-- name: guard_state_machine_pairs_trigger_sqlite
CREATE TRIGGER work_items_state_pairs
BEFORE UPDATE OF state ON work_items
FOR EACH ROW WHEN NEW.state <> OLD.state
    AND NEW.state IN ('pending', 'leased', 'done', 'failed', 'needs_correction', 'cancelled')
    AND (OLD.state || '>' || NEW.state) NOT IN (
    'pending>leased', 'pending>done', 'pending>failed', 'pending>cancelled',
    'leased>pending', 'leased>done', 'leased>failed', 'leased>needs_correction',
    'done>pending', 'failed>pending', 'failed>done', 'failed>cancelled',
    'needs_correction>pending', 'needs_correction>cancelled')
BEGIN
    SELECT RAISE(ABORT, 'work item: not a transition of the state model');
END

-- name: guard_state_machine_done_trigger_sqlite
CREATE TRIGGER work_items_done_has_result
BEFORE UPDATE OF state ON work_items
FOR EACH ROW WHEN NEW.state = 'done' AND OLD.state <> 'done'
    AND NOT EXISTS (SELECT 1 FROM results WHERE results.work_key = NEW.work_key)
BEGIN
    SELECT RAISE(ABORT, 'work item: done without a result');
END

-- name: guard_state_machine_token_trigger_sqlite
CREATE TRIGGER work_items_token_per_lease
BEFORE UPDATE ON work_items
FOR EACH ROW WHEN (NEW.fencing_token > OLD.fencing_token AND NOT (
        NEW.fencing_token = OLD.fencing_token + 1 AND NEW.state = 'leased'
        AND (OLD.state = 'pending' OR (OLD.state = 'leased' AND OLD.lease_expires_at <= NEW.updated_at))))
    OR (NEW.state = 'leased' AND NEW.fencing_token = OLD.fencing_token
        AND (OLD.state <> 'leased' OR NEW.lease_owner IS NOT OLD.lease_owner))
BEGIN
    SELECT RAISE(ABORT, 'work item: the fencing token rises by one, into a new lease only');
END

-- name: guard_transitions_no_update_trigger_sqlite
CREATE TRIGGER transitions_no_update
BEFORE UPDATE ON transitions
BEGIN
    SELECT RAISE(ABORT, 'transitions are append-only: UPDATE refused');
END

-- name: guard_transitions_no_delete_trigger_sqlite
CREATE TRIGGER transitions_no_delete
BEFORE DELETE ON transitions
BEGIN
    SELECT RAISE(ABORT, 'transitions are append-only: DELETE refused');
END

-- name: drop_guard_state_machine_function_postgresql
DROP FUNCTION IF EXISTS onceflow_work_item_state_machine()

-- name: drop_guard_state_machine_trigger_postgresql
DROP TRIGGER IF EXISTS work_items_state_machine ON work_items

-- name: drop_guard_transitions_append_only_function_postgresql
DROP FUNCTION IF EXISTS onceflow_transitions_append_only()

-- name: drop_guard_transitions_append_only_trigger_postgresql
DROP TRIGGER IF EXISTS transitions_append_only ON transitions

-- name: drop_guard_transitions_no_truncate_trigger_postgresql
DROP TRIGGER IF EXISTS transitions_no_truncate ON transitions

-- name: drop_guard_state_machine_insert_trigger_sqlite
DROP TRIGGER IF EXISTS work_items_created_pending

-- name: drop_guard_state_machine_pairs_trigger_sqlite
DROP TRIGGER IF EXISTS work_items_state_pairs

-- name: drop_guard_state_machine_done_trigger_sqlite
DROP TRIGGER IF EXISTS work_items_done_has_result

-- name: drop_guard_state_machine_token_trigger_sqlite
DROP TRIGGER IF EXISTS work_items_token_per_lease

-- name: drop_guard_transitions_no_update_trigger_sqlite
DROP TRIGGER IF EXISTS transitions_no_update

-- name: drop_guard_transitions_no_delete_trigger_sqlite
DROP TRIGGER IF EXISTS transitions_no_delete
