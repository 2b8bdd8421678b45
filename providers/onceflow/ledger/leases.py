"""Leases: grant (fencing token + 1), heartbeat (extend), release (give back untouched).

PostgreSQL grants with one statement (``claim_postgresql``: ``FOR UPDATE SKIP LOCKED``);
SQLite picks and updates inside one ``BEGIN IMMEDIATE`` transaction, which holds the database
write lock, so two claimers are serialised. Either way the transition written is checked
against the state table, so the SQL cannot drift from the model unnoticed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from onceflow.ledger import items, states
from onceflow.ledger.db import is_sqlite
from onceflow.ledger.errors import StaleFenceError
from onceflow.ledger.models import Lease
from onceflow.ledger.queries import query

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine


def claim(
    engine: Engine,
    *,
    kind: str,
    owner: str,
    lease_seconds: float,
    worker_version: str,
    now: float,
    lane: str = "new",
) -> Lease | None:
    """Lease the best eligible item of ``kind``, or return ``None`` when there is none.

    Eligible: pending and available, or leased with an expired lease; and either no required
    processing version or exactly ``worker_version`` (other code leaves the item alone).
    Best: highest priority, then oldest available-at time.
    """
    params = {
        "kind": kind,
        "lane": lane,
        "owner": owner,
        "lease_seconds": float(lease_seconds),
        "worker_version": worker_version,
        "now": now,
    }
    with engine.begin() as conn:
        if is_sqlite(conn):
            picked = conn.execute(query("pick_sqlite"), params).first()
            if picked is None:
                return None
            before = dict(picked._mapping)
            row = conn.execute(query("lease_sqlite"), {**params, "id": before["id"]}).one()
            granted = {**before, **row._mapping}
        else:
            found = conn.execute(query("claim_postgresql"), params).first()
            if found is None:
                return None
            granted = dict(found._mapping)
        # PostgreSQL's statement wrote the transition row itself; SQLite's is written here.
        _check_and_record(conn, granted, owner, worker_version, now, write=is_sqlite(conn))
    return Lease(
        work_key=granted["work_key"],
        kind=granted["kind"],
        owner=owner,
        token=granted["fencing_token"],
        expires_at=granted["lease_expires_at"],
        worker_version=worker_version,
        lease_seconds=float(lease_seconds),
        attempts=granted["attempts"],
        payload=json.loads(granted["payload"]) if granted["payload"] else None,
        lane=granted["lane"],
        recheck_id=granted["recheck_id"],
        reason=granted["reason"],
    )


def _check_and_record(
    conn: Connection, granted: dict, owner: str, worker_version: str, now: float, *, write: bool
) -> None:
    event = "claim" if granted["from_state"] == states.PENDING else "reclaim_expired"
    before = {
        "work_key": granted["work_key"],
        "state": granted["from_state"],
        "available_at": granted["from_available_at"],
        "lease_expires_at": granted["from_lease_expires_at"],
        "required_version": granted["required_version"],
        "attempts": granted["from_attempts"],
        "max_attempts": granted["from_max_attempts"],
        "fencing_token": granted["fencing_token"] - 1,
    }
    # Raises (and so rolls the grant back) if the SQL ever granted what the table forbids.
    states.check(event, before, states.WORKER, {"now": now, "worker_version": worker_version})
    if not write:
        return
    items.record(
        conn,
        work_key=granted["work_key"],
        event=event,
        from_state=granted["from_state"],
        to_state=states.LEASED,
        actor=states.WORKER,
        now=now,
        owner=owner,
        token=granted["fencing_token"],
    )


def heartbeat(engine: Engine, lease: Lease, *, now: float, lease_seconds: float | None = None) -> Lease:
    """Extend ``lease`` from ``now``; raise ``StaleFenceError`` when a newer lease exists."""
    seconds = lease.lease_seconds if lease_seconds is None else float(lease_seconds)
    with engine.begin() as conn:
        row = conn.execute(
            query("heartbeat"),
            {"work_key": lease.work_key, "token": lease.token, "now": now, "lease_seconds": seconds},
        ).first()
        if row is None:
            current = items.lock_item(conn, lease.work_key)
            assert current is not None
            raise StaleFenceError(lease.work_key, lease.token, current["fencing_token"], current["state"])
    lease.expires_at = row[0]
    return lease


def release(engine: Engine, lease: Lease, *, now: float, reason: str) -> bool:
    """Give the item back (pending, available now). ``False`` when the lease was already lost."""
    with engine.begin() as conn:
        item = items.lock_item(conn, lease.work_key)
        if item is None or item["state"] != states.LEASED or item["fencing_token"] != lease.token:
            return False
        items.apply(
            conn,
            item,
            "release",
            states.WORKER,
            {"now": now, "token": lease.token, "reason": reason},
            {"lease_expires_at": None, "available_at": now, "attempts": max(item["attempts"] - 1, 0)},
            owner=lease.owner,
        )
    return True
