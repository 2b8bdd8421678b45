"""The status API (CLI and loopback HTTP), flap damping, grouping, and a corrupt state file."""

from __future__ import annotations

import json
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.testing.alert_receiver import AlertReceiver
from onceflow.testing.clock import FakeClock
from onceflow.testing.ports import free_port
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.schema import ensure_schema, heartbeats
from onceflow.watchdog.status import collect, exit_code, serve

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

T0 = 1_800_000_000.0


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiver]:
    r = AlertReceiver(tmp_path / "received.jsonl").start()
    yield r
    r.stop()


def config(tmp_path: Path, receiver: AlertReceiver, checks: dict[str, Any], **alerts: Any) -> Any:
    return parse_config(
        {
            "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
            "state_dir": str(tmp_path / "state"),
            "loop_seconds": 5,
            "replica": "a",
            "alerts": {"webhook_url": receiver.webhook_url, **alerts},
            "checks": checks,
        }
    )


def beat(tmp_path: Path, dag_id: str, at: float) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id=f"{dag_id}-{at}",
                dag_id=dag_id,
                scheduled_at=at,
                started_at=at,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()


def checks_of(*names: str, **extra: Any) -> dict[str, Any]:
    return {
        n: {"kind": "heartbeat", "dag_id": n, "period_seconds": 60, "grace_seconds": 60, **extra}
        for n in names
    }


