"""The six answers against an independent computation, over generated ledgers, on SQLite and
PostgreSQL.

Each example writes a ledger (items in every live and finished state, NULL and several required
versions, leases that ran out while the item is still ``leased``, times on the window and bucket
edges, publishes with and without their write-back, sometimes more than the 50 examples question
5 lists) inside a transaction, asks :mod:`onceflow.opsview.questions`, and recomputes every figure
in plain Python from the rows read back with ``SELECT *``; then rolls back. The reference is
written from the questions' definitions (docs/operations-view.md and, for "eligible", the claim's
WHERE in ``ledger/sql/claims.sql``), not from the view's queries.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceflow.opsview import questions as q
from onceflow.testing.ops_view_state import create_ledger, insert_items

HOUR, DAY = q.HOUR, q.DAY
NOW = 1_764_000_000.0
# Seconds before now that sit on an edge of some window or bucket (negative: in the future).
EDGES = (0, 0.5, 1, 59.5, 60, 300, 899.5, 900, HOUR - 0.5, HOUR, 6 * HOUR, DAY, DAY + 1, 47 * HOUR,
         48 * HOUR - 0.5, 48 * HOUR, 48 * HOUR + 1, 7 * DAY, 7 * DAY + 1, 8 * DAY, 8 * DAY + 1, -1, -HOUR)  # fmt: skip
AGO = st.one_of(st.sampled_from(EDGES), st.integers(-2 * int(HOUR), 9 * int(DAY)).map(float))
KINDS = ("article", "partition_load", "fetch")
VERSIONS = (None, "v1", "v2")
EXPIRY_OR_NOT = (*q.EXPIRY_EVENTS, "complete", "record_result", "claim", "retry")

item_st = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(KINDS),
        "lane": st.sampled_from(("new", "recheck")),
        "priority": st.sampled_from((0, 5)),
        "required_version": st.sampled_from(VERSIONS),
        "state": st.sampled_from(
            ("pending", "pending", "leased", "leased", "done", "failed", "needs_correction")
        ),
        "created": AGO,
        "available": AGO,
        "updated": AGO,
        "lease_expires": AGO,  # leased only: in the past is a lease that ran out, still 'leased'
        "attempts": st.integers(0, 5),
        "last_error_class": st.sampled_from((None, None, "Timeout", "HTTP")),
    }
)
result_st = st.tuples(
    st.integers(0, 30),  # item index (past the items: a result of a key with no item)
    st.sampled_from(("publish", "publish", "write_back", "translate")),
    st.sampled_from(("v1", "v2", "v3")),
    AGO,
)
transition_st = st.tuples(
    st.sampled_from(EXPIRY_OR_NOT),
    st.sampled_from((None, "pending", "leased", "done")),
    st.sampled_from((None, "pending", "leased", "done", "failed")),
    AGO,
)
outbox_st = st.tuples(st.sampled_from(("dag_run", "sheet_row")), st.sampled_from(("pending", "relayed")), AGO)
ledger_st = st.fixed_dictionaries(
    {
        "now": st.sampled_from((NOW, NOW + 0.375)),
        "items": st.lists(item_st, max_size=20),
        "results": st.lists(result_st, max_size=20),
        "transitions": st.lists(transition_st, max_size=15),
        "outbox": st.lists(outbox_st, max_size=5),
        # publishes without a write-back beyond question 5's 50 examples, many at one instant (ties)
        "bulk_missing": st.sampled_from((0, 0, 49, 50, 51, 57)),
        "bulk_ago": st.sampled_from((400.0, DAY, 7 * DAY)),
    }
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('opsprop') / 'ledger.db'}"
    else:
        url = request.getfixturevalue("onceflow_postgres_url_factory")("opsprop")
    engine = sa.create_engine(url)
    create_ledger(engine)
    yield engine
    engine.dispose()


def _write(conn: sa.Connection, spec: dict[str, Any]) -> None:
    from onceflow.ledger import schema

    now = spec["now"]
    items = []
    for i, it in enumerate(spec["items"]):
        items.append(
            {
                "work_key": f"k{i}",
                "kind": it["kind"],
                "state": it["state"],
                "priority": it["priority"],
                "available_at": now - it["available"],
                "fencing_token": 0,
                "attempts": it["attempts"],
                "max_attempts": 5,
                "created_at": now - it["created"],
                "updated_at": now - it["updated"],
                "lane": it["lane"],
                "required_version": it["required_version"],
                "payload": None,
                "last_error_class": it["last_error_class"],
                "last_error": None,
                "reason": None,
                "lease_owner": "dag/run/1/task" if it["state"] == "leased" else None,
                "lease_expires_at": now - it["lease_expires"] if it["state"] == "leased" else None,
                "recheck_id": None,
            }
        )
    results: dict[tuple[str, str, str], dict[str, Any]] = {}

    def result(key: str, step: str, version: str, at: float) -> None:
        results[(key, step, version)] = {
            "work_key": key,
            "step": step,
            "processing_version": version,
            "fencing_token": 1,
            "payload": "{}",
            "committed_by": f"article_pipeline/sheet__{key}/1/{step}",
            "committed_at": at,
            "follow_ups": None,
        }

    for index, step, version, ago in spec["results"]:
        result(f"k{index}", step, version, now - ago)
    for row in items:  # the database refuses a done item without a result
        if row["state"] == "done" and not any(k == row["work_key"] for k, _, _ in results):
            result(row["work_key"], "fetch", "v1", row["created_at"])
    for n in range(spec["bulk_missing"]):
        result(f"bulk{n}", "publish", "v1", now - spec["bulk_ago"] - (n % 3))
    if results:
        conn.execute(schema.results.insert(), list(results.values()))
    if items:
        insert_items(conn, items)
    transitions = [
        {"work_key": f"t{i}", "event": event, "from_state": src, "to_state": dst, "actor": "worker",
         "owner": None, "fencing_token": 1, "at": now - ago, "reason": None}
        for i, (event, src, dst, ago) in enumerate(spec["transitions"])
    ]  # fmt: skip
    if transitions:
        conn.execute(schema.transitions.insert(), transitions)
    outbox = [
        {"dedup_key": f"o{i}", "work_key": f"k{i}", "step": "write_back", "target_type": target,
         "target": "x", "payload": "{}", "state": state, "attempts": 0, "created_at": now - ago,
         "relayed_at": None}
        for i, (target, state, ago) in enumerate(spec["outbox"])
    ]  # fmt: skip
    if outbox:
        conn.execute(schema.outbox.insert(), outbox)


def _rows(conn: sa.Connection, table: str) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sa.text(f"SELECT * FROM {table}")).mappings()]


def _hour(at: float, since: float, hours: int) -> int:
    """The hour bucket of ``at`` (``since <= at <= now``): ``now`` itself is in the last hour."""
    return min(math.floor((at - since) / HOUR), hours - 1)


def _discovery(items: list[dict[str, Any]], trans: list[dict[str, Any]], now: float) -> dict[str, Any]:
    hours = 48
    since = now - hours * HOUR
    created: dict[str, list[int]] = defaultdict(lambda: [0] * hours)
    last: dict[str, float] = {}
    for it in items:
        last[it["kind"]] = max(last.get(it["kind"], -math.inf), it["created_at"])
        if since <= it["created_at"] <= now:
            created[it["kind"]][_hour(it["created_at"], since, hours)] += 1
    completed = [0] * hours
    for t in trans:
        if t["to_state"] == "done" and t["from_state"] != "done" and since <= t["at"] <= now:
            completed[_hour(t["at"], since, hours)] += 1
    kinds = sorted(set(created) | set(last))
    return {
        "kinds": [
            {
                "kind": k,
                "created_per_hour": created[k] if k in created else [0] * hours,
                "created_last_hour": created[k][-1] if k in created else 0,
                "created_in_window": sum(created[k]) if k in created else 0,
                "last_created_at": last.get(k),
                "seconds_since_last": max(0.0, now - last[k]) if k in last else None,
            }
            for k in kinds
        ],
        "created_per_hour": [sum(c[i] for c in created.values()) for i in range(hours)],
        "completed_per_hour": completed,
        "completed_in_window": sum(completed),
        "seconds_since_last_discovery": max(0.0, now - max(last.values())) if last else None,
    }


def _eligible_since(it: dict[str, Any], now: float) -> float | None:
    """When the item became claimable, if a claim may take it now (claims.sql's WHERE, whatever
    the worker's version): pending and available, or leased with its lease run out."""
    if it["state"] == "pending" and it["available_at"] <= now:
        return float(it["available_at"])
    if it["state"] == "leased" and it["lease_expires_at"] <= now:
        return float(it["lease_expires_at"])
    return None


def _oldest_eligible(items: list[dict[str, Any]], now: float) -> dict[str, Any]:
    groups: dict[tuple[Any, ...], list[Any]] = {}
    histogram = [0] * len(q.AGE_BUCKETS)
    for it in items:
        since = _eligible_since(it, now)
        if since is None:
            continue
        key = (it["kind"], it["lane"], it["priority"], it["required_version"])
        g = groups.setdefault(key, [0, math.inf, math.inf])
        g[0] += 1
        g[1] = min(g[1], it["created_at"])
        g[2] = min(g[2], since)
        age = now - it["created_at"]
        histogram[next((i for i, (_, upper) in enumerate(q.AGE_BUCKETS) if age < upper), -1)] += 1
    by_group = {
        key: (n, max(0.0, now - oldest), max(0.0, now - waiting))
        for key, (n, oldest, waiting) in groups.items()
    }
    return {
        "groups": by_group,
        "eligible_items": sum(n for n, _, _ in by_group.values()),
        "oldest_age_s": max((age for _, age, _ in by_group.values()), default=None),
        "histogram": [{"bucket": label, "items": histogram[i]} for i, (label, _) in enumerate(q.AGE_BUCKETS)],
    }


def _lease_expiries(trans: list[dict[str, Any]], now: float) -> dict[str, Any]:
    expiries = [t for t in trans if t["event"] in q.EXPIRY_EVENTS]
    last_day = [t for t in expiries if now - DAY <= t["at"] <= now]
    week = sum(1 for t in expiries if now - 8 * DAY <= t["at"] < now - DAY)
    per_hour = [0] * 48
    for t in expiries:
        if now - 48 * HOUR <= t["at"] <= now:
            per_hour[_hour(t["at"], now - 48 * HOUR, 48)] += 1
    mean = week / 7.0
    ratio = None if mean == 0 else len(last_day) / mean
    return {
        "last_24h": len(last_day),
        "trailing_week_daily_mean": mean,
        "ratio": ratio,
        "unusual": len(last_day) >= q.MIN_UNUSUAL and (ratio is None or ratio >= q.UNUSUAL_RATIO),
        "by_event_24h": dict(Counter(t["event"] for t in last_day)),
        "per_hour": per_hour,
    }


def _error_classes(items: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for it in items:
        if it["last_error_class"] is None or it["updated_at"] < now - 7 * DAY:
            continue
        c = found.setdefault(
            (it["kind"], it["last_error_class"]),
            {"kind": it["kind"], "error_class": it["last_error_class"], "items": 0, "attempts": 0,
             "retrying": 0, "failed": 0},
        )  # fmt: skip
        c["items"] += 1
        c["attempts"] += it["attempts"]
        c["retrying"] += it["state"] in ("pending", "leased")
        c["failed"] += it["state"] == "failed"
    return sorted(found.values(), key=lambda c: (-c["attempts"], c["kind"], c["error_class"]))


def _follow_ups(results: list[dict[str, Any]], outbox: list[dict[str, Any]], now: float) -> dict[str, Any]:
    pending: dict[str, list[float]] = defaultdict(list)
    for o in outbox:
        if o["state"] == "pending":
            pending[o["target_type"]].append(o["created_at"])
    written = {(r["work_key"], r["processing_version"]) for r in results if r["step"] == "write_back"}
    missing = [
        r
        for r in results
        if r["step"] == "publish"
        and now - 7 * DAY <= r["committed_at"] <= now - q.WRITE_BACK_SETTLE_S
        and (r["work_key"], r["processing_version"]) not in written
    ]
    return {
        "outbox": {t: (len(v), max(0.0, now - min(v))) for t, v in pending.items()},
        "missing": missing,
    }


def _active_versions(
    items: list[dict[str, Any]], results: list[dict[str, Any]], now: float
) -> dict[Any, Any]:
    found: dict[Any, dict[str, Any]] = {}

    def entry(version: str | None) -> dict[str, Any]:
        return found.setdefault(
            version, {"live_items": 0, "live_by_kind": Counter(), "results": 0, "last": None}
        )

    for it in items:
        if it["state"] in ("pending", "leased"):
            e = entry(it["required_version"])
            e["live_items"] += 1
            e["live_by_kind"][it["kind"]] += 1
    for r in results:
        if now - 7 * DAY <= r["committed_at"] <= now:
            e = entry(r["processing_version"])
            e["results"] += 1
            e["last"] = max(e["last"] or -math.inf, r["committed_at"])
    return {v: (e["live_items"], dict(e["live_by_kind"]), e["results"], e["last"]) for v, e in found.items()}


def check_answers(conn: sa.Connection, now: float) -> None:
    """Every figure of the six answers equals the reference computed from the rows."""
    items, trans = _rows(conn, "work_items"), _rows(conn, "transitions")
    results, outbox = _rows(conn, "results"), _rows(conn, "outbox")
    doc = q.all_questions(conn, now)

    disc, want = doc["discovery"], _discovery(items, trans, now)
    assert {k: disc[k] for k in want} == want

    old, want = doc["oldest_eligible"], _oldest_eligible(items, now)
    got_groups = {
        (g["kind"], g["lane"], g["priority"], g["version"]): (
            g["items"],
            g["oldest_age_s"],
            g["longest_wait_s"],
        )
        for g in old["groups"]
    }
    assert len(got_groups) == len(old["groups"])  # one row per group
    assert got_groups == want["groups"]
    assert [g["oldest_age_s"] for g in old["groups"]] == sorted((g["oldest_age_s"] for g in old["groups"]), reverse=True)  # fmt: skip
    assert (old["eligible_items"], old["oldest_age_s"], old["histogram"]) == (
        want["eligible_items"],
        want["oldest_age_s"],
        want["histogram"],
    )

    exp, want = doc["lease_expiries"], _lease_expiries(trans, now)
    assert {k: exp[k] for k in want} == want

    assert doc["error_classes"]["classes"] == _error_classes(items, now)

    fu, want = doc["follow_ups"], _follow_ups(results, outbox, now)
    assert {o["target_type"]: (o["rows"], o["oldest_age_s"]) for o in fu["outbox_pending"]} == want["outbox"]
    assert fu["outbox_pending_rows"] == sum(n for n, _ in want["outbox"].values())
    missing = want["missing"]
    assert fu["published_not_written_back"] == len(missing)
    # the first 50 by publish time (ties: any of them), each one really missing, none twice
    examples = fu["examples"]
    assert len(examples) == min(50, len(missing))
    assert [e["published_at"] for e in examples] == sorted(r["committed_at"] for r in missing)[
        : len(examples)
    ]
    assert len({(e["work_key"], e["processing_version"]) for e in examples}) == len(examples)
    by_key = {(r["work_key"], r["processing_version"]): r for r in missing}
    for e in examples:
        r = by_key[(e["work_key"], e["processing_version"])]
        assert (e["published_at"], e["owner"]) == (r["committed_at"], r["committed_by"])

    versions = doc["active_versions"]["versions"]
    got = {
        v["version"]: (v["live_items"], v["live_by_kind"], v["results"], v["last_commit_at"])
        for v in versions
    }
    assert got == _active_versions(items, results, now)
    assert versions == sorted(versions, key=lambda v: (-(v["last_commit_at"] or 0), str(v["version"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=ledger_st)
def test_the_six_answers_equal_an_independent_computation(engine: sa.Engine, spec: dict[str, Any]) -> None:
    checked(engine, spec)


def checked(engine: sa.Engine, spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``spec``'s ledger, check every answer against the reference, return the answers; the
    ledger is rolled back (the next example starts empty; transitions refuse DELETE)."""
    with engine.connect() as conn:
        tx = conn.begin()
        try:
            _write(conn, spec)
            check_answers(conn, spec["now"])
            return q.all_questions(conn, spec["now"])
        finally:
            tx.rollback()


def test_a_lease_that_ran_out_is_eligible_and_live(engine: sa.Engine) -> None:
    """A worker died holding the only item: it is still 'leased' but any claim may take it now, so
    question 2 counts it (waiting since its lease ran out) and question 6 counts it live."""
    item = {"kind": "article", "lane": "new", "priority": 0, "required_version": "v2", "state": "leased",
            "created": 2 * HOUR, "available": 2 * HOUR, "updated": HOUR, "lease_expires": 1800.0,
            "attempts": 1, "last_error_class": None}  # fmt: skip
    spec = {"now": NOW, "items": [item], "results": [], "transitions": [], "outbox": [], "bulk_missing": 0}
    doc = checked(engine, spec)
    assert doc["oldest_eligible"]["eligible_items"] == 1
    assert [(g["oldest_age_s"], g["longest_wait_s"]) for g in doc["oldest_eligible"]["groups"]] == [
        (2 * HOUR, 1800.0)
    ]
    assert doc["active_versions"]["versions"][0]["live_items"] == 1


def test_an_item_created_at_now_is_in_the_last_hour(engine: sa.Engine) -> None:
    """The hour series' last bucket ends at ``now`` inclusive, as the window does: a discovery, a
    completion or an expiry at ``now`` itself is counted in the series as in the window's total."""
    item = {"kind": "fetch", "lane": "new", "priority": 0, "required_version": None, "state": "pending",
            "created": 0.0, "available": 0.0, "updated": 0.0, "lease_expires": 0.0, "attempts": 0,
            "last_error_class": None}  # fmt: skip
    spec = {"now": NOW, "items": [item], "results": [], "outbox": [], "bulk_missing": 0,
            "transitions": [("complete", "leased", "done", 0.0), ("expire", "leased", "pending", 0.0)]}  # fmt: skip
    doc = checked(engine, spec)
    disc = doc["discovery"]
    assert disc["created_per_hour"][-1] == disc["kinds"][0]["created_last_hour"] == 1
    assert disc["completed_per_hour"][-1] == 1
    assert doc["lease_expiries"]["per_hour"][-1] == 1
