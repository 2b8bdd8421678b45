"""Delivery promises of the watchdog's outbox, under a fake clock and a real local receiver.

Per incident and channel: messages arrive in order (a recovery never overtakes its down alert),
at most once without a crash (a lease is taken per row when its send starts and "mark sent"
needs it), and Idempotency-Keys never repeat across replicas, restarts or wiped state files.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.testing.alert_receiver import AlertReceiver, read_records
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

T0 = 1_800_000_000.0


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiver]:
    r = AlertReceiver(tmp_path / "received.jsonl").start()
    yield r
    r.stop()


def config(
    tmp_path: Path, receiver: AlertReceiver, replica: str, checks: dict[str, Any], **alerts: Any
) -> Any:
    return parse_config(
        {
            "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
            "state_dir": str(tmp_path / f"state-{replica}"),
            "loop_seconds": 5,
            "replica": replica,
            "alerts": {"webhook_url": receiver.webhook_url, "backoff_seconds": 30, **alerts},
            "checks": checks,
        }
    )


def beat(tmp_path: Path, run_id: str, at: float) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id=run_id,
                dag_id="heartbeat",
                scheduled_at=at,
                started_at=at,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()


def webhooks(receiver: AlertReceiver) -> list[dict[str, Any]]:
    return [r for r in read_records(receiver.store) if r["kind"] == "webhook" and not r.get("refused")]


HEARTBEAT = {"heartbeat": {"period_seconds": 60, "grace_seconds": 60, "max_lag_seconds": 30}}


def test_a_recovery_never_overtakes_its_down_alert_waiting_out_a_backoff(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "r1", T0)
    wd = Watchdog(config(tmp_path, receiver, "a", HEARTBEAT), clock=clock.now)
    wd.run_once()
    receiver.set_down(True)
    clock.set(T0 + 125)
    assert wd.run_once().states == {"heartbeat": "down"}  # the down alert is refused: 30 s backoff
    receiver.set_down(False)
    beat(tmp_path, "r2", T0 + 126)
    clock.set(T0 + 127)
    wd.run_once()  # the check is up again while its down alert waits out the backoff
    for i in range(6):
        clock.advance(30)
        beat(tmp_path, f"r{3 + i}", clock.now())
        wd.run_once()
    got = [(w["message"]["onceflow"]["kind"], w["message"]["onceflow"]["state"]) for w in webhooks(receiver)]
    # Either down then recovery, or one message saying it was down and is up: never DOWN last.
    assert got in ([("down", "down"), ("recovery", "up")], [("recovery", "up")]), got
    assert got[-1] == ("recovery", "up")
    if len(got) == 1:
        assert "was down" in webhooks(receiver)[0]["message"]["text"]


def test_a_slow_receiver_and_a_second_replica_never_send_a_key_twice(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """24 checks down at once, each POST taking 0.9 s (of the shared fake clock); a second replica
    starts delivering 9 s into the first one's burst. No crash, so no key may arrive twice."""
    clock = FakeClock(T0)
    checks = {
        f"c{i:02d}": {"kind": "heartbeat", "period_seconds": 60, "grace_seconds": 60} for i in range(24)
    }
    beat(tmp_path, "r1", T0)
    a = Watchdog(
        config(tmp_path, receiver, "a", checks, send_timeout_seconds=2, group_max=1), clock=clock.now
    )
    b = Watchdog(
        config(tmp_path, receiver, "b", checks, send_timeout_seconds=2, group_max=1), clock=clock.now
    )
    a.run_once()
    clock.set(T0 + 125)
    started = threading.Event()
    b_done = threading.Event()

    def slow(_headers: dict[str, str]) -> None:
        clock.advance(0.9)
        if clock.now() >= T0 + 125 + 9 and not started.is_set():
            started.set()
            threading.Thread(target=lambda: (b.run_once(), b_done.set()), daemon=True).start()

    receiver.on_accept(slow)
    a.run_once()
    assert started.is_set()
    assert b_done.wait(120)
    receiver.on_accept(None)
    keys = [w["idempotency_key"] for w in webhooks(receiver)]
    assert len(keys) == 24, keys
    assert len(set(keys)) == len(keys), sorted(keys)


def test_blindness_alerts_never_reuse_an_idempotency_key(tmp_path: Path, receiver: AlertReceiver) -> None:
    """Three outages: replicas a and b, then a again after its state directory was wiped."""
    clock = FakeClock(T0)
    bad = {"ledger_url": f"sqlite:///{tmp_path / 'missing' / 'ledger.db'}"}
    keys: list[str] = []
    for replica, wipe in (("a", False), ("b", False), ("a", True)):
        if wipe:
            shutil.rmtree(tmp_path / f"state-{replica}")
        cfg = dataclasses.replace(config(tmp_path, receiver, replica, HEARTBEAT), **bad)
        wd = Watchdog(cfg, clock=clock.now)
        for _ in range(4):
            wd.run_once()
            clock.advance(6)
        keys = [w["idempotency_key"] for w in webhooks(receiver)]
    down = [k for k in keys if "/down/" in k]
    assert len(down) == 3, keys
    assert len(set(down)) == 3, down