def test_status_lists_states_since_last_beat_open_incidents_and_flips_also_over_http(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    clock = FakeClock(T0)
    beat(tmp_path, "a", T0)
    beat(tmp_path, "b", T0)
    wd = Watchdog(config(tmp_path, receiver, checks_of("a", "b")), clock=clock.now)
    wd.run_once()
    beat(tmp_path, "b", T0 + 120)
    clock.set(T0 + 125)
    wd.run_once()
    report = collect(wd)
    assert report["checks"]["a"]["state"] == "down" and report["checks"]["b"]["state"] == "up"
    assert report["open_incidents"] == ["a"] and exit_code(report) == 1
    # Each check's own DAG's newest beat: b's fresh beat says nothing about a, which is down.
    assert (report["checks"]["a"]["last_beat"], report["checks"]["b"]["last_beat"]) == (T0, T0 + 120)
    assert [(f["from"], f["to"]) for f in report["checks"]["a"]["flips"]] == [("up", "down")]
    port = free_port()
    server = serve(wd, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as answer:
            assert json.load(answer)["open_incidents"] == ["a"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
            assert json.load(answer) == {"ok": True, "reason": "ok"}
    finally:
        server.shutdown()


def test_checks_down_in_one_pass_are_one_message_per_channel(tmp_path: Path, receiver: AlertReceiver) -> None:
    clock = FakeClock(T0)
    for n in "abc":
        beat(tmp_path, n, T0)
    wd = Watchdog(config(tmp_path, receiver, checks_of("a", "b", "c")), clock=clock.now)
    wd.run_once()
    clock.set(T0 + 125)
    wd.run_once()
    (message,) = receiver.webhooks()
    assert message["onceflow"]["kind"] == "group"
    assert [a["check"] for a in message["onceflow"]["alerts"]] == ["a", "b", "c"]
    assert message["text"].startswith(":red_circle: onceflow watchdog: 3 checks DOWN: a, b, c")


def test_a_flapping_check_sends_one_flapping_message_not_a_page_per_flip(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    clock = FakeClock(T0)
    flap = checks_of("f", period_seconds=10, grace_seconds=0, flap_threshold=2, flap_window_seconds=3600)
    wd = Watchdog(config(tmp_path, receiver, flap), clock=clock.now)
    for _ in range(6):  # up, down, up, down, ...: six flips in minutes
        beat(tmp_path, "f", clock.now())
        wd.run_once()
        clock.advance(20)
        wd.run_once()
        clock.advance(1)
    kinds = [m["onceflow"]["kind"] for m in receiver.webhooks()]
    assert kinds.count("flapping") == 1, kinds
    assert kinds.count("down") == 2 and kinds.count("recovery") == 2, kinds  # before it was flapping


def test_once_over_a_corrupt_state_file_moves_it_aside_and_says_so(
    tmp_path: Path, receiver: AlertReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "watchdog-local.db").write_bytes(b"not a database" * 100)
    beat(tmp_path, "a", T0)
    wd = Watchdog(config(tmp_path, receiver, checks_of("a")), clock=FakeClock(T0).now)
    assert wd.run_once().states == {"a": "up"}
    assert list((tmp_path / "state").glob("watchdog-local.db.corrupt-*"))
    assert "moved to" in caplog.text and "started a new one" in caplog.text


def test_a_check_that_dies_after_flapping_is_paged_not_held_for_the_window(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """Damping holds a flapping check's down for at most period + grace: one that then stays
    down is dead, and is paged. It used to stay held until its flips aged out of the window (up
    to an hour by default) with nothing sent after the FLAPPING message."""
    clock = FakeClock(T0)
    flap = checks_of("f", period_seconds=10, grace_seconds=0, flap_threshold=2, flap_window_seconds=3600)
    wd = Watchdog(config(tmp_path, receiver, flap), clock=clock.now)
    for _ in range(3):  # down and up three times: the third is held as flapping
        beat(tmp_path, "f", clock.now())
        wd.run_once()
        clock.advance(20)
        wd.run_once()
        clock.advance(1)
    assert [m["onceflow"]["kind"] for m in receiver.webhooks()][-1] == "flapping"
    last_beat = clock.now() - 21
    for _ in range(4):  # no beat any more: it died
        clock.advance(5)
        wd.run_once()
    final = receiver.webhooks()[-1]["onceflow"]
    assert (final["kind"], final["state"]) == ("down", "down")
    # Down at last beat + 10 s, first seen by the pass 20 s after the beat, held until 10 s
    # past down, paged by the first pass after that.
    assert final["queued_at"] <= last_beat + 20 + 10 + 5


def test_a_stuck_pass_reported_before_a_restart_recovers_at_the_next_processes_first_pass(
    tmp_path: Path, receiver: AlertReceiver
) -> None:
    """The monitor pages watchdog.blind.pass, then the process re-executes itself (or is killed):
    its monitor never sees the pass end. The next process clears it after its first pass; before,
    nothing did, so status said blind (exit 3) for ever and no RECOVERED was sent."""
    import time

    from onceflow.watchdog.runner import PassMonitor

    clock = FakeClock(T0)
    beat(tmp_path, "a", T0)
    wd = Watchdog(config(tmp_path, receiver, checks_of("a")), clock=clock.now)
    wd.run_once()
    wd.pass_started = time.monotonic() - 1000  # a pass stuck for 1,000 s
    PassMonitor(wd).check()
    assert list(collect(wd)["blind"]) == ["watchdog.blind.pass"]
    again = Watchdog(config(tmp_path, receiver, checks_of("a")), clock=clock.now)  # same state file
    assert exit_code(collect(again)) == 3
    again.run_once()
    assert collect(again)["blind"] == {} and exit_code(collect(again)) == 0
    kinds = [(m["onceflow"]["check"], m["onceflow"]["kind"]) for m in receiver.webhooks()]
    assert kinds == [("watchdog.blind.pass", "down"), ("watchdog.blind.pass", "recovery")]


def test_health_judges_the_loops_age_by_the_monotonic_clock(tmp_path: Path, receiver: AlertReceiver) -> None:
    """The host clock stepping an hour ahead (NTP, a resumed VM) is not a stale loop."""
    from onceflow.watchdog.status import health

    clock = FakeClock(T0)
    beat(tmp_path, "a", T0)
    wd = Watchdog(config(tmp_path, receiver, checks_of("a")), clock=clock.now)
    wd.run_once()
    clock.advance(3600)
    assert health(wd) == (True, "ok")
