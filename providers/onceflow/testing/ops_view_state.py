"""A known ledger and warehouse state for the operations view, and the figures it must show.

:func:`seed_ledger` writes work items, transitions, results and outbox rows at times relative to
``now``, so every one of the six answers has one right value (:class:`Expected`); the page tests
and the API tests compare against it. :func:`seed_partitions` writes ``load_audit`` rows for a
range of days with chosen gaps. Text that reaches the page (URLs, reasons) carries markup, so the
same state checks the escaping. Rows are inserted directly: this is the state the ledger's own
code leaves behind, not a run of it (``tests/integration/test_ledger_*`` test that code).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from onceflow.ledger import schema

HOUR = 3600.0
DAY = 24 * HOUR

#: Markup in places where a sheet or a fetched page puts text.
SCRIPT_TITLE = "<script>window.__opsview_pwned = 1</script>Breaking"
SCRIPT_URL = "javascript:window.__opsview_pwned=2"
SCRIPT_REASON = '<img src=x onerror="window.__opsview_pwned=3">bad input'


@dataclass
class Expected:
    """The six answers for the seeded state at ``now`` (seconds are exact at ``now``)."""

    now: float
    seconds_since_last_discovery: float = 60.0
    created_in_window: dict[str, int] = field(default_factory=dict)
    completed_in_window: int = 0
    oldest_eligible_age_s: float = 0.0
    eligible_items: int = 0
    oldest_by_group: dict[tuple[str, str, int, str | None], tuple[int, float]] = field(default_factory=dict)
    expiries_24h: int = 0
    expiries_week_daily_mean: float = 0.0
    top_error_class: tuple[str, str, int] = ("", "", 0)
    outbox_pending: int = 0
    published_not_written_back: int = 0
    versions: dict[str | None, tuple[int, int]] = field(default_factory=dict)
    published_articles: int = 0


def _item(key: str, kind: str, state: str, created: float, **kw: Any) -> dict[str, Any]:
    row = {
        "work_key": key,
        "kind": kind,
        "state": state,
        "priority": 0,
        "available_at": created,
        "fencing_token": 1 if state != "pending" else 0,
        "attempts": 0,
        "max_attempts": 5,
        "created_at": created,
        "updated_at": created,
        "lane": "new",
        "required_version": None,
        "payload": None,
        "last_error_class": None,
        "last_error": None,
        "reason": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "recheck_id": None,
    }
    row.update(kw)
    return row


def insert_items(conn: sa.Connection, rows: list[dict[str, Any]], chunk: int = 500) -> None:
    """Insert work items the way the ledger's guards allow (``ledger_v6``): each created pending
    with token 0, then leased with token 1, then moved to its final state (a ``done`` item needs
    its result first: insert results before calling this)."""
    w = schema.work_items
    conn.execute(
        w.insert(),
        [
            {**row, "state": "pending", "fencing_token": 0, "lease_owner": None, "lease_expires_at": None}
            for row in rows
        ],
    )
    leased = [row for row in rows if row["state"] == "leased"]
    finished = [row for row in rows if row["state"] not in ("pending", "leased")]
    for row in leased:  # their own lease
        conn.execute(
            w.update()
            .where(w.c.work_key == row["work_key"])
            .values(state="leased", fencing_token=1, lease_owner=row["lease_owner"] or "seed",
                    lease_expires_at=row["lease_expires_at"] or 0.0)
        )  # fmt: skip
    by_state: dict[str, list[str]] = {}
    for row in finished:
        by_state.setdefault(row["state"], []).append(row["work_key"])
    for state, keys in by_state.items():
        for start in range(0, len(keys), chunk):
            part = keys[start : start + chunk]
            conn.execute(
                w.update()
                .where(w.c.work_key.in_(part))
                .values(state="leased", fencing_token=1, lease_owner="seed", lease_expires_at=0.0)
            )
            conn.execute(
                w.update()
                .where(w.c.work_key.in_(part))
                .values(state=state, lease_owner=None, lease_expires_at=None)
            )


def create_ledger(engine: sa.Engine) -> None:
    """The ledger's schema at the newest revision (through its migrations, as a deployment does)."""
    from onceflow.ledger.migrations import migrate

    migrate(engine)


