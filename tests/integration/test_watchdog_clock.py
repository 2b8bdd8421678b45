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
