"""The design's six operational questions, answered from the ledger.

1. Is new work still being discovered?  :func:`discovery`
2. How old is the oldest eligible item?  :func:`oldest_eligible`
3. Are leases expiring more often than usual?  :func:`lease_expiries`
4. Which error classes consume retry capacity?  :func:`error_classes`
5. Do committed results create all expected follow-up work?  :func:`follow_ups`
6. Which processing versions remain active?  :func:`active_versions`

Each reads the ledger's tables through one connection and takes ``now`` (epoch seconds) from the
caller, so the answer is a function of the stored state and the clock. Every query is bounded by
a time window or by the live states, and has an index behind it (``ledger_v5``, ``ledger_v7``):
the view stays fast as finished work piles up (``benchmarks/bench_ops_view.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from onceflow.ledger import schema, states
from onceflow.opsview.links import from_owner

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

HOUR = 3600.0
DAY = 24 * HOUR
#: Events that record a lease running out: the reconciler's expiry (retry or give up) and a
#: claimer taking over an expired lease.
EXPIRY_EVENTS = ("expire", "give_up_expired", "reclaim_expired")
#: Age histogram buckets of eligible items: (label, upper bound in seconds).
AGE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<1m", 60),
    ("1-5m", 300),
    ("5-15m", 900),
    ("15m-1h", HOUR),
    ("1-6h", 6 * HOUR),
    ("6-24h", DAY),
    (">1d", float("inf")),
)
#: A published article whose write-back is younger than this is in flight, not missing.
WRITE_BACK_SETTLE_S = 300.0
#: An expiry rate this many times the trailing week's, with at least MIN_UNUSUAL expiries, is unusual.
UNUSUAL_RATIO = 2.0
MIN_UNUSUAL = 3

w, t, r, o = schema.work_items, schema.transitions, schema.results, schema.outbox
# Written as literals, not bound parameters: SQLite uses a partial index only when the query's
# WHERE names its predicate's very values (ix_work_items_eligible, ix_work_items_leased).
PENDING = sa.text("work_items.state = 'pending'")
LEASED = sa.text("work_items.state = 'leased'")
LIVE = sa.text("work_items.state IN ('pending', 'leased')")


# The newest item of each kind by index probes (ix_work_items_kind_created): a loose index scan
# walks the distinct kinds one probe each, then one probe for each kind's newest; a GROUP BY
# would read every item (neither PostgreSQL before 18 nor SQLite skip-scans it).
NEWEST_PER_KIND = sa.text(
    """
    WITH RECURSIVE kinds(kind) AS (
        SELECT MIN(kind) FROM work_items
        UNION ALL
        SELECT (SELECT MIN(w2.kind) FROM work_items w2 WHERE w2.kind > kinds.kind)
        FROM kinds WHERE kinds.kind IS NOT NULL
    )
    SELECT kind, (SELECT MAX(w3.created_at) FROM work_items w3 WHERE w3.kind = kinds.kind)
    FROM kinds WHERE kind IS NOT NULL
    """
)


def hour_bucket(conn: Connection, column: Any, since: float) -> Any:
    """Whole hours between ``since`` and ``column`` (``column >= since``) as a SQL integer."""
    offset = (column - since) / HOUR
    if conn.dialect.name == "sqlite":
        return sa.cast(offset, sa.Integer)  # truncates; the offset is never negative
    return sa.cast(sa.func.floor(offset), sa.Integer)


def _fold(rows: Any, hours: int) -> dict[int, int]:
    """Counts per hour bucket from ``(bucket, count)`` rows. The window is closed at ``now``, whose
    own bucket (``hours``) is folded into the last hour."""
    counts: dict[int, int] = {}
    for b, n in rows:
        i = min(int(b), hours - 1)
        counts[i] = counts.get(i, 0) + int(n)
    return counts


def _series(counts: dict[int, int], hours: int) -> list[int]:
    return [counts.get(i, 0) for i in range(hours)]


def discovery(conn: Connection, now: float, hours: int = 48) -> dict[str, Any]:
    """Work items created per hour (per kind) and completed per hour; the time since the last one.

    ``created`` and ``completed`` are lists of ``hours`` counts, oldest hour first; the last
    bucket is the hour up to ``now``.
    """
    since = now - hours * HOUR
    by_kind: dict[str, list[tuple[int, int]]] = {}
    bucket = hour_bucket(conn, w.c.created_at, since)
    rows = conn.execute(
        sa.select(w.c.kind, bucket.label("b"), sa.func.count())
        .where(w.c.created_at >= since, w.c.created_at <= now)
        .group_by(w.c.kind, bucket)
    )
    for kind, b, n in rows:
        by_kind.setdefault(kind, []).append((b, n))
    created = {kind: _fold(found, hours) for kind, found in by_kind.items()}
    last = {kind: at for kind, at in conn.execute(NEWEST_PER_KIND)}
    done_bucket = hour_bucket(conn, t.c.at, since)
    completed = _fold(
        conn.execute(
            sa.select(done_bucket.label("b"), sa.func.count())
            .where(
                t.c.to_state == states.DONE,
                sa.or_(t.c.from_state.is_(None), t.c.from_state != states.DONE),
                t.c.at >= since,
                t.c.at <= now,
            )
            .group_by(done_bucket)
        ),
        hours,
    )
    kinds = sorted(set(created) | set(last))
    per_kind = [
        {
            "kind": kind,
            "created_per_hour": _series(created.get(kind, {}), hours),
            "created_last_hour": created.get(kind, {}).get(hours - 1, 0),
            "created_in_window": sum(created.get(kind, {}).values()),
            "last_created_at": last.get(kind),
            "seconds_since_last": None if last.get(kind) is None else max(0.0, now - last[kind]),
        }
        for kind in kinds
    ]
    newest = max((at for at in last.values() if at is not None), default=None)
    return {
        "window_hours": hours,
        "window_start": since,
        "kinds": per_kind,
        "created_per_hour": [sum(c.get(i, 0) for c in created.values()) for i in range(hours)],
        "completed_per_hour": _series(completed, hours),
        "completed_in_window": sum(completed.values()),
        "seconds_since_last_discovery": None if newest is None else max(0.0, now - newest),
    }


def oldest_eligible(conn: Connection, now: float) -> dict[str, Any]:
    """Items a claim may take now, per kind, lane, priority and required version: pending ones
    whose ``available_at`` has passed, and leased ones whose lease ran out (their holder died; the
    next claim takes them over, ``reclaim_expired``), as the claim's own WHERE has it.

    ``oldest_age_s`` counts from the item's creation, ``longest_wait_s`` from when it last became
    claimable (a retry's backoff is not waiting; an expired lease waits from its expiry).
    ``histogram`` counts the eligible items by age.
    """
    age = now - w.c.created_at
    bucket = sa.case(
        *[(age < upper, i) for i, (_, upper) in enumerate(AGE_BUCKETS[:-1])], else_=len(AGE_BUCKETS) - 1
    )
    by_group: dict[tuple[Any, ...], list[float]] = {}
    counts: dict[int, int] = {}
    # One pass over each partial index, the groups and the age histogram folded from the same rows:
    # the pending items index-only on ix_work_items_eligible, the leased ones (a few: one per
    # running attempt) on ix_work_items_leased.
    for where, since in (
        (sa.and_(PENDING, w.c.available_at <= now), w.c.available_at),
        (sa.and_(LEASED, w.c.lease_expires_at <= now), w.c.lease_expires_at),
    ):
        for kind, lane, priority, version, b, n, oldest, waiting in conn.execute(
            sa.select(
                w.c.kind,
                w.c.lane,
                w.c.priority,
                w.c.required_version,
                bucket.label("b"),
                sa.func.count(),
                sa.func.min(w.c.created_at),
                sa.func.min(since),
            )
            .where(where)
            .group_by(w.c.kind, w.c.lane, w.c.priority, w.c.required_version, bucket)
        ):
            counts[int(b)] = counts.get(int(b), 0) + int(n)
            acc = by_group.setdefault((kind, lane, int(priority), version), [0, oldest, waiting])
            acc[0] += int(n)
            acc[1], acc[2] = min(acc[1], oldest), min(acc[2], waiting)
    groups = [
        {
            "kind": kind,
            "lane": lane,
            "priority": priority,
            "version": version,
            "items": int(n),
            "oldest_age_s": max(0.0, now - oldest),
            "longest_wait_s": max(0.0, now - waiting),
        }
        for (kind, lane, priority, version), (n, oldest, waiting) in by_group.items()
    ]
    groups.sort(key=lambda g: -g["oldest_age_s"])
    return {
        "groups": groups,
        "eligible_items": sum(g["items"] for g in groups),
        "oldest_age_s": max((g["oldest_age_s"] for g in groups), default=None),
        "histogram": [
            {"bucket": label, "items": counts.get(i, 0)} for i, (label, _) in enumerate(AGE_BUCKETS)
        ],
    }


def lease_expiries(conn: Connection, now: float, hours: int = 48) -> dict[str, Any]:
    """Lease expiries in the last 24 hours against the daily mean of the 7 days before them."""
    week_start = now - 8 * DAY
    day_start = now - DAY
    expired = t.c.event.in_(EXPIRY_EVENTS)
    last_day, week = conn.execute(
        sa.select(
            sa.func.count().filter(t.c.at >= day_start),
            sa.func.count().filter(t.c.at < day_start),
        ).where(expired, t.c.at >= week_start, t.c.at <= now)
    ).one()
    since = now - hours * HOUR
    bucket = hour_bucket(conn, t.c.at, since)
    per_hour = _fold(
        conn.execute(
            sa.select(bucket.label("b"), sa.func.count())
            .where(expired, t.c.at >= since, t.c.at <= now)
            .group_by(bucket)
        ),
        hours,
    )
    by_event: dict[str, int] = dict(
        conn.execute(
            sa.select(t.c.event, sa.func.count())
            .where(expired, t.c.at >= day_start, t.c.at <= now)
            .group_by(t.c.event)
        ).all()
    )
    daily_mean = int(week) / 7.0
    ratio = None if daily_mean == 0 else int(last_day) / daily_mean
    unusual = int(last_day) >= MIN_UNUSUAL and (ratio is None or ratio >= UNUSUAL_RATIO)
    return {
        "last_24h": int(last_day),
        "trailing_week_daily_mean": daily_mean,
        "ratio": ratio,
        "unusual": unusual,
        "by_event_24h": {k: int(v) for k, v in by_event.items()},
        "window_hours": hours,
        "per_hour": _series(per_hour, hours),
        "trailing_week_hourly_mean": daily_mean / 24.0,
    }


def error_classes(conn: Connection, now: float, days: int = 7) -> dict[str, Any]:
    """Error classes of items that failed an attempt in the last ``days``, by attempts spent.

    ``attempts`` sums every attempt of those items, ``retrying`` counts the ones still live (they
    will take more attempts), ``failed`` the ones that ran out.
    """
    since = now - days * DAY
    live = LIVE
    rows = conn.execute(
        sa.select(
            w.c.kind,
            w.c.last_error_class,
            sa.func.count(),
            sa.func.sum(w.c.attempts),
            sa.func.count().filter(live),
            sa.func.count().filter(w.c.state == states.FAILED),
        )
        .where(w.c.last_error_class.is_not(None), w.c.updated_at >= since)
        .group_by(w.c.kind, w.c.last_error_class)
    )
    classes = [
        {
            "kind": kind,
            "error_class": cls,
            "items": int(n),
            "attempts": int(attempts or 0),
            "retrying": int(retrying),
            "failed": int(failed),
        }
        for kind, cls, n, attempts, retrying, failed in rows
    ]
    classes.sort(key=lambda c: (-c["attempts"], c["kind"], c["error_class"]))
    return {"window_days": days, "classes": classes, "attempts": sum(c["attempts"] for c in classes)}


def follow_ups(
    conn: Connection, now: float, settle_s: float = WRITE_BACK_SETTLE_S, days: int = 7
) -> dict[str, Any]:
    """Committed results whose follow-up work is missing: outbox rows not relayed, and articles
    published in the last ``days`` without their write-back (older than ``settle_s``, so a chain
    in flight is not one; older gaps are the reconciler's to report)."""
    outbox = [
        {"target_type": kind, "rows": int(n), "oldest_age_s": max(0.0, now - oldest)}
        for kind, n, oldest in conn.execute(
            sa.select(o.c.target_type, sa.func.count(), sa.func.min(o.c.created_at))
            .where(o.c.state == "pending")
            .group_by(o.c.target_type)
        )
    ]
    wb = r.alias("wb")
    missing_wb = (
        sa.select(r.c.work_key, r.c.processing_version, r.c.committed_at, r.c.committed_by)
        .where(
            r.c.step == "publish",
            r.c.committed_at >= now - days * DAY,
            r.c.committed_at <= now - settle_s,
            ~sa.exists().where(
                wb.c.work_key == r.c.work_key,
                wb.c.step == "write_back",
                wb.c.processing_version == r.c.processing_version,
            ),
        )
        .order_by(r.c.committed_at)
    )
    # The total rides on each example row (a window count): one pass over the week, not two.
    found = conn.execute(missing_wb.add_columns(sa.func.count().over().label("total")).limit(50)).all()
    rows = [tuple(row)[:4] for row in found]
    total = found[0].total if found else 0
    return {
        "window_days": days,
        "outbox_pending": outbox,
        "outbox_pending_rows": sum(x["rows"] for x in outbox),
        "published_not_written_back": int(total),
        "examples": [
            {
                "work_key": key,
                "processing_version": version,
                "published_at": at,
                "age_s": max(0.0, now - at),
                "owner": by,
                "run": None if (ref := from_owner(by)) is None else ref.as_dict(),
            }
            for key, version, at, by in rows
        ],
    }


def active_versions(conn: Connection, now: float, days: int = 7) -> dict[str, Any]:
    """Processing versions that live items require or that committed results in the last ``days``."""
    since = now - days * DAY
    found: dict[str | None, dict[str, Any]] = {}

    def entry(version: str | None) -> dict[str, Any]:
        return found.setdefault(
            version,
            {"version": version, "live_items": 0, "live_by_kind": {}, "results": 0, "last_commit_at": None},
        )

    # Pending and leased apart: each matches a partial index (pending: ix_work_items_eligible,
    # leased: ix_work_items_leased, both index-only), where `state IN (...)` over both made
    # PostgreSQL read the whole table (420 ms of 100,000 items under load, against 20).
    for live_state in (PENDING, LEASED):
        for kind, version, n in conn.execute(
            sa.select(w.c.kind, w.c.required_version, sa.func.count())
            .where(live_state)
            .group_by(w.c.kind, w.c.required_version)
        ):
            e = entry(version)
            e["live_items"] += int(n)
            e["live_by_kind"][kind] = e["live_by_kind"].get(kind, 0) + int(n)
    for version, n, last in conn.execute(
        sa.select(r.c.processing_version, sa.func.count(), sa.func.max(r.c.committed_at))
        .where(r.c.committed_at >= since, r.c.committed_at <= now)
        .group_by(r.c.processing_version)
    ):
        e = entry(version)
        e["results"] = int(n)
        e["last_commit_at"] = last
    versions = sorted(found.values(), key=lambda e: (-(e["last_commit_at"] or 0), str(e["version"])))
    return {"window_days": days, "versions": versions}


def all_questions(conn: Connection, now: float) -> dict[str, Any]:
    """The six answers in one document (the API's ``/questions`` and the page's top half)."""
    return {
        "now": now,
        "discovery": discovery(conn, now),
        "oldest_eligible": oldest_eligible(conn, now),
        "lease_expiries": lease_expiries(conn, now),
        "error_classes": error_classes(conn, now),
        "follow_ups": follow_ups(conn, now),
        "active_versions": active_versions(conn, now),
    }
