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


def test_once_exit_codes_for_cron(tmp_path: Path) -> None:
    """0 when every check is up, 1 when one is down, 3 when the ledger cannot be read."""
    import subprocess
    import sys

    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = demo_config(tmp_path / "home", ledger, 9)

    def once(path: Path = config) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "onceflow.watchdog", "--config", str(path), "--once"],
            capture_output=True,
            text=True,
            timeout=120,
        )

    from onceflow.ledger import Ledger
    from onceflow.ledger.db import create_ledger_engine

    engine = create_ledger_engine(ledger)
    Ledger(engine)  # the ledger's own tables (work_items for article_queue), as `onceflow up` makes them
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
    fresh = once()
    assert (fresh.returncode, fresh.stdout) == (0, "article_queue: up\nheartbeat: up\n"), fresh.stderr
    with engine.begin() as conn:
        conn.execute(heartbeats.update().values(started_at=now - 3600, scheduled_at=now - 3600))
    stale = once()
    assert (stale.returncode, stale.stdout) == (1, "article_queue: up\nheartbeat: down\n"), stale.stderr
    engine.dispose()
    blind_config = tmp_path / "blind.toml"
    blind_config.write_text(
        config.read_text().replace(ledger, f"sqlite:///{tmp_path / 'no-such-dir' / 'ledger.db'}")
    )
    blind = once(blind_config)
    assert blind.returncode == 3, blind.stderr
    assert "BLIND ledger: ledger database unreachable" in blind.stdout
