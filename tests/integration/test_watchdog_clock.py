"""Whose clock judges: the ledger database's, not the watchdog host's (as the ledger's leases).

Two replicas on hosts whose clocks disagree must reach the same verdict and respect each other's
alert leases; a host clock an hour ahead must not call a fresh heartbeat dead. The host's clock
cannot be changed here, so the watchdog process runs with ``time.time`` shifted before anything
is imported (a stand-in for a skewed host, said so); the database clock stays the real one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

from onceflow.ledger.db import create_ledger_engine
from onceflow.watchdog.local import demo_config
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from pathlib import Path

SKEWED_ONCE = """
import sys, time
real = time.time
time.time = lambda: real() + {skew}  # this host's clock runs {skew} s off
from onceflow.watchdog.__main__ import main
sys.exit(main(["--config", sys.argv[1], "--once"]))
"""


def test_a_skewed_host_clock_does_not_call_a_fresh_beat_dead(tmp_path: Path) -> None:
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = demo_config(tmp_path / "home", ledger, 9)
    config.write_text(config.read_text().split("[checks.article_queue]")[0])  # the heartbeat only
    engine = create_ledger_engine(ledger)
    ensure_schema(engine, [heartbeats])
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id="fresh",
                dag_id="heartbeat",
                scheduled_at=now,
                started_at=now,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()
    for skew in (3600, -3600):
        once = subprocess.run(
            [sys.executable, "-c", SKEWED_ONCE.format(skew=skew), str(config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (once.returncode, once.stdout) == (0, "heartbeat: up\n"), (skew, once.stdout, once.stderr)


def test_a_ledger_clock_read_that_fails_makes_the_pass_blind_not_judged_by_the_host_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's clock read fails once (a connection cut as the pass starts, the store back a
    moment later) on a host whose clock runs an hour ahead. The pass used to go on with this
    host's clock and page a fresh beat as an hour old; it is blind instead, and the next pass
    judges by the ledger's clock again."""
    from types import SimpleNamespace

    from onceflow.ledger.clock import DatabaseClock
    from onceflow.testing.alert_receiver import AlertReceiver
    from onceflow.watchdog import runner
    from onceflow.watchdog.config import parse_config

    real = time.time
    monkeypatch.setattr(
        runner,
        "time",
        SimpleNamespace(time=lambda: real() + 3600, monotonic=time.monotonic, sleep=time.sleep),
    )
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = create_ledger_engine(ledger)
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id="fresh",
                dag_id="heartbeat",
                scheduled_at=real(),
                started_at=real(),
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        wd = runner.Watchdog(
            parse_config(
                {
                    "ledger_url": ledger,
                    "state_dir": str(tmp_path / "state"),
                    "alerts": {"webhook_url": receiver.webhook_url},
                    "checks": {"heartbeat": {"period_seconds": 60, "grace_seconds": 60}},
                }
            )
        )
        database = DatabaseClock(wd.ledger)
        reads = iter([RuntimeError("connection cut")])

        class FlakyClock:
            def now(self) -> float:
                failure = next(reads, None)
                if failure is not None:
                    raise failure
                return database.now()

        wd._db_clock = FlakyClock()  # type: ignore[assignment]
        first = wd.run_once()
        second = wd.run_once()
        # Judged down on the host's clock, the row was due an hour later; the next pass found the
        # beat fresh and sent "RECOVERED: it was down for -120 s" (a fresh beat, an hour ahead).
        assert [m["text"].splitlines()[:3] for m in receiver.webhooks()] == []
        assert (list(first.blind), first.states) == (["ledger"], {})
        assert second.states == {"heartbeat": "up"}
    finally:
        receiver.stop()


def test_a_host_clock_stepped_back_while_blind_does_not_hold_the_blindness_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger is unreachable, so blindness is judged by this host's clock (late at the first
    failed pass, down two loops later). NTP steps the clock an hour back in between: the page used
    to wait for the clock to catch up (an hour of silence, nothing else able to page). The local
    clock is carried forward by the monotonic clock, which a step does not move."""
    from types import SimpleNamespace

    from onceflow.testing.alert_receiver import AlertReceiver
    from onceflow.watchdog import runner
    from onceflow.watchdog.config import parse_config

    wall, steady = [time.time()], [time.monotonic()]
    monkeypatch.setattr(
        runner, "time", SimpleNamespace(time=lambda: wall[0], monotonic=lambda: steady[0], sleep=time.sleep)
    )
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        wd = runner.Watchdog(
            parse_config(
                {
                    "ledger_url": f"sqlite:///{tmp_path / 'missing' / 'ledger.db'}",  # cannot be opened
                    "state_dir": str(tmp_path / "state"),
                    "loop_seconds": 5,
                    "alerts": {"webhook_url": receiver.webhook_url},
                    "checks": {"heartbeat": {"period_seconds": 60, "grace_seconds": 60}},
                }
            )
        )
        assert list(wd.run_once().blind) == ["ledger"]  # late: blind since now
        for _ in range(3):  # three loops later, an hour earlier by the wall clock
            wall[0] -= 3600 / 3 - 5
            steady[0] += 5
            wd.run_once()
        kinds = [(m["onceflow"]["check"], m["onceflow"]["kind"]) for m in receiver.webhooks()]
        assert kinds == [("watchdog.blind.ledger", "down")]
    finally:
        receiver.stop()
