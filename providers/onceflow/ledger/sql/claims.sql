-- Named queries of the ledger's lease protocol. Parameters use :name (SQLAlchemy text()).
-- Times are float seconds since the epoch, from the database's clock unless a test passes :now
-- (see onceflow/ledger/clock.py). The WHERE clauses of both claims encode the preconditions of
-- "claim", "reclaim_expired" and "give_up_expired" in onceflow/ledger/states.py.

-- name: claim_postgresql
-- One statement leases up to :limit items (a batch claim: one round trip, one audit row each):
-- pick the best eligible items nobody else has locked, lease them, record the transitions,
-- return them. SKIP LOCKED makes concurrent claimers walk past each other's candidates.
-- Time is the database's (clock_timestamp(), once per statement) unless a test passes :now.
-- A picked item whose expired lease was its last attempt (a worker crashed on it every time:
-- a poison item) is not leased again but given up (failed, "give_up_expired") in the same
-- statement; the caller asks again if that left it short.
WITH t AS MATERIALIZED (
    SELECT COALESCE(CAST(:now AS double precision),
                    extract(epoch FROM clock_timestamp())::double precision) AS now
),
candidate AS (
    SELECT id, state, available_at, lease_expires_at, lease_owner, required_version,
           attempts, max_attempts, fencing_token,
           (state = 'leased' AND attempts >= max_attempts) AS poison
    FROM work_items
    WHERE kind = :kind
      AND lane = :lane
      AND (required_version IS NULL OR required_version = :worker_version)
      AND ((state = 'pending' AND available_at <= (SELECT now FROM t))
           OR (state = 'leased' AND lease_expires_at <= (SELECT now FROM t)))
    ORDER BY priority DESC, available_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
),
leased AS (
    UPDATE work_items AS w
    SET state = 'leased',
        lease_owner = :owner,
        lease_expires_at = (SELECT now FROM t) + :lease_seconds,
        fencing_token = w.fencing_token + 1,
        attempts = w.attempts + 1,
        updated_at = (SELECT now FROM t)
    FROM candidate AS c
    WHERE w.id = c.id AND NOT c.poison
    RETURNING w.id, w.work_key, w.kind, w.fencing_token, w.lease_expires_at, w.attempts, w.payload,
              w.required_version, w.lane, w.recheck_id, w.reason, w.priority, w.available_at,
              c.state AS from_state, c.available_at AS from_available_at,
              c.lease_expires_at AS from_lease_expires_at, c.attempts AS from_attempts,
              c.max_attempts AS from_max_attempts, c.fencing_token AS from_fencing_token,
              CASE WHEN c.state = 'pending' THEN 'claim' ELSE 'reclaim_expired' END AS event,
              'leased' AS to_state, CAST(NULL AS text) AS event_reason
),
gave_up AS (
    UPDATE work_items AS w
    SET state = 'failed',
        lease_expires_at = NULL,
        last_error_class = 'LeaseExpired',
        last_error = 'lease of ' || COALESCE(c.lease_owner, '?') || ' (token ' || c.fencing_token
                     || ') expired on attempt ' || c.attempts || ' of ' || c.max_attempts
                     || ': given up, not retried (poison item)',
        updated_at = (SELECT now FROM t)
    FROM candidate AS c
    WHERE w.id = c.id AND c.poison
    RETURNING w.id, w.work_key, w.kind, w.fencing_token, w.lease_expires_at, w.attempts, w.payload,
              w.required_version, w.lane, w.recheck_id, w.reason, w.priority, w.available_at,
              c.state AS from_state, c.available_at AS from_available_at,
              c.lease_expires_at AS from_lease_expires_at, c.attempts AS from_attempts,
              c.max_attempts AS from_max_attempts, c.fencing_token AS from_fencing_token,
              'give_up_expired' AS event, 'failed' AS to_state, w.last_error AS event_reason
),
changed AS (
    SELECT * FROM leased UNION ALL SELECT * FROM gave_up
),
audit AS (
    INSERT INTO transitions (work_key, event, from_state, to_state, actor, owner, fencing_token, at, reason)
    SELECT work_key, event, from_state, to_state, 'worker', :owner, fencing_token, (SELECT now FROM t),
           event_reason
    FROM changed
    ORDER BY priority DESC, available_at, id
)
SELECT changed.*, (SELECT now FROM t) AS db_now FROM changed
ORDER BY priority DESC, from_available_at, id

