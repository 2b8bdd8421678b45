"""Fenced writes: the result commit (with its follow-ups) and the failure outcomes.

The fence is checked at the sink, in the same transaction as the write, with the item row
locked: a write whose token is not the item's current lease token is refused with
:class:`StaleFenceError`, and the refusal is committed as a ``commit_refused`` transition so
the late attempt stays visible. A commit repeated by the same lease after it succeeded is a
no-op that returns the stored result (the designated write is idempotent).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from onceflow.ledger import items, schema, states
from onceflow.ledger.db import is_sqlite
from onceflow.ledger.errors import StaleFenceError, UnknownWorkItem
from onceflow.ledger.models import WORK_ITEM, FollowUp, Lease, ResultRecord
from onceflow.ledger.recheck import RECHECK_LANE

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.engine import Connection, Engine

DEFAULT_BACKOFF_SECONDS = 30.0
MAX_BACKOFF_SECONDS = 3600.0


def _refuse(
    engine: Engine, lease: Lease, item: dict[str, Any] | None, now: float, what: str
) -> StaleFenceError:
    """Record the refused late write in its own transaction and return the error to raise."""
    if item is None:
        raise UnknownWorkItem(lease.work_key)
    with engine.begin() as conn:
        current = items.lock_item(conn, lease.work_key) or item
        items.apply(
            conn,
            current,
            "commit_refused",
            states.WORKER,
            {"now": now, "token": lease.token, "reason": f"{what} with stale token {lease.token}"},
            owner=lease.owner,
        )
    return StaleFenceError(lease.work_key, lease.token, current["fencing_token"], current["state"])


def _stored_result(conn: Connection, work_key: str, step: str, version: str) -> ResultRecord | None:
    r = schema.results.c
    row = conn.execute(
        sa.select(schema.results).where(
            r.work_key == work_key, r.step == step, r.processing_version == version
        )
    ).first()
    if row is None:
        return None
    return ResultRecord.from_row(row._mapping)


def write_follow_up(
    conn: Connection, spec: dict[str, Any], *, work_key: str, step: str, now: float, actor: str
) -> bool:
    """Insert one resolved follow-up unless it exists; ``True`` when it was missing."""
    if spec["type"] == WORK_ITEM:
        return items.create_item(
            conn,
            kind=spec["target"],
            work_key=spec["key"],
            now=now,
            actor=states.PRODUCER if actor == states.WORKER else actor,
            priority=spec["priority"],
            payload=spec["payload"] or None,
            required_version=spec["required_version"],
            reason=f"follow-up of {work_key} {step}",
        )
    return items.insert_ignore(
        conn,
        schema.outbox,
        {
            "dedup_key": spec["dedup_key"],
            "work_key": work_key,
            "step": step,
            "target_type": spec["type"],
            "target": spec["target"],
            "payload": json.dumps({"key": spec["key"], "data": spec["payload"]}, sort_keys=True),
            "state": "pending",
            "attempts": 0,
            "created_at": now,
        },
        "dedup_key",
    )


def requirement_met(
    item: dict[str, Any], version: str, reason: str | None
) -> tuple[dict[str, Any], str | None]:
    """Clear the item's version requirement when ``version`` met it (updates, completion reason).

    A requirement pins the item for the recheck (or ``add``) that set it: once a result at that
    version completes the item, any deployment may lease it again. The clearing is recorded in
    the completing transition's reason, so the old pin stays in the audit trail.
    """
    required = item.get("required_version")
    if required is None or required != version:
        return {}, reason
    note = f"required version {required} met: requirement cleared"
    return {"required_version": None}, f"{reason}; {note}" if reason else note


def _replaces_earlier_result(conn: Connection, work_key: str, step: str, token: int) -> bool:
    """Whether ``step`` of ``work_key`` was committed before, by an older lease (any version)."""
    r = schema.results.c
    stmt = sa.select(sa.literal(1)).where(r.work_key == work_key, r.step == step, r.fencing_token < token)
    return conn.execute(stmt.limit(1)).first() is not None


def reopen_next_item(
    conn: Connection, spec: dict[str, Any], *, parent: dict[str, Any], step: str, token: int, now: float
) -> bool:
    """Re-open the finished next item of a re-committed result, once per committing lease.

    The next item read the replaced result, so it runs again: a ``recheck`` transition into the
    recheck lane with the parent's priority and recheck id (a recheck's priority is carried on its
    items), a fresh attempt budget and the follow-up's own version requirement. A pending or
    leased next item is left alone: it has not committed yet (a holder that read the old result
    before this commit still commits it; docs/ledger.md, Outbox); a cancelled one stays cancelled.
    :return: whether it re-opened the item.
    """
    reason = f"follow-up of {parent['work_key']} {step} re-committed under token {token}"
    t = schema.transitions.c
    seen = sa.select(sa.literal(1)).where(t.work_key == spec["key"], t.event == "recheck", t.reason == reason)
    if conn.execute(seen.limit(1)).first() is not None:
        return False  # this attempt's re-open happened already
    item = items.lock_item(conn, spec["key"])
    if item is None or item["state"] not in states.BY_EVENT["recheck"].sources:
        return False
    items.apply(
        conn,
        item,
        "recheck",
        states.RECHECK,
        {"now": now, "reason": reason},
        {
            "available_at": now,
            "priority": parent["priority"],
            "lane": RECHECK_LANE,
            "recheck_id": parent["recheck_id"],
            "reason": reason,
            "required_version": spec["required_version"],
            "attempts": 0,
            "lease_expires_at": None,
        },
    )
    return True


def commit_result(
    engine: Engine,
    lease: Lease,
    *,
    step: str,
    payload: Any,
    follow_ups: Sequence[FollowUp],
    now: float,
    complete: bool = True,
    reason: str | None = None,
) -> ResultRecord:
    """Store the result of ``step`` for ``lease``'s item and its follow-ups, in one transaction.

    :param complete: move the item to ``done`` (``False`` stores an intermediate step's result
        and keeps the lease).
    :param reason: recorded on the ``complete`` transition (e.g. "finished during shutdown").
    :raises StaleFenceError: a newer lease exists (the refusal is recorded).
    """
    version = lease.worker_version
    specs = [f.resolved(lease.work_key, step, version, lease.token) for f in follow_ups]
    with engine.begin() as conn:
        item = items.lock_item(conn, lease.work_key)
        current = item is not None and item["state"] == states.LEASED and item["fencing_token"] == lease.token
        if not current:
            stored = _stored_result(conn, lease.work_key, step, version)
            if stored is not None and stored.fencing_token == lease.token:
                return stored  # this lease's commit already happened: a retry changes nothing
        else:
            assert item is not None
            # Read before the upsert: at the same version it overwrites the earlier result.
            recommitted = _replaces_earlier_result(conn, lease.work_key, step, lease.token)
            _upsert_result(conn, lease, step, version, payload, specs, now)
            for spec in specs:
                created = write_follow_up(
                    conn, spec, work_key=lease.work_key, step=step, now=now, actor=states.WORKER
                )
                if spec["type"] == WORK_ITEM and not created and recommitted:
                    reopen_next_item(conn, spec, parent=item, step=step, token=lease.token, now=now)
            if complete:
                cleared, done_reason = requirement_met(item, version, reason)
                items.apply(
                    conn,
                    item,
                    "complete",
                    states.WORKER,
                    {"now": now, "token": lease.token, "result_written": True, "reason": done_reason},
                    {"lease_expires_at": None, "last_error_class": None, "last_error": None, **cleared},
                    owner=lease.owner,
                )
            return ResultRecord(
                work_key=lease.work_key,
                step=step,
                processing_version=version,
                fencing_token=lease.token,
                payload=json.loads(json.dumps(payload)),
                committed_by=lease.owner,
                committed_at=now,
                follow_ups=specs,
            )
    raise _refuse(engine, lease, item, now, f"commit of {step!r}")


def _upsert_result(
    conn: Connection,
    lease: Lease,
    step: str,
    version: str,
    payload: Any,
    specs: list[dict[str, Any]],
    now: float,
) -> None:
    values = {
        "work_key": lease.work_key,
        "step": step,
        "processing_version": version,
        "fencing_token": lease.token,
        "payload": json.dumps(payload, sort_keys=True),
        "committed_by": lease.owner,
        "committed_at": now,
        "follow_ups": json.dumps(specs, sort_keys=True) if specs else None,
    }
    ins = (sqlite.insert if is_sqlite(conn) else postgresql.insert)(schema.results).values(values)
    # A recheck under a newer lease replaces the old result; an older token never overwrites a newer one.
    ins = ins.on_conflict_do_update(
        index_elements=["work_key", "step", "processing_version"],
        set_={
            k: ins.excluded[k]
            for k in ("fencing_token", "payload", "committed_by", "committed_at", "follow_ups")
        },
        where=schema.results.c.fencing_token <= ins.excluded.fencing_token,
    )
    conn.execute(ins)


def fail(
    engine: Engine,
    lease: Lease,
    *,
    error: BaseException | str,
    now: float,
    backoff_seconds: float | None = None,
) -> str:
    """Record a transient failure: ``retry`` later, or ``give_up`` when attempts are used up.

    :param backoff_seconds: delay before the retry; default doubles per attempt from 30 s (max 1 h).
    :return: the item's new state.
    """
    error_class = error if isinstance(error, str) else type(error).__name__
    message = error if isinstance(error, str) else str(error)
    with engine.begin() as conn:
        item = items.lock_item(conn, lease.work_key)
        if item is not None and item["state"] == states.LEASED and item["fencing_token"] == lease.token:
            ctx = {"now": now, "token": lease.token, "reason": f"{error_class}: {message}"[:2000]}
            common = {
                "lease_expires_at": None,
                "last_error_class": error_class[:256],
                "last_error": message[:4000],
            }
            if item["attempts"] < item["max_attempts"]:
                delay = backoff_seconds
                if delay is None:
                    delay = min(
                        DEFAULT_BACKOFF_SECONDS * 2 ** max(item["attempts"] - 1, 0), MAX_BACKOFF_SECONDS
                    )
                after = items.apply(
                    conn,
                    item,
                    "retry",
                    states.WORKER,
                    ctx,
                    {**common, "available_at": now + delay},
                    owner=lease.owner,
                )
            else:
                after = items.apply(conn, item, "give_up", states.WORKER, ctx, common, owner=lease.owner)
            return str(after["state"])
    raise _refuse(engine, lease, item, now, "failure report")


def mark_invalid(
    engine: Engine,
    lease: Lease,
    *,
    reason: str,
    now: float,
    step: str = "",
    follow_ups: Sequence[FollowUp] = (),
) -> None:
    """The input is wrong: move to ``needs_correction`` with ``reason`` (no retry can help).

    :param follow_ups: written in the same transaction (the row's FAILED for the sheet relay), so
        a try whose lease was taken over writes none of them.
    """
    specs = [f.resolved(lease.work_key, step, lease.worker_version, lease.token) for f in follow_ups]
    with engine.begin() as conn:
        item = items.lock_item(conn, lease.work_key)
        if item is not None and item["state"] == states.LEASED and item["fencing_token"] == lease.token:
            for spec in specs:
                write_follow_up(conn, spec, work_key=lease.work_key, step=step, now=now, actor=states.WORKER)
            items.apply(
                conn,
                item,
                "invalid_input",
                states.WORKER,
                {"now": now, "token": lease.token, "reason": reason},
                {"lease_expires_at": None, "last_error_class": "InvalidInput", "last_error": reason[:4000]},
                owner=lease.owner,
            )
            return
    raise _refuse(engine, lease, item, now, "invalid-input report")


def enqueue(
    engine: Engine, *, step: str, follow_ups: Sequence[tuple[str, FollowUp]], now: float, actor: str
) -> int:
    """Write outbox follow-ups that no lease commits, in one transaction; return how many were new.

    For writes decided outside any work item's lease: a sheet row a claim found INVALID or
    DUPLICATE (no article item is its own), a row ``sheet_reconcile`` finishes. Each needs its own
    ``key``, so a repeat (a retry of the task) is the same outbox row and changes nothing.

    :param follow_ups: (work key the row is filed under, follow-up) pairs.
    :raises ValueError: a follow-up without a key, or one that is not an outbox row.
    """
    specs = []
    for work_key, f in follow_ups:
        if f.target_type == WORK_ITEM or not f.key:
            raise ValueError(f"enqueue takes keyed outbox follow-ups, not {f.target_type} {f.key!r}")
        specs.append((work_key, f.resolved(work_key, step, "", 0)))
    with engine.begin() as conn:
        return sum(
            write_follow_up(conn, spec, work_key=work_key, step=step, now=now, actor=actor)
            for work_key, spec in specs
        )


def record_refusal(engine: Engine, lease: Lease, *, now: float, what: str) -> bool:
    """Record that a sink refused ``lease``'s write (``commit_refused``), if the lease is stale here too.

    :return: ``False`` (nothing written) when ``lease`` is still the item's current lease.
    """
    with engine.begin() as conn:
        item = items.lock_item(conn, lease.work_key)
        if item is None:
            raise UnknownWorkItem(lease.work_key)
        if item["state"] == states.LEASED and item["fencing_token"] == lease.token:
            return False
        items.apply(
            conn,
            item,
            "commit_refused",
            states.WORKER,
            {"now": now, "token": lease.token, "reason": f"{what} (stale token {lease.token})"[:2000]},
            owner=lease.owner,
        )
    return True
