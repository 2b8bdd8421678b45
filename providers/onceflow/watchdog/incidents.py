"""Incidents: each check's state ``up -> late -> down -> up``, moved by compare-and-set.

A check's evaluation gives a :class:`Verdict`, the state the evidence calls for. :func:`apply`
moves the stored state towards it with ``UPDATE ... WHERE check_name=? AND state=? AND
version=?`` and, in the same transaction, queues the alert rows the transition calls for. If the
UPDATE changed no row, another replica (or this one before a restart) made that transition
first: its alerts are already queued, so nothing is sent twice and nothing is forgotten.

Alerts (queued in :mod:`onceflow.watchdog.alerts`): ``down`` when a check goes down, ``reminder``
every ``reminder_seconds`` while it stays down, ``recovery`` when a check that alerted is up (or only late)
again. ``late`` is recorded (and makes the one-shot exit code 1) without paging anyone.
While a silence or maintenance window covers the check, the down alert is held back; if the
check is still down when the window ends, the alert goes out then.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.watchdog.schema import flips, incidents

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from onceflow.watchdog.alerts import Outbox
    from onceflow.watchdog.config import CheckConfig

log = logging.getLogger(__name__)

UP, LATE, DOWN = "up", "late", "down"
#: A verdict meaning "failing now, since I cannot tell when it started": the stored state's
#: ``since`` decides between late and down (``grace`` after the first failing evaluation).
FAILING = "failing"


@dataclass(frozen=True)
class Verdict:
    """What a check found. ``since``: when the evidence says the current state began."""

    state: str  # UP, LATE, DOWN or FAILING
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    since: float | None = None


@dataclass(frozen=True)
class Incident:
    """The state of one check's incident (a row of ``watchdog_incidents``)."""

    check_name: str
    state: str
    version: int
    incident: int
    since: float
    created_at: float
    alerted: bool
    last_alert_at: float | None
    reminders: int
    reason: str | None
    evidence: dict[str, Any]

    @classmethod
    def from_row(cls, row: Any) -> Incident:
        """Build from a ``watchdog_incidents`` row."""
        m = row._mapping
        return cls(
            m["check_name"],
            m["state"],
            m["version"],
            m["incident"],
            m["since"],
            m["created_at"],
            bool(m["alerted"]),
            m["last_alert_at"],
            m["reminders"],
            m["reason"],
            json.loads(m["evidence"] or "{}"),
        )


def read(conn: Connection, check_name: str) -> Incident | None:
    """The incident row of ``check_name``, or ``None``."""
    row = conn.execute(sa.select(incidents).where(incidents.c.check_name == check_name)).one_or_none()
    return None if row is None else Incident.from_row(row)


def read_all(engine: Engine) -> dict[str, Incident]:
    """Every check's incident, by check name."""
    with engine.connect() as conn:
        return {r.check_name: Incident.from_row(r) for r in conn.execute(sa.select(incidents))}


def get_or_create(engine: Engine, check_name: str, now: float, actor: str) -> Incident:
    """The stored incident row; a new check starts ``up`` (its first evaluation judges it)."""
    with engine.begin() as conn:
        current = read(conn, check_name)
        if current is not None:
            return current
    try:
        with engine.begin() as conn:
            conn.execute(
                incidents.insert().values(
                    check_name=check_name,
                    state=UP,
                    version=0,
                    incident=0,
                    since=now,
                    created_at=now,
                    updated_at=now,
                    updated_by=actor,
                    alerted=False,
                    reminders=0,
                )
            )
    except sa.exc.IntegrityError:
        pass  # another replica created it a moment ago
    with engine.begin() as conn:
        created = read(conn, check_name)
    assert created is not None
    return created


def resolve(verdict: Verdict, current: Incident, grace: float, now: float) -> tuple[str, float]:
    """The state a verdict calls for, and since when, given the stored state."""
    if verdict.state != FAILING:
        return verdict.state, verdict.since if verdict.since is not None else now
    failing_since = current.since if current.state in (LATE, DOWN) else now
    return (DOWN if now >= failing_since + grace else LATE), failing_since


