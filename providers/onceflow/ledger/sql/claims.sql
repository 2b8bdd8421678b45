-- Named queries of the ledger's lease protocol. Parameters use :name (SQLAlchemy text()).
-- Times are float seconds since the epoch. The WHERE clauses of both claims encode the
-- preconditions of "claim" and "reclaim_expired" in onceflow/ledger/states.py.

-- name: claim_postgresql
-- One statement: pick the best eligible item nobody else has locked, lease it, record the
-- transition, return it.
-- SKIP LOCKED makes concurrent claimers walk past each other's candidates instead of queueing.
WITH candidate AS (
    SELECT id, state, available_at, lease_expires_at, required_version,
           attempts, max_attempts, fencing_token
    FROM work_items
    WHERE kind = :kind
      AND lane = :lane
      AND (required_version IS NULL OR required_version = :worker_version)
      AND ((state = 'pending' AND available_at <= :now)
           OR (state = 'leased' AND lease_expires_at <= :now))
    ORDER BY priority DESC, available_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE work_items AS w
    SET state = 'leased',
        lease_owner = :owner,
        lease_expires_at = :now + :lease_seconds,
        fencing_token = w.fencing_token + 1,
        attempts = w.attempts + 1,
        updated_at = :now
    FROM candidate AS c
    WHERE w.id = c.id
    RETURNING w.work_key, w.kind, w.fencing_token, w.lease_expires_at, w.attempts, w.payload,
              w.required_version, w.lane, w.recheck_id, w.reason,
              c.state AS from_state, c.available_at AS from_available_at,
              c.lease_expires_at AS from_lease_expires_at, c.attempts AS from_attempts,
              c.max_attempts AS from_max_attempts
),
audit AS (
    INSERT INTO transitions (work_key, event, from_state, to_state, actor, owner, fencing_token, at)
    SELECT work_key,
           CASE WHEN from_state = 'pending' THEN 'claim' ELSE 'reclaim_expired' END,
           from_state, 'leased', 'worker', :owner, fencing_token, :now
    FROM claimed
)
SELECT * FROM claimed

-- name: pick_sqlite
-- SQLite has no row locks: the caller holds the database write lock (BEGIN IMMEDIATE), so the
-- pick and the update below cannot interleave with another claimer.
SELECT id, state AS from_state, available_at AS from_available_at,
       lease_expires_at AS from_lease_expires_at, attempts AS from_attempts,
       max_attempts AS from_max_attempts
FROM work_items
WHERE kind = :kind
  AND lane = :lane
  AND (required_version IS NULL OR required_version = :worker_version)
  AND ((state = 'pending' AND available_at <= :now)
       OR (state = 'leased' AND lease_expires_at <= :now))
ORDER BY priority DESC, available_at, id
LIMIT 1

-- name: lease_sqlite
UPDATE work_items
SET state = 'leased',
    lease_owner = :owner,
    lease_expires_at = :now + :lease_seconds,
    fencing_token = fencing_token + 1,
    attempts = attempts + 1,
    updated_at = :now
WHERE id = :id
RETURNING work_key, kind, fencing_token, lease_expires_at, attempts, payload,
          required_version, lane, recheck_id, reason

-- name: heartbeat
-- Compare-and-set on the fencing token: no row changes when a newer lease exists.
UPDATE work_items
SET lease_expires_at = :now + :lease_seconds,
    updated_at = :now
WHERE work_key = :work_key AND fencing_token = :token AND state = 'leased'
RETURNING lease_expires_at

-- name: lock_item_postgresql
SELECT * FROM work_items WHERE work_key = :work_key FOR UPDATE

-- name: lock_item_sqlite
SELECT * FROM work_items WHERE work_key = :work_key

-- name: insert_transition
INSERT INTO transitions (work_key, event, from_state, to_state, actor, owner, fencing_token, at, reason)
VALUES (:work_key, :event, :from_state, :to_state, :actor, :owner, :fencing_token, :at, :reason)

-- name: expired_leases
SELECT work_key FROM work_items
WHERE state = 'leased' AND lease_expires_at <= :cutoff
ORDER BY lease_expires_at
LIMIT :limit
