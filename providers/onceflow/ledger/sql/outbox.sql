-- Named queries of the outbox relay.

-- name: outbox_pick_postgresql
-- Relays running side by side take disjoint rows.
SELECT id, dedup_key, work_key, step, target_type, target, payload, attempts
FROM outbox
WHERE state = 'pending' AND id > :after_id
ORDER BY id
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: outbox_pick_sqlite
SELECT id, dedup_key, work_key, step, target_type, target, payload, attempts
FROM outbox
WHERE state = 'pending' AND id > :after_id
ORDER BY id
LIMIT 1

-- name: outbox_mark_relayed
UPDATE outbox SET state = 'relayed', relayed_at = :now, attempts = attempts + 1, last_error = NULL
WHERE id = :id

-- name: outbox_mark_error
UPDATE outbox SET attempts = attempts + 1, last_error = :error
WHERE id = :id

-- name: outbox_oldest_pending
SELECT MIN(created_at) FROM outbox WHERE state = 'pending'

-- name: relay_status_update
UPDATE relay_status SET last_run_at = :now, last_relayed = :relayed WHERE relay_name = :name