def seed_ledger(engine: sa.Engine, now: float) -> Expected:
    """Write the known state; return the answers it implies at ``now``."""
    create_ledger(engine)
    exp = Expected(now=now)
    items: list[dict[str, Any]] = []
    trans: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []

    def art_payload(n: int, url: str | None = None) -> str:
        return json.dumps(
            {"url": url or f"https://news.example/a{n}.html", "row_key": f"r{n}", "processing_version": "v1"}
        )

    # Question 2: eligible pending items in three groups, one not yet available, one leased.
    items += [
        _item(
            "article:r1", "article", "pending", now - 2 * HOUR, required_version="v1", payload=art_payload(1)
        ),
        _item("article:r2", "article", "pending", now - 1800, required_version="v1", payload=art_payload(2)),
        _item("article:r3", "article", "pending", now - 120, required_version="v1", payload=art_payload(3)),
        _item(
            "article:r4", "article", "pending", now - 600, lane="recheck", priority=5, required_version="v2"
        ),
        _item("daily_sales/2026-11-20", "partition_load", "pending", now - 11 * HOUR),
        _item("daily_sales/2026-11-21", "partition_load", "pending", now - 60, available_at=now + HOUR),
        _item(
            "article:r5",
            "article",
            "leased",
            now - 300,
            required_version="v1",
            lease_owner="article_pipeline/sheet__r5__v1/1/fetch",
            # an hour ahead, as the retries' backoff below: the page tests read these figures up
            # to 10 minutes after seeding, and a lease that ran out is eligible (question 2)
            lease_expires_at=now + HOUR,
        ),
    ]
    exp.oldest_by_group = {
        ("article", "new", 0, "v1"): (3, 2 * HOUR),
        ("article", "recheck", 5, "v2"): (1, 600.0),
        ("partition_load", "new", 0, None): (1, 11 * HOUR),
    }
    exp.eligible_items = 5
    exp.oldest_eligible_age_s = 11 * HOUR
    # Question 4: failing items of two classes (attempts spent), one old enough to be out of window.
    items += [
        _item(
            f"article:f{i}",
            "article",
            "failed",
            now - 3 * HOUR,
            attempts=5,
            last_error_class="FetchTimeout",
            updated_at=now - 2 * HOUR,
        )
        for i in range(2)
    ]
    items += [
        _item(
            f"article:t{i}",
            "article",
            "pending",
            now - 5 * HOUR,
            attempts=2,
            last_error_class="TransientHTTPError",
            available_at=now + HOUR,
            updated_at=now - 100,
        )
        for i in range(3)
    ]
    items.append(
        _item(
            "article:old",
            "article",
            "failed",
            now - 30 * DAY,
            attempts=5,
            last_error_class="Ancient",
            updated_at=now - 20 * DAY,
        )
    )
    exp.top_error_class = ("article", "FetchTimeout", 10)
    items.append(
        _item(
            "article:bad",
            "article",
            "needs_correction",
            now - 4 * HOUR,
            reason=SCRIPT_REASON,
            payload=art_payload(9, SCRIPT_URL),
        )
    )
    # Question 5 and the articles list: four published articles, three written back.
    for n in range(4):
        key = f"article:p{n}"
        owner = f"article_pipeline/sheet__p{n}__v1/1/publish"
        published = now - (n + 1) * HOUR
        url = SCRIPT_URL if n == 0 else f"https://site.example/published/p{n}.html"
        items.append(
            _item(
                key,
                "article",
                "done",
                published - 600,
                payload=art_payload(n, f"https://news.example/{SCRIPT_TITLE}"),
            )
        )
        results.append(_result(key, "publish", "v1", published, owner, {"url": url, "score": 0.9}))
        trans.append(_transition(key, "complete", "leased", "done", published, owner))
        if n != 2:
            results.append(
                _result(
                    key,
                    "write_back",
                    "v1",
                    published + 30,
                    owner.replace("publish", "write_back"),
                    {"status": "DONE"},
                )
            )
    exp.published_not_written_back = 1
    exp.published_articles = 4
    # Question 6: a v2 result besides v1.
    items.append(_item("article:v2done", "article", "done", now - 3 * DAY))
    results.append(
        _result(
            "article:v2done",
            "translate",
            "v2",
            now - 3 * DAY,
            "article_pipeline/sheet__v2done__v2/1/translate",
            {},
        )
    )
    trans.append(_transition("article:v2done", "complete", "leased", "done", now - 3 * DAY, None))
    # live items by required version (pending or leased), results of the last 7 days
    exp.versions = {"v1": (4, 8), "v2": (1, 1), None: (5, 0)}
    # Question 1: the newest item 60 s ago (a partition load); created within the last 48 h per kind.
    items.append(_item("daily_sales/2026-11-22", "partition_load", "done", now - 60))
    results.append(
        _result("daily_sales/2026-11-22", "load", "v1", now - 30, "daily_sales/scheduled__2026-11-22/1", {})
    )
    trans.append(
        _transition(
            "daily_sales/2026-11-22",
            "complete",
            "leased",
            "done",
            now - 30,
            "daily_sales/scheduled__2026-11-22/1",
        )
    )
    created: dict[str, int] = {}
    for it in items:
        if now - 48 * HOUR <= it["created_at"] <= now:
            created[it["kind"]] = created.get(it["kind"], 0) + 1
    exp.created_in_window = created
    exp.completed_in_window = sum(1 for t in trans if t["to_state"] == "done" and t["at"] >= now - 48 * HOUR)
    # A repeated "done" (record only) is no completion.
    trans.append(_transition("article:p1", "record_result", "done", "done", now - 100, None))
    # Question 3: 6 expiries in the last day, 7 in the week before (1 a day), 1 older than both.
    for i in range(6):
        trans.append(
            _transition(
                f"article:x{i}",
                ("expire", "reclaim_expired")[i % 2],
                "leased",
                "pending" if i % 2 == 0 else "leased",
                now - (i + 1) * 3000,
                None,
            )
        )
    for d in range(7):
        trans.append(
            _transition(f"article:y{d}", "expire", "leased", "pending", now - DAY - (d + 0.5) * DAY, None)
        )
    trans.append(_transition("article:z", "give_up_expired", "leased", "failed", now - 9 * DAY, None))
    exp.expiries_24h = 6
    exp.expiries_week_daily_mean = 1.0
    # Question 5: two outbox rows not relayed (one relayed row does not count).
    outbox = [
        _outbox("o1", "article:p1", now - 900, "pending"),
        _outbox("o2", "article:p3", now - 100, "pending"),
        _outbox("o3", "article:p0", now - 5000, "relayed"),
    ]
    exp.outbox_pending = 2
    with engine.begin() as conn:
        conn.execute(schema.results.insert(), results)
        insert_items(conn, items)
        conn.execute(schema.transitions.insert(), trans)
        conn.execute(schema.outbox.insert(), outbox)
    return exp


