"""A ledger that answers ``SELECT 1`` but refuses writes (a read-only standby after a failover, a
full disk) is blindness that pages: late, then down after the grace, one alert. The ledger is a
real SQLite file opened read-only (``mode=ro``); the blindness incident is read back by plain SQL
from the replica's local file, the alert from the receiver's store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from onceflow.ledger import Ledger
from onceflow.ledger.db import create_ledger_engine
from onceflow.testing.alert_receiver import AlertReceiver, read_records
from onceflow.testing.clock import FakeClock
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import LOCAL_DB, Watchdog
from onceflow.watchdog.schema import ensure_schema

if TYPE_CHECKING:
    from pathlib import Path


def test_a_readable_but_unwritable_ledger_goes_down_and_alerts_once(tmp_path: Path) -> None:
    engine = create_ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    Ledger(engine)  # work_items, read by the article_queue check (which itself writes nothing)
    engine.dispose()
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    try:
        config = parse_config(
            {
                "ledger_url": f"sqlite:///file:{tmp_path / 'ledger.db'}?mode=ro&uri=true",
                "state_dir": str(tmp_path / "state"),
                "loop_seconds": 5,
                "alerts": {"webhook_url": receiver.webhook_url},
                "checks": {"article_queue": {}},
            }
        )
        clock = FakeClock(1_800_000_000.0)
        wd = Watchdog(config, clock=clock.now)
        for _ in range(6):  # 30 s: past the blindness grace (two loops)
            assert "cannot record article_queue" in wd.run_once().blind["ledger"]
            clock.advance(5)
        sent = [r["message"]["onceflow"] for r in read_records(receiver.store) if r["kind"] == "webhook"]
    finally:
        receiver.stop()
    local = sa.create_engine(f"sqlite:///{tmp_path / 'state' / LOCAL_DB}")
    with local.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT state, incident FROM watchdog_incidents WHERE check_name = 'watchdog.blind.ledger'"
            )
        ).one()
    local.dispose()
    assert tuple(row) == ("down", 1)
    assert [(m["check"], m["kind"]) for m in sent] == [("watchdog.blind.ledger", "down")]
