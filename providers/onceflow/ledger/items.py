"""Row-level primitives shared by the ledger modules: lock an item, apply a table transition.

Every state change goes through :func:`apply`, which checks the state table, updates the row and
writes the ``transitions`` row in the caller's transaction; nothing else updates ``state``
(except the claim statements, whose WHERE clauses encode the same table rows and whose
result is checked against the table afterwards).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from onceflow.ledger import schema, states
from onceflow.ledger.db import is_sqlite
from onceflow.ledger.queries import query

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sqlalchemy.engine import Connection


def lock_item(conn: Connection, work_key: str) -> dict[str, Any] | None:
    """Read one item and lock its row until the transaction ends (SQLite: already write-locked)."""
    name = "lock_item_sqlite" if is_sqlite(conn) else "lock_item_postgresql"
    row = conn.execute(query(name), {"work_key": work_key}).first()
    return None if row is None else dict(row._mapping)


def record(
    conn: Connection,
    *,
    work_key: str,
    event: str,
    from_state: str | None,
    to_state: str | None,
    actor: str,
    now: float,
    owner: str | None = None,
    token: int | None = None,
    reason: str | None = None,
) -> None:
    """Append one transition to the audit trail (``transitions``), in the caller's transaction."""
    conn.execute(
        query("insert_transition"),
        {
            "work_key": work_key,
            "event": event,
            "from_state": from_state,
            "to_state": to_state,
            "actor": actor,
            "owner": owner,
            "fencing_token": token,
            "at": now,
            "reason": reason,
        },
    )


def apply(
    conn: Connection,
    item: dict[str, Any],
    event: str,
    actor: str,
    ctx: Mapping[str, Any],
    updates: Mapping[str, Any] | None = None,
    *,
    owner: str | None = None,
) -> dict[str, Any]:
    """Check ``event`` against the state table, then update the row and record the transition.

    :param item: the locked row (from :func:`lock_item`).
    :param ctx: precondition inputs; must include ``now``.
    :param updates: extra column values to set.
    :return: the row as it is afterwards.
    """
    row = states.check(event, item, actor, ctx)
    values: dict[str, Any] = dict(updates or {})
    if row.target is not None:
        values["state"] = row.target
    values["updated_at"] = ctx["now"]
    conn.execute(
        sa.update(schema.work_items).where(schema.work_items.c.work_key == item["work_key"]).values(values)
    )
    after = {**item, **values}
    record(
        conn,
        work_key=item["work_key"],
        event=event,
        from_state=item["state"],
        to_state=after["state"],
        actor=actor,
        now=ctx["now"],
        owner=owner if owner is not None else item.get("lease_owner"),
        token=ctx.get("token", item["fencing_token"]),
        reason=ctx.get("reason"),
    )
    return after


def insert_ignore(conn: Connection, table: sa.Table, values: dict[str, Any], key: str) -> bool:
    """``INSERT ... ON CONFLICT (key) DO NOTHING``; ``True`` when the row was new."""
    ins = (sqlite.insert if is_sqlite(conn) else postgresql.insert)(table)
    result = conn.execute(ins.values(values).on_conflict_do_nothing(index_elements=[key]))
    return bool(result.rowcount)


def create_item(
    conn: Connection,
    *,
    kind: str,
    work_key: str,
    now: float,
    actor: str,
    priority: int = 0,
    payload: Any = None,
    available_at: float | None = None,
    required_version: str | None = None,
    max_attempts: int = 5,
    reason: str | None = None,
    lane: str = "new",
) -> bool:
    """Create a pending item unless the key exists (create is not repeatable: a no-op then)."""
    states.check("create", None, actor, {"now": now, "reason": reason}, work_key)
    created = insert_ignore(
        conn,
        schema.work_items,
        {
            "work_key": work_key,
            "kind": kind,
            "state": states.PENDING,
            "priority": priority,
            "available_at": now if available_at is None else available_at,
            "fencing_token": 0,
            "attempts": 0,
            "max_attempts": max_attempts,
            "reason": reason,
            "payload": None if payload is None else json.dumps(payload, sort_keys=True),
            "created_at": now,
            "updated_at": now,
            "required_version": required_version,
            "lane": lane,
        },
        "work_key",
    )
    if created:
        record(
            conn,
            work_key=work_key,
            event="create",
            from_state=None,
            to_state=states.PENDING,
            actor=actor,
            now=now,
            token=0,
            reason=reason,
        )
    return created