def _transition(
    key: str, event: str, src: str | None, dst: str | None, at: float, owner: str | None
) -> dict[str, Any]:
    return {
        "work_key": key,
        "event": event,
        "from_state": src,
        "to_state": dst,
        "actor": "worker" if owner else "reconciler",
        "owner": owner,
        "fencing_token": 1,
        "at": at,
        "reason": None,
    }


def _result(
    key: str, step: str, version: str, at: float, owner: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {
        "work_key": key,
        "step": step,
        "processing_version": version,
        "fencing_token": 1,
        "payload": json.dumps(payload),
        "committed_by": owner,
        "committed_at": at,
        "follow_ups": None,
    }


def _outbox(dedup: str, key: str, at: float, state: str) -> dict[str, Any]:
    return {
        "dedup_key": dedup,
        "work_key": key,
        "step": "write_back",
        "target_type": "dag_run",
        "target": "sheet_relay",
        "payload": "{}",
        "state": state,
        "attempts": 0,
        "created_at": at,
        "relayed_at": at + 10 if state == "relayed" else None,
    }


def seed_partitions(
    engine: sa.Engine, table: str, days: list[dt.date], *, loaded_at: dt.datetime | None = None
) -> None:
    """``load_audit`` rows for ``days`` of ``table`` (run ``scheduled__<day>``, try 1)."""
    from onceflow.sales.schema import warehouse_tables

    metadata = sa.MetaData()
    audit = warehouse_tables(metadata).audit
    metadata.create_all(engine, tables=[audit])
    loaded_at = loaded_at or dt.datetime(2026, 1, 1, 6, 0)
    with engine.begin() as conn:
        conn.execute(
            audit.insert(),
            [
                {
                    "table_name": table,
                    "partition_key": day.isoformat(),
                    "row_count": 100 + i,
                    "reject_count": 0,
                    "checksum": f"{i:064x}",
                    "run_id": f"scheduled__{day.isoformat()}T00:00:00+00:00",
                    "try_number": 1,
                    "fence_token": 1,
                    "processing_version": "v1",
                    "loaded_at_utc": loaded_at,
                }
                for i, day in enumerate(days)
            ],
        )
