"""Whose clock decides a lease: the database's, never a worker's.

The workers are real processes (``onceflow.testing.ledger_processes``) whose wall clock is skewed
by minutes (``--clock-skew``: ``time.time()`` of that process runs ahead or behind; moving the
machine's real clock needs root and would move the database's clock with it). The ledger in those
processes runs with its default clock, as in production.
"""

from __future__ import annotations

import subprocess
import time

import pytest
import sqlalchemy as sa

from onceflow.ledger import LeaseHeld, Ledger, create_ledger_engine
from onceflow.ledger.clock import DatabaseClock
from onceflow.ledger.reconcile import reconcile
from onceflow.testing.ledger_processes import read_json, spawn, stop_all

MINUTES = 180.0


@pytest.fixture
def procs():
    started: list[subprocess.Popen[str]] = []
    yield started
    stop_all(started)


@pytest.fixture
def db_ledger(ledger_url):
    """A ledger on the test database with the default (database) clock."""
    engine = create_ledger_engine(ledger_url)
    yield Ledger(engine)
    engine.dispose()


def lease_row(ledger: Ledger, work_key: str) -> tuple[str, int, float | None]:
    with ledger.engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT lease_owner, fencing_token, lease_expires_at FROM work_items WHERE work_key = :k"
            ),
            {"k": work_key},
        ).one()
    return row[0], row[1], row[2]


def test_a_worker_whose_clock_runs_minutes_ahead_does_not_take_over_a_fresh_lease(
    db_ledger, ledger_url, procs
):
    db_ledger.add("work", "fresh:1")
    holder = spawn("hold", ledger_url, "--owner", "holder", "--lease-seconds", "60", stdin=True)
    procs.append(holder)
    assert read_json(holder) == {"claimed": "fresh:1", "token": 1}

    ahead = spawn("drain", ledger_url, "--owner", "ahead", "--clock-skew", str(MINUTES))
    procs.append(ahead)
    report = read_json(ahead)
    assert ahead.wait(timeout=120) == 0
    assert report["committed"] == [] and report["errors"] == {}  # the lease is 60 s old at most
    assert lease_row(db_ledger, "fresh:1")[:2] == ("holder", 1)

    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert read_json(holder) == {"committed": True}
    assert [t.event for t in db_ledger.history("fresh:1")] == ["create", "claim", "complete"]


def test_a_worker_whose_clock_runs_minutes_behind_writes_a_lease_of_full_length(db_ledger, ledger_url, procs):
    db_ledger.add("work", "behind:1")
    behind = spawn("hold", ledger_url, "--owner", "behind", "--lease-seconds", "60",
                   "--clock-skew", str(-MINUTES), stdin=True)  # fmt: skip
    procs.append(behind)
    assert read_json(behind) == {"claimed": "behind:1", "token": 1}  # available now, by the DB's clock

    _, _, expires = lease_row(db_ledger, "behind:1")
    remaining = expires - DatabaseClock(db_ledger.engine).now()
    assert 0 < remaining <= 60  # not already expired, as a lease counted from the worker's clock was

    rival = spawn("drain", ledger_url, "--owner", "rival")
    procs.append(rival)
    assert read_json(rival)["committed"] == []
    behind.stdin.write("go\n")
    behind.stdin.flush()
    assert read_json(behind) == {"committed": True}
    assert [t.event for t in db_ledger.history("behind:1")] == ["create", "claim", "complete"]


def test_a_heartbeat_counts_from_the_database_clock(db_ledger, monkeypatch):
    db_ledger.add("work", "hb:1")
    lease = db_ledger.claim("work", "w", 60, "v1")
    assert lease is not None
    monkeypatch.setattr(time, "time", lambda real=time.time: real() - MINUTES)  # this process runs behind
    lease.heartbeat()
    remaining = lease.expires_at - DatabaseClock(db_ledger.engine).now()
    assert 50 < remaining <= 60


def test_a_reconciler_whose_clock_runs_minutes_ahead_expires_no_live_lease(db_ledger, monkeypatch):
    db_ledger.add("work", "live:1")
    assert db_ledger.claim("work", "w", 60, "v1") is not None
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + MINUTES)  # this process runs ahead
    report = reconcile(db_ledger)
    assert report.findings == []
    assert db_ledger.item("live:1").state == "leased"


def test_the_database_clock_is_the_servers_not_this_processs(db_ledger, monkeypatch):
    clock = DatabaseClock(db_ledger.engine)
    before = clock.now()
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + MINUTES)
    assert abs(clock.now() - before) < 30


def test_a_task_whose_clock_runs_minutes_ahead_does_not_take_over_a_live_keyed_lease(db_ledger, monkeypatch):
    """``lease_key`` (an Airflow task leasing its own partition or step) judges by the database too."""
    held = db_ledger.lease_key("load", "day:1", "run-1", 60, "v1", reopen_reason="rerun")
    monkeypatch.setattr(time, "time", lambda real=time.time: real() + MINUTES)  # this process runs ahead
    with pytest.raises(LeaseHeld):
        db_ledger.lease_key("load", "day:1", "run-2", 60, "v1", reopen_reason="rerun")
    assert lease_row(db_ledger, "day:1")[:2] == ("run-1", held.token)
