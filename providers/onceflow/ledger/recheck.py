"""Rechecks as first-class work: a scope, a reason, a target version, a priority and a cap.

A recheck selects finished items, re-opens each with the ``recheck`` transition (reason
recorded) into the ``recheck`` lane, and writes one ``rechecks`` row. Workers of the recheck
lane (Airflow pool ``onceflow_recheck``) claim them with ``lane="recheck"``, so rechecks never
crowd out new work. :func:`recheck_report` answers "what did this recheck cost and change".

Scopes:

* ``stale``: ``done`` items not updated for ``stale_after_seconds``, oldest first.
* ``failed_window``: ``failed`` items that gave up between ``window_start`` and ``window_end``
  (a provider outage), oldest first.
* ``new_version``: ``done`` items with no result at ``target_version`` (required until a result at
  that version completes them, so only workers running that version take them). A recheck
  without a ``target_version`` pins nothing: an earlier pin is not inherited.
* ``quality_sample``: a uniform sample of ``done`` items, seeded by ``seed`` (default: the
  reason), so the same request selects the same items.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger import items, schema, states
from onceflow.ledger.errors import IllegalTransition

if TYPE_CHECKING:
    from onceflow.ledger.core import Ledger

SCOPES = ("stale", "failed_window", "new_version", "quality_sample")
RECHECK_LANE = "recheck"


@dataclass(frozen=True)
class RecheckRequest:
    """What to recheck and why.

    :param scope: one of :data:`SCOPES`.
    :param reason: why (required; stored on the recheck, each item and each transition).
    :param kind: work item kind to select from.
    :param target_version: processing version the recheck must run with (required for
        ``new_version``; optional otherwise).
    :param priority: priority of the re-opened items.
    :param max_items: at most this many items.
    """

    scope: str
    reason: str
    kind: str
    target_version: str | None = None
    priority: int = 0
    max_items: int = 100
    stale_after_seconds: float = 30 * 86400.0
    window_start: float | None = None
    window_end: float | None = None
    seed: str | None = None
    requested_by: str | None = None

    def validate(self) -> None:
        """Refuse an unknown scope, an empty reason or a non-positive limit, with a message naming it."""
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, not {self.scope!r}")
        if not self.reason.strip():
            raise ValueError("a recheck needs a reason")
        if self.max_items < 1:
            raise ValueError("max_items must be at least 1")
        if self.scope == "new_version" and not self.target_version:
            raise ValueError("scope new_version needs a target_version")
        if self.scope == "failed_window" and (self.window_start is None or self.window_end is None):
            raise ValueError("scope failed_window needs window_start and window_end")


@dataclass(frozen=True)
class RecheckResult:
    """What a recheck re-opened: its id and the work keys."""

    recheck_id: int
    work_keys: list[str]


def select_candidates(ledger: Ledger, request: RecheckRequest) -> list[str]:
    """The work keys a recheck request selects (by scope, kind and limit), oldest first."""
    w, r = schema.work_items, schema.results
    now = ledger.clock.now()
    stmt = sa.select(w.c.work_key).where(w.c.kind == request.kind)
    if request.scope == "stale":
        stmt = stmt.where(w.c.state == states.DONE, w.c.updated_at <= now - request.stale_after_seconds)
        stmt = stmt.order_by(w.c.updated_at, w.c.id).limit(request.max_items)
    elif request.scope == "failed_window":
        stmt = stmt.where(
            w.c.state == states.FAILED, w.c.updated_at.between(request.window_start, request.window_end)
        ).order_by(w.c.updated_at, w.c.id)
        stmt = stmt.limit(request.max_items)
    elif request.scope == "new_version":
        has_version = sa.exists().where(
            r.c.work_key == w.c.work_key, r.c.processing_version == request.target_version
        )
        stmt = stmt.where(w.c.state == states.DONE, ~has_version).order_by(w.c.id).limit(request.max_items)
    else:  # quality_sample
        stmt = stmt.where(w.c.state == states.DONE).order_by(w.c.work_key)
    with ledger.engine.connect() as conn:
        keys = list(conn.execute(stmt).scalars())
    if request.scope == "quality_sample" and len(keys) > request.max_items:
        keys = random.Random(request.seed or request.reason).sample(keys, request.max_items)
    return keys


def start_recheck(ledger: Ledger, request: RecheckRequest) -> RecheckResult:
    """Select items for ``request`` and re-open them in the recheck lane (one transaction)."""
    request.validate()
    keys = select_candidates(ledger, request)
    now = ledger.clock.now()
    reopened: list[str] = []
    with ledger.engine.begin() as conn:
        recheck_id = conn.execute(
            sa.insert(schema.rechecks)
            .values(
                scope=request.scope,
                reason=request.reason,
                kind=request.kind,
                target_version=request.target_version,
                priority=request.priority,
                max_items=request.max_items,
                selected=0,
                requested_by=request.requested_by,
                created_at=now,
            )
            .returning(schema.rechecks.c.id)
        ).scalar_one()
        for key in keys:
            item = items.lock_item(conn, key)
            if item is None:
                continue
            ctx = {"now": now, "reason": f"recheck {recheck_id} ({request.scope}): {request.reason}"}
            try:
                items.apply(
                    conn,
                    item,
                    "recheck",
                    states.RECHECK,
                    ctx,
                    {
                        "available_at": now,
                        "priority": request.priority,
                        "lane": RECHECK_LANE,
                        "recheck_id": recheck_id,
                        "reason": request.reason,
                        # A pin belongs to the recheck that set it: none here unless this one sets it.
                        "required_version": request.target_version,
                        "attempts": 0,
                        "lease_expires_at": None,
                    },
                )
            except IllegalTransition:
                continue  # changed state since selection (e.g. already re-opened)
            reopened.append(key)
        conn.execute(
            sa.update(schema.rechecks)
            .where(schema.rechecks.c.id == recheck_id)
            .values(selected=len(reopened))
        )
    return RecheckResult(recheck_id, reopened)


def waiting_for_other_versions(
    ledger: Ledger, kind: str, worker_version: str, *, lane: str = RECHECK_LANE
) -> dict[str, int]:
    """Open items of ``kind`` in ``lane`` that require a version other than ``worker_version``,
    counted per required version: work this worker leaves for workers running those versions."""
    w = schema.work_items
    stmt = (
        sa.select(w.c.required_version, sa.func.count())
        .where(
            w.c.kind == kind,
            w.c.lane == lane,
            w.c.state.in_((states.PENDING, states.LEASED)),
            w.c.required_version.is_not(None),
            w.c.required_version != worker_version,
        )
        .group_by(w.c.required_version)
    )
    with ledger.engine.connect() as conn:
        return {str(version): int(n) for version, n in conn.execute(stmt)}


def recheck_report(ledger: Ledger, recheck_id: int) -> dict[str, Any]:
    """The recheck's request, its items per state, attempts spent and results written since."""
    rc, w, r = schema.rechecks, schema.work_items, schema.results
    with ledger.engine.connect() as conn:
        head = conn.execute(sa.select(rc).where(rc.c.id == recheck_id)).mappings().one()
        by_state: dict[str, int] = dict(
            conn.execute(
                sa.select(w.c.state, sa.func.count()).where(w.c.recheck_id == recheck_id).group_by(w.c.state)
            ).all()
        )
        attempts = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(w.c.attempts), 0)).where(w.c.recheck_id == recheck_id)
        ).scalar_one()
        results = conn.execute(
            sa.select(sa.func.count())
            .select_from(r.join(w, r.c.work_key == w.c.work_key))
            .where(w.c.recheck_id == recheck_id, r.c.committed_at >= head["created_at"])
        ).scalar_one()
    return {
        **dict(head),
        "by_state": {k: int(v) for k, v in by_state.items()},
        "attempts": int(attempts),
        "results_written": int(results),
    }


def rechecks_by_reason(ledger: Ledger) -> list[dict[str, Any]]:
    """Every recheck with its reason and item count, newest first (cost and effectiveness)."""
    rc = schema.rechecks
    with ledger.engine.connect() as conn:
        return [dict(m) for m in conn.execute(sa.select(rc).order_by(rc.c.id.desc())).mappings()]
