"""``start_beside`` and ``start_receiver`` (what ``make run`` calls): the demo watchdog, started
after the beats stopped, alerts the local receiver at its first pass."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.testing.alert_receiver import read_records
from onceflow.testing.ports import free_port
from onceflow.watchdog.config import load_config
from onceflow.watchdog.local import demo_config, start_beside, start_receiver
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from pathlib import Path


def test_the_demo_watchdog_alerts_the_local_receiver(tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    port = free_port()
    assert load_config(demo_config(home, ledger, port)).checks  # the demo config is valid
    engine = sa.create_engine(ledger)
    ensure_schema(engine, [heartbeats])
    old = time.time() - 3600  # the last beat an hour ago
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id="old",
                dag_id="heartbeat",
                scheduled_at=old,
                started_at=old,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()
    receiver = start_receiver(home, port)
    watchdog = start_beside(home, ledger, port)
    store = home / "onceflow" / "alerts.jsonl"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not read_records(store):
            time.sleep(0.5)
        [record] = read_records(store)
        assert record["message"]["onceflow"]["check"] == "heartbeat"
        assert record["message"]["onceflow"]["kind"] == "down"
    finally:
        for proc in (watchdog, receiver):
            proc.terminate()
            proc.wait(30)
    assert watchdog.returncode == 0  # SIGTERM: a clean stop after the pass
    assert "pass:" in (home / "onceflow" / "watchdog.log").read_text()
