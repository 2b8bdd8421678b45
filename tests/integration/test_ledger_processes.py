"""Real processes against the ledger: racing claimers, a frozen worker, SIGTERM shutdown.

Every worker is a separate Python process (``onceflow.testing.ledger_processes``), so the races
are real and SIGSTOP/SIGTERM really freeze and stop them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.testing.ledger_processes import read_json, spawn, stop_all


@pytest.fixture
def procs():
    started: list[subprocess.Popen[str]] = []
    yield started
    stop_all(started)


def test_sixteen_processes_process_every_item_exactly_once_without_deadlocks(ledger_url, procs):
    """5,000 items on PostgreSQL and 2,500 on SQLite (one writer at a time) in ``make test``, to
    keep the suite inside its budget; 10,000 on both in the slow suite (below). Either way the
    processes' clocks are skewed from -90 s to +90 s: the database's clock decides the leases."""
    drain_with_sixteen_processes(ledger_url, procs, 2_500 if ledger_url.startswith("sqlite") else 5_000)


@pytest.mark.slow
def test_sixteen_processes_process_ten_thousand_items(ledger_url, procs):
    drain_with_sixteen_processes(ledger_url, procs, 10_000)


def drain_with_sixteen_processes(ledger_url: str, procs: list, items: int) -> None:
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    ledger.add_many("work", [f"item:{i:05d}" for i in range(items)], batch=2000)
    engine.dispose()

    # Clocks from 90 s behind to 90 s ahead (a lease is 60 s: with worker clocks deciding, the
    # ones ahead would take over fresh leases and the ones behind would write expired ones); every
    # other process leases a batch of 8 per claim.
    procs += [
        spawn("drain", ledger_url, "--owner", f"w{n}", "--clock-skew", f"{-90 + 12 * n}",
              "--batch", "8" if n % 2 else "1")
        for n in range(16)
    ]  # fmt: skip
    reports = [read_json(p) for p in procs]
    assert [p.wait(timeout=600) for p in procs] == [0] * 16

    committed = Counter(key for r in reports for key in r["committed"])
    assert len(committed) == items and set(committed.values()) == {1}
    assert [r["errors"] for r in reports] == [{}] * 16  # no deadlocks, no lock timeouts, nothing
    assert sum(r["refused"] for r in reports) == 0
    assert sum(1 for r in reports if r["committed"]) > 1  # the work really was shared

    engine = create_ledger_engine(ledger_url)
    with engine.connect() as conn:
        per_item = conn.execute(
            sa.text(
                "SELECT work_key, SUM(CASE WHEN event = 'claim' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN event = 'complete' THEN 1 ELSE 0 END) FROM transitions GROUP BY work_key"
            )
        ).all()
        results = conn.execute(sa.text("SELECT COUNT(*), COUNT(DISTINCT work_key) FROM results")).one()
        states = dict(conn.execute(sa.text("SELECT state, COUNT(*) FROM work_items GROUP BY state")).all())
    engine.dispose()
    assert {(claims, completes) for _, claims, completes in per_item} == {(1, 1)}
    assert tuple(results) == (items, items)
    assert states == {"done": items}


def wait_until_expired(ledger_url: str, work_key: str) -> None:
    engine = create_ledger_engine(ledger_url)
    try:
        with engine.connect() as conn:
            expires = conn.execute(
                sa.text("SELECT lease_expires_at FROM work_items WHERE work_key = :k"), {"k": work_key}
            ).scalar_one()
    finally:
        engine.dispose()
    while time.time() <= expires:
        time.sleep(0.05)


def test_a_worker_frozen_past_its_lease_has_its_late_commit_refused_and_recorded(ledger_url, procs):
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    ledger.add("work", "frozen:1")

    frozen = spawn("hold", ledger_url, "--owner", "frozen", "--lease-seconds", "1", stdin=True)
    procs.append(frozen)
    claimed = read_json(frozen)
    assert claimed == {"claimed": "frozen:1", "token": 1}
    os.kill(frozen.pid, signal.SIGSTOP)
    wait_until_expired(ledger_url, "frozen:1")

    rescuer = spawn("drain", ledger_url, "--owner", "rescuer")
    procs.append(rescuer)
    assert read_json(rescuer)["committed"] == ["frozen:1"]

    os.kill(frozen.pid, signal.SIGCONT)
    frozen.stdin.write("go\n")
    frozen.stdin.flush()
    assert read_json(frozen) == {"committed": False, "error": "StaleFenceError", "current_token": 2}
    assert frozen.wait(timeout=60) == 0

    results = ledger.results("frozen:1")
    assert [(r.fencing_token, r.committed_by.startswith("rescuer")) for r in results] == [(2, True)]
    events = [
        (t.event, t.owner.split("-")[0] if t.owner else None, t.fencing_token)
        for t in ledger.history("frozen:1")
    ]
    assert events == [
        ("create", None, 0),
        ("claim", "frozen", 1),
        ("reclaim_expired", "rescuer", 2),
        ("complete", "rescuer", 2),
        ("commit_refused", "frozen", 1),
    ]
    engine.dispose()


@pytest.mark.parametrize(
    ("on_term", "event", "reason"),
    [("finish", "complete", "finished during shutdown"), ("release", "release", "shutdown")],
)
def test_sigterm_stops_claiming_and_records_whether_the_lease_was_finished_or_released(
    ledger_url, procs, on_term, event, reason
):
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    ledger.add_many("work", ["s:1", "s:2", "s:3"])

    worker = spawn("shutdown", ledger_url, "--owner", "w", "--on-term", on_term)
    procs.append(worker)
    assert read_json(worker) == {"working": "s:1"}
    os.kill(worker.pid, signal.SIGTERM)
    report = read_json(worker)
    assert worker.wait(timeout=60) == 0

    assert report["stopped_by_shutdown"] is True
    last = ledger.history("s:1")[-1]
    assert (last.event, last.reason) == (event, reason)
    assert ledger.item("s:1").state == ("done" if on_term == "finish" else "pending")
    # No new work was taken after the signal.
    assert [t.event for t in ledger.history("s:2")] == ["create"]
    assert [t.event for t in ledger.history("s:3")] == ["create"]
    engine.dispose()
