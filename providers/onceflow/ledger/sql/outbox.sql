-- Named queries of the outbox relay.

-- name: outbox_pick_postgresql
-- Relays running side by side take disjoint rows. Sheet rows are the sheet relay's.
SELECT id, dedup_key, work_key, step, target_type, target, payload, attempts
FROM outbox
WHERE state = 'pending' AND id > :after_id AND target_type IN ('dag_run', 'asset_event')
ORDER BY id
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: outbox_pick_sqlite
SELECT id, dedup_key, work_key, step, target_type, target, payload, attempts
FROM outbox
WHERE state = 'pending' AND id > :after_id AND target_type IN ('dag_run', 'asset_event')
ORDER BY id
LIMIT 1

-- name: outbox_mark_relayed
-- Only a pending row: one another relay (or the reconciler) marked meanwhile keeps its mark.
UPDATE outbox SET state = 'relayed', relayed_at = :now, attempts = attempts + 1, last_error = NULL
WHERE id = :id AND state = 'pending'

-- name: outbox_mark_handed
-- Handed to a running task's outlet: durable only when the task succeeds, so it stays pending.
UPDATE outbox SET attempts = attempts + 1, last_error = NULL
WHERE id = :id AND state = 'pending'

-- name: outbox_confirm
-- The relaying task succeeded: Airflow has recorded these rows' events.
UPDATE outbox SET state = 'relayed', relayed_at = :now
WHERE id IN :ids AND state = 'pending'

-- name: outbox_mark_error
UPDATE outbox SET attempts = attempts + 1, last_error = :error
WHERE id = :id

-- name: outbox_oldest_pending
SELECT MIN(created_at) FROM outbox WHERE state = 'pending'

-- name: relay_status_update
UPDATE relay_status SET last_run_at = :now, last_relayed = :relayed WHERE relay_name = :name


-- name: outbox_sheet_rows_pending
-- The sheet relay's pending rows, oldest first, of one sheet or (target NULL) of all.
SELECT id, dedup_key, work_key, step, target_type, target, payload, attempts
FROM outbox
WHERE state = 'pending' AND target_type = 'sheet_row' AND (:target IS NULL OR target = :target)
ORDER BY id
LIMIT :limit

-- name: outbox_sheet_rows_waiting
-- Whether a sheet has write-backs waiting (what sheet_claim's sensor asks before reading the sheet).
SELECT COUNT(*) FROM outbox
WHERE state = 'pending' AND target_type = 'sheet_row' AND target = :target
