"""A keyed step that gets SIGTERM hands its lease back at once (real processes, both databases).

A child process runs :func:`~onceflow.ledger.steps.run_keyed_step` with
``GracefulShutdown().installed()`` (what an Airflow task's ``on_kill`` does, without Airflow) and
a step that waits for the test. The test waits until the item is leased, sends SIGTERM, and reads
the ledger: the lease is released while the step is still running, and the step, once it
returns, commits nothing. The same step given no shutdown flag keeps its lease (control case).
The Airflow versions, under the real scheduler, are in
``tests/acceptance/test_task_sigterm_cluster.py``.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from typing import TYPE_CHECKING

from onceflow.ledger import Ledger, create_ledger_engine
from onceflow.ledger.steps import HANDED_BACK

if TYPE_CHECKING:
    from pathlib import Path

KEY = "article:stopped"

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from onceflow.ledger import Ledger, create_ledger_engine
    from onceflow.ledger.steps import run_keyed_step
    from onceflow.ledger.worker import ShutdownRequested
    from onceflow.shutdown import GracefulShutdown

    url, go, flag = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "flag"

    def work(lease):
        print("working", flush=True)
        if len(sys.argv) > 4:  # blocked in C: SQLite's busy wait for a lock the test holds
            import sqlite3
            sqlite3.connect(sys.argv[4], timeout=120).execute("BEGIN IMMEDIATE")
        while not go.exists():  # the step is busy until the test says go
            time.sleep(0.05)
        return {"done": True}

    stop = GracefulShutdown()
    ledger = Ledger(create_ledger_engine(url))
    with stop.installed():
        try:
            run_keyed_step(ledger, kind="article", work_key="article:stopped", step="read", owner="child/1",
                           worker_version="v1", work=work, lease_seconds=300,
                           shutdown=stop if flag else None)
            print("committed", flush=True)
        except ShutdownRequested as exc:
            print("handed back:", exc, flush=True)
    """
)


def start_child(url: str, go: Path, flag: bool, blocker: Path | None = None) -> subprocess.Popen[str]:
    extra = [str(blocker)] if blocker else []
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(go), "flag" if flag else "none", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "working", child.stderr.read() if child.stderr else ""
    return child


def wait_for(predicate: object, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_sigterm_during_a_keyed_step_releases_its_lease_before_the_step_returns(
    ledger_url: str, tmp_path: Path
) -> None:
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    go = tmp_path / "go"
    try:
        child = start_child(ledger_url, go, flag=True)
        expires_at = ledger.item(KEY).lease_expires_at
        assert ledger.item(KEY).state == "leased"
        os.kill(child.pid, signal.SIGTERM)
        assert wait_for(lambda: ledger.item(KEY).state == "pending"), "the lease was not handed back"
        assert child.poll() is None, "handed back while the step was still running"
        go.touch()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.startswith("handed back:") and "nothing was committed" in out
        item = ledger.item(KEY)
        assert (item.state, item.lease_expires_at, item.fencing_token, item.attempts) == (
            "pending",
            None,
            1,
            0,
        )
        claim, release = ledger.history(KEY)[-2:]
        assert (claim.event, release.event, release.actor, release.reason) == (
            "claim",
            "release",
            "worker",
            HANDED_BACK,
        )
        assert release.at < (expires_at or 0), "released by the stopped step, not by expiry"
        assert ledger.results(KEY) == [], "a stopped step commits nothing"
    finally:
        engine.dispose()


def test_a_step_blocked_in_a_database_call_hands_its_lease_back_before_the_call_returns(
    ledger_url: str, tmp_path: Path
) -> None:
    """Python would run the SIGTERM handler only after the blocked C call (a warehouse write
    waiting for a lock); the wakeup-fd watch hands the lease back while it still waits."""
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    locked = tmp_path / "warehouse.db"
    holder = sqlite3.connect(locked, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        child = start_child(ledger_url, tmp_path / "go", flag=True, blocker=locked)
        time.sleep(0.5)  # let it reach the lock wait (earlier is fine too: then it is in Python)
        os.kill(child.pid, signal.SIGTERM)
        assert wait_for(lambda: ledger.item(KEY).state == "pending"), "not handed back while blocked"
        assert child.poll() is None, "the blocked call had not returned yet"
        assert ledger.history(KEY)[-1].reason == HANDED_BACK
        holder.rollback()
        (tmp_path / "go").touch()
        out, err = child.communicate(timeout=60)
        assert out.startswith("handed back:"), err
        assert ledger.results(KEY) == []
    finally:
        holder.close()
        engine.dispose()


def test_without_a_shutdown_flag_the_lease_stays_until_it_expires(ledger_url: str, tmp_path: Path) -> None:
    """The control case: what every keyed step did before the hand-back."""
    engine = create_ledger_engine(ledger_url)
    ledger = Ledger(engine)
    go = tmp_path / "go"
    try:
        child = start_child(ledger_url, go, flag=False)
        os.kill(child.pid, signal.SIGTERM)  # the child's handler only sets its flag, nobody asked
        time.sleep(2)
        assert ledger.item(KEY).state == "leased"
        go.touch()
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0 and out.strip() == "committed", err
        assert ledger.item(KEY).state == "done"
    finally:
        engine.dispose()