def apply(
    engine: Engine,
    check: CheckConfig,
    verdict: Verdict,
    outbox: Outbox,
    *,
    now: float,
    actor: str,
) -> Incident:
    """Move the check's stored state towards ``verdict``; queue its alerts; return the stored state.

    Retries the compare-and-set a few times: losing it means another replica moved the state,
    and the new state is re-judged (usually nothing is left to do).
    """
    for _ in range(5):
        current = get_or_create(engine, check.name, now, actor)
        target, since = resolve(verdict, current, check.grace, now)
        downs = _recent_downs(engine, check, now) if target == DOWN else 0
        # Going down now would be one more; staying down counts the flips already recorded.
        flapping = check.flap_threshold > 0 and downs + (current.state != DOWN) > check.flap_threshold
        changes, alert_kind = _plan(current, target, since, check, outbox, now, flapping=flapping)
        if changes is None:
            return current
        with engine.begin() as conn:
            result = conn.execute(
                incidents.update()
                .where(
                    incidents.c.check_name == check.name,
                    incidents.c.state == current.state,
                    incidents.c.version == current.version,
                )
                .values(
                    **changes,
                    version=current.version + 1,
                    updated_at=now,
                    updated_by=actor,
                    reason=verdict.reason,
                    evidence=json.dumps(verdict.evidence, default=str, sort_keys=True),
                )
            )
            if result.rowcount != 1:
                continue  # another replica got there first: re-read and re-judge
            after = read(conn, check.name)
            assert after is not None
            if changes.get("state", current.state) != current.state:
                conn.execute(
                    flips.insert().values(
                        check_name=check.name,
                        at=now,
                        from_state=current.state,
                        to_state=after.state,
                        incident=after.incident,
                        actor=actor,
                    )
                )
            if alert_kind == "down" and flapping and changes.get("state") == DOWN:
                alert_kind = "flapping" if not _flapping_announced(conn, check, now) else None
            if alert_kind is not None:
                outbox.enqueue(conn, check, after, alert_kind, verdict, now=now, down_since=current.since)
        if changes.get("state", current.state) != current.state:
            log.warning(
                "check %s: %s -> %s (incident %s): %s",
                check.name,
                current.state,
                after.state,
                after.incident,
                verdict.reason,
            )
        return after
    raise RuntimeError(f"check {check.name}: compare-and-set kept losing; is the clock running backwards?")


def _recent_downs(engine: Engine, check: CheckConfig, now: float) -> int:
    """How many times the check went down within its flap window (0 when damping is off)."""
    if check.flap_threshold <= 0:
        return 0
    with engine.connect() as conn:
        downs = conn.execute(
            sa.select(sa.func.count())
            .select_from(flips)
            .where(
                flips.c.check_name == check.name,
                flips.c.to_state == DOWN,
                flips.c.at > now - check.flap_window,
            )
        ).scalar_one()
    return int(downs)


def _flapping_announced(conn: Connection, check: CheckConfig, now: float) -> bool:
    from onceflow.watchdog.schema import alerts

    return (
        conn.execute(
            sa.select(alerts.c.id).where(
                alerts.c.check_name == check.name,
                alerts.c.kind == "flapping",
                alerts.c.created_at > now - check.flap_window,
            )
        ).first()
        is not None
    )


def _plan(
    current: Incident,
    target: str,
    since: float,
    check: CheckConfig,
    outbox: Outbox,
    now: float,
    *,
    flapping: bool = False,
) -> tuple[dict[str, Any] | None, str | None]:
    """The column changes and the alert kind for one step, or ``(None, None)`` if nothing to do.

    A flapping check's new incident is recorded unalerted and announced once as ``flapping``
    (the caller turns this step's ``down`` into it); while it keeps flapping nothing more is
    paged. Damping holds a down for at most ``period + grace`` past its ``since``: a check still
    down then has stopped flapping and is dead, and its down alert goes out (as it does when the
    flips age out of the window first). Holding it for the window would leave a check that died
    minutes after a flapping spell unpaged for up to the whole window.
    """
    silenced = check.silenced_at(now) is not None
    if target == DOWN:
        if current.state != DOWN:
            # Going down opens a new incident; a silenced check records it without paging.
            held = silenced or flapping
            return (
                {
                    "state": DOWN,
                    "since": since,
                    "incident": current.incident + 1,
                    "alerted": not held,
                    "last_alert_at": None if held else now,
                    "reminders": 0,
                },
                None if silenced else "down",
            )
        held = flapping and not current.alerted and now < current.since + check.period + check.grace
        if silenced or held:
            return None, None
        if not current.alerted:  # the silence ended with the check still down: page now
            return {"alerted": True, "last_alert_at": now}, "down"
        if current.last_alert_at is not None and now - current.last_alert_at >= outbox.reminder_seconds:
            return {"last_alert_at": now, "reminders": current.reminders + 1}, "reminder"
        return None, None
    if target == current.state:
        return None, None
    changes: dict[str, Any] = {"state": target, "since": since}
    if current.state == DOWN:
        # The evidence moved (a fresh but slow beat, a loaded day with the next one now due):
        # this incident is over; if the check goes down again, that is a new one.
        changes.update(alerted=False, last_alert_at=None)
        return changes, ("recovery" if current.alerted else None)
    return changes, None
