"""Leases: grant (fencing token + 1), heartbeat (extend), release (give back untouched).

PostgreSQL grants with one statement (``claim_postgresql``: ``FOR UPDATE SKIP LOCKED``), one
or a batch of items per round trip; SQLite picks and updates inside one ``BEGIN IMMEDIATE``
transaction, which holds the database write lock, so two claimers are serialised. Either way
every transition written is checked against the state table, so the SQL cannot drift from the
model unnoticed. Lease times are the database's clock (``clock.py``): a worker's own clock,
however wrong, never decides whether a lease is current.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from onceflow.ledger import items, states
from onceflow.ledger.clock import db_now
from onceflow.ledger.db import is_sqlite
from onceflow.ledger.errors import StaleFenceError
from onceflow.ledger.models import Lease
from onceflow.ledger.queries import query

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy.engine import Connection, Engine

GAVE_UP = "give_up_expired"


def claim(
    engine: Engine,
    *,
    kind: str,
    owner: str,
    lease_seconds: float,
    worker_version: str,
    now: float | None,
    lane: str = "new",
    limit: int = 1,
) -> list[Lease]:
    """Lease up to ``limit`` of the best eligible items of ``kind``; ``[]`` when there is none.

    Eligible: pending and available, or leased with an expired lease; and either no required
    processing version or exactly ``worker_version`` (other code leaves the item alone).
    Best: highest priority, then oldest available-at time. Each item gets its own fencing token
    and ``claim`` / ``reclaim_expired`` transition; a batch costs one statement on PostgreSQL.

    An expired lease on the item's last attempt is not taken over: the item is given up
    (``give_up_expired``, failed with the reason) and the claim looks further.

    :param now: ``None`` to use the database's clock (the default); a test's injected time.
    """
    if limit < 1:
        raise ValueError(f"claim limit must be at least 1, got {limit}")
    check_lease_seconds(lease_seconds)
    granted: list[Lease] = []
    while len(granted) < limit:
        params = {
            "kind": kind,
            "lane": lane,
            "owner": owner,
            "lease_seconds": float(lease_seconds),
            "worker_version": worker_version,
            "now": now,
            "limit": limit - len(granted),
        }
        with engine.begin() as conn:
            if is_sqlite(conn):
                rows = _claim_sqlite(conn, params)
            else:
                rows = [dict(r._mapping) for r in conn.execute(query("claim_postgresql"), params)]
            for row in rows:
                # Raises (and so rolls the statement back) if the SQL did what the table forbids.
                _check(row, worker_version)
        granted += [
            _lease(row, owner, worker_version, lease_seconds) for row in rows if row["event"] != GAVE_UP
        ]
        if not any(row["event"] == GAVE_UP for row in rows):
            break  # no poison item used up a slot: there is nothing more to lease
    return granted


def check_lease_seconds(lease_seconds: float) -> None:
    """Refuse a lease length that is not positive: such a lease is expired at once, so the next
    claimer (or keyed lease) would take the item over while its holder is still working."""
    if not lease_seconds > 0:
        raise ValueError(
            f"lease_seconds must be positive, got {lease_seconds}: the lease would be expired at once"
        )


def _claim_sqlite(conn: Connection, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Pick and lease under the write lock taken by ``BEGIN IMMEDIATE`` (one claimer at a time)."""
    now = float(conn.execute(query("db_now_sqlite"), {"now": params["now"]}).scalar_one())
    params = {**params, "now": now}
    rows = []
    for picked in conn.execute(query("pick_sqlite"), params).mappings().all():
        row = {**picked, "db_now": now}
        if picked["from_state"] == states.LEASED and picked["from_attempts"] >= picked["from_max_attempts"]:
            reason = poison_reason(row)
            conn.execute(query("give_up_expired_sqlite"), {"id": picked["id"], "now": now, "reason": reason})
            row.update(event=GAVE_UP, to_state=states.FAILED, event_reason=reason,
                       fencing_token=picked["from_fencing_token"])  # fmt: skip
        else:
            leased = conn.execute(query("lease_sqlite"), {**params, "id": picked["id"]}).one()
            row.update(leased._mapping)
            row.update(event="claim" if picked["from_state"] == states.PENDING else "reclaim_expired",
                       to_state=states.LEASED, event_reason=None)  # fmt: skip
        items.record(
            conn,
            work_key=row["work_key"],
            event=row["event"],
            from_state=row["from_state"],
            to_state=row["to_state"],
            actor=states.WORKER,
            now=now,
            owner=params["owner"],
            token=row["fencing_token"],
            reason=row["event_reason"],
        )
        rows.append(row)
    return rows