-- name: db_now_sqlite
-- SQLite's clock, read first inside the claim's BEGIN IMMEDIATE transaction: the write lock is
-- held, so the pick and the update below see the same instant nobody else can write between.
SELECT COALESCE(:now, (julianday('now') - 2440587.5) * 86400.0)

-- name: pick_sqlite
-- SQLite has no row locks: the caller holds the database write lock (BEGIN IMMEDIATE), so the
-- pick and the updates below cannot interleave with another claimer.
SELECT id, work_key, state AS from_state, available_at AS from_available_at,
       lease_expires_at AS from_lease_expires_at, lease_owner AS from_lease_owner,
       attempts AS from_attempts, max_attempts AS from_max_attempts,
       fencing_token AS from_fencing_token, required_version
FROM work_items
WHERE kind = :kind
  AND lane = :lane
  AND (required_version IS NULL OR required_version = :worker_version)
  AND ((state = 'pending' AND available_at <= :now)
       OR (state = 'leased' AND lease_expires_at <= :now))
ORDER BY priority DESC, available_at, id
LIMIT :limit

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

-- name: give_up_expired_sqlite
UPDATE work_items
SET state = 'failed',
    lease_expires_at = NULL,
    last_error_class = 'LeaseExpired',
    last_error = :reason,
    updated_at = :now
WHERE id = :id

-- name: heartbeat_postgresql
-- Compare-and-set on the fencing token: no row changes when a newer lease exists. The new expiry
-- is counted from the database's clock, whatever the worker's clock says.
UPDATE work_items
SET lease_expires_at = t.now + :lease_seconds,
    updated_at = t.now
FROM (SELECT COALESCE(CAST(:now AS double precision),
                      extract(epoch FROM clock_timestamp())::double precision) AS now) AS t
WHERE work_key = :work_key AND fencing_token = :token AND state = 'leased'
RETURNING lease_expires_at

-- name: heartbeat_sqlite
UPDATE work_items
SET lease_expires_at = t.now + :lease_seconds,
    updated_at = t.now
FROM (SELECT COALESCE(:now, (julianday('now') - 2440587.5) * 86400.0) AS now) AS t
WHERE work_key = :work_key AND fencing_token = :token AND state = 'leased'
RETURNING lease_expires_at

-- name: lock_item_postgresql
SELECT * FROM work_items WHERE work_key = :work_key FOR UPDATE

-- name: lock_item_sqlite
SELECT * FROM work_items WHERE work_key = :work_key

-- name: insert_transition
INSERT INTO transitions (work_key, event, from_state, to_state, actor, owner, fencing_token, at, reason)
VALUES (:work_key, :event, :from_state, :to_state, :actor, :owner, :fencing_token, :at, :reason)

-- name: expired_leases_postgresql
-- Expiry is judged by the database's clock (or an injected :now).
SELECT work_key FROM work_items
WHERE state = 'leased'
  AND lease_expires_at <= COALESCE(CAST(:now AS double precision),
                                   extract(epoch FROM clock_timestamp())::double precision) - :grace
ORDER BY lease_expires_at
LIMIT :limit

-- name: expired_leases_sqlite
SELECT work_key FROM work_items
WHERE state = 'leased'
  AND lease_expires_at <= COALESCE(:now, (julianday('now') - 2440587.5) * 86400.0) - :grace
ORDER BY lease_expires_at
LIMIT :limit
