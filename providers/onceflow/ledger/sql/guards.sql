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