def poison_reason(item: Mapping[str, Any]) -> str:
    """Why an item whose last attempt's lease expired was given up (the same text as the SQL)."""
    return (
        f"lease of {item['from_lease_owner'] or '?'} (token {item['from_fencing_token']}) expired on attempt "
        f"{item['from_attempts']} of {item['from_max_attempts']}: given up, not retried (poison item)"
    )


def _check(row: Mapping[str, Any], worker_version: str) -> None:
    before = {
        "work_key": row["work_key"],
        "state": row["from_state"],
        "available_at": row["from_available_at"],
        "lease_expires_at": row["from_lease_expires_at"],
        "required_version": row["required_version"],
        "attempts": row["from_attempts"],
        "max_attempts": row["from_max_attempts"],
        "fencing_token": row["from_fencing_token"],
    }
    ctx = {"now": row["db_now"], "worker_version": worker_version, "reason": row["event_reason"]}
    target = states.check(row["event"], before, states.WORKER, ctx).target
    if row["event"] != GAVE_UP and row["fencing_token"] != row["from_fencing_token"] + 1:
        raise AssertionError(f"claim of {row['work_key']} did not advance the fencing token by one")
    assert target == row["to_state"], (row["event"], target, row["to_state"])


def _lease(row: Mapping[str, Any], owner: str, worker_version: str, lease_seconds: float) -> Lease:
    return Lease(
        work_key=row["work_key"],
        kind=row["kind"],
        owner=owner,
        token=row["fencing_token"],
        expires_at=row["lease_expires_at"],
        worker_version=worker_version,
        lease_seconds=float(lease_seconds),
        attempts=row["attempts"],
        payload=json.loads(row["payload"]) if row["payload"] else None,
        lane=row["lane"],
        recheck_id=row["recheck_id"],
        reason=row["reason"],
    )


def heartbeat(
    engine: Engine, lease: Lease, *, now: float | None, lease_seconds: float | None = None
) -> Lease:
    """Extend ``lease`` from the database's clock (or ``now``); ``StaleFenceError`` if a newer lease exists."""
    seconds = lease.lease_seconds if lease_seconds is None else float(lease_seconds)
    check_lease_seconds(seconds)
    with engine.begin() as conn:
        name = "heartbeat_sqlite" if is_sqlite(conn) else "heartbeat_postgresql"
        row = conn.execute(
            query(name),
            {"work_key": lease.work_key, "token": lease.token, "now": now, "lease_seconds": seconds},
        ).first()
        if row is None:
            current = items.lock_item(conn, lease.work_key)
            assert current is not None
            raise StaleFenceError(lease.work_key, lease.token, current["fencing_token"], current["state"])
    lease.expires_at = row[0]
    return lease


def release(engine: Engine, lease: Lease, *, now: float | None, reason: str) -> bool:
    """Give the item back (pending, available now). ``False`` when the lease was already lost."""
    with engine.begin() as conn:
        item = items.lock_item(conn, lease.work_key)
        if item is None or item["state"] != states.LEASED or item["fencing_token"] != lease.token:
            return False
        at = db_now(conn, now)
        items.apply(
            conn,
            item,
            "release",
            states.WORKER,
            {"now": at, "token": lease.token, "reason": reason},
            {"lease_expires_at": None, "available_at": at, "attempts": max(item["attempts"] - 1, 0)},
            owner=lease.owner,
        )
    return True
