"""Poison items: an item whose worker dies on it every time is given up, not retried forever.

Each crash leaves a lease that only expires; taking the item over spends an attempt. Once the
lease of the last attempt (``max_attempts``) expires, the claimer (or the reconciler) moves the
item to ``failed`` with the reason, recorded as a ``give_up_expired`` transition.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from onceflow.ledger import Ledger, create_ledger_engine, states
from onceflow.ledger.reconcile import reconcile
from onceflow.testing.ledger_processes import read_json, spawn, stop_all


def test_taking_over_the_expired_last_attempt_gives_the_item_up_with_the_reason(ledger, fake_clock):
    ledger.add("fetch", "poison:1", max_attempts=2)
    for owner in ("w1", "w2"):  # each worker crashes holding the lease
        assert ledger.claim("fetch", owner, 30, "v1") is not None
        fake_clock.advance(31)

    assert ledger.claim("fetch", "w3", 30, "v1") is None

    item = ledger.item("poison:1")
    assert (item.state, item.attempts, item.lease_expires_at) == (states.FAILED, 2, None)
    assert item.last_error_class == "LeaseExpired"
    last = ledger.history("poison:1")[-1]
    assert (last.event, last.from_state, last.to_state, last.actor, last.owner, last.fencing_token) == (
        "give_up_expired", states.LEASED, states.FAILED, states.WORKER, "w3", 2
    )  # fmt: skip
    assert "lease of w2 (token 2)" in last.reason and "attempt 2 of 2" in last.reason
    assert last.reason == item.last_error


def test_a_claim_gives_up_a_poison_item_on_its_way_and_leases_the_next_one(ledger, fake_clock):
    ledger.add("fetch", "poison:1", max_attempts=1)
    assert ledger.claim("fetch", "crasher", 30, "v1") is not None
    fake_clock.advance(31)
    ledger.add("fetch", "fine:1")  # later, so the poison item is the better candidate

    lease = ledger.claim("fetch", "w", 30, "v1")
    assert lease is not None and lease.work_key == "fine:1"
    assert ledger.item("poison:1").state == states.FAILED


def test_a_batch_claim_still_fills_up_after_giving_up_poison_items(ledger, fake_clock):
    ledger.add_many("fetch", [f"p{i}" for i in range(3)])
    for _ in range(5):  # add_many's budget is 5: five crashes each
        assert len(ledger.claim_many("fetch", "crasher", 30, "v1", limit=3)) == 3
        fake_clock.advance(31)
    ledger.add_many("fetch", [f"ok{i}" for i in range(3)])

    got = ledger.claim_many("fetch", "w", 30, "v1", limit=3)
    assert sorted(lease.work_key for lease in got) == ["ok0", "ok1", "ok2"]
    assert ledger.counts("fetch") == {states.FAILED: 3, states.LEASED: 3}


def test_the_reconciler_gives_up_an_expired_last_attempt_instead_of_retrying_it(ledger, fake_clock):
    ledger.add("fetch", "poison:1", max_attempts=1)
    ledger.add("fetch", "retry:1", max_attempts=2)
    assert ledger.claim("fetch", "crasher", 30, "v1") is not None
    assert ledger.claim("fetch", "crasher", 30, "v1") is not None
    fake_clock.advance(31)

    report = reconcile(ledger)

    assert report.count("expired_lease", repaired=True) == 2
    assert ledger.item("poison:1").state == states.FAILED
    assert ledger.item("retry:1").state == states.PENDING
    events = {key: ledger.history(key)[-1] for key in ("poison:1", "retry:1")}
    assert (events["poison:1"].event, events["poison:1"].actor) == ("give_up_expired", states.RECONCILER)
    assert "attempt 1 of 1" in events["poison:1"].reason
    assert events["retry:1"].event == "expire"


@pytest.fixture
def procs():
    started: list[subprocess.Popen[str]] = []
    yield started
    stop_all(started)


def test_a_worker_process_killed_on_every_attempt_ends_in_failed_not_in_a_loop(ledger_url, procs):
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)  # the database's clock, as the worker processes use
    ledger.add("work", "poison:1", max_attempts=3)
    try:
        for attempt in (1, 2, 3):
            worker = spawn(
                "hold", ledger_url, "--owner", f"crash{attempt}", "--lease-seconds", "0.5", stdin=True
            )
            procs.append(worker)
            assert read_json(worker) == {"claimed": "poison:1", "token": attempt}
            os.kill(worker.pid, signal.SIGKILL)  # dies on the item, holding its lease
            worker.wait(timeout=60)
            wait_until_expired(ledger, "poison:1")

        rescuer = spawn("drain", ledger_url, "--owner", "next")
        procs.append(rescuer)
        report = read_json(rescuer)
        assert rescuer.wait(timeout=120) == 0
        assert report["committed"] == [] and report["errors"] == {}

        item = ledger.item("poison:1")
        assert (item.state, item.attempts, item.fencing_token) == (states.FAILED, 3, 3)
        assert [t.event for t in ledger.history("poison:1")] == [
            "create", "claim", "reclaim_expired", "reclaim_expired", "give_up_expired"
        ]  # fmt: skip
    finally:
        engine.dispose()


def wait_until_expired(ledger: Ledger, work_key: str) -> None:
    """Wait (by the database's clock) until the item's lease has expired."""
    expires = ledger.item(work_key).lease_expires_at
    assert expires is not None
    while ledger.clock.now() <= expires:
        time.sleep(0.05)
