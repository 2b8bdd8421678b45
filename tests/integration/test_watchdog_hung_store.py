"""No store can silence the watchdog: PostgreSQL reachable but frozen (a TCP proxy that holds
every byte, so no socket option notices) while the loop runs in this process's threads.

Defect 1 of issue 28: the pass sat in the pool's pre-ping for 45 s with no blindness alert, no log
line and no self-ping. Now the pass monitor pages ``watchdog.blind.pass`` within the pass budget,
the self-heartbeat stops, and both recover when the store answers again.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiver
from onceflow.testing.tcp_proxy import FreezableProxy
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.schema import ensure_schema, heartbeats

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

pytestmark = pytest.mark.postgres


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiver]:
    r = AlertReceiver(tmp_path / "received.jsonl").start()
    yield r
    r.stop()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_a_hung_ledger_pages_within_the_budget_and_stops_the_self_heartbeat(
    postgres_url: str, receiver: AlertReceiver, tmp_path: Path
) -> None:
    url = sa.engine.make_url(postgres_url)
    proxy = FreezableProxy(url.host or "127.0.0.1", url.port or 5432).start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    engine = sa.create_engine(postgres_url)
    ensure_schema(engine, [heartbeats])
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id="r1",
                dag_id="heartbeat",
                scheduled_at=now,
                started_at=now,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()
    config = parse_config(
        {
            "ledger_url": proxied,
            "state_dir": str(tmp_path / "state"),
            "loop_seconds": 0.5,
            "pass_budget_seconds": 3,
            # Longer than the budget: the monitor, not a deadline, must be what pages.
            "statement_timeout_seconds": 60,
            "replica": "hung",
            "self_heartbeat": {"url": receiver.ping_url("self")},
            "alerts": {"webhook_url": receiver.webhook_url, "send_timeout_seconds": 2},
            "checks": {"heartbeat": {"period_seconds": 600, "grace_seconds": 600}},
        }
    )
    wd = Watchdog(config)
    stop = threading.Event()
    loop = threading.Thread(target=wd.run_forever, kwargs={"stop": stop.is_set}, daemon=True)
    loop.start()

    def pings() -> int:
        return sum(1 for r in receiver.records() if r["kind"] == "ping")

    def blind(kind: str) -> bool:
        return any(
            m["onceflow"]["check"] == "watchdog.blind.pass" and m["onceflow"]["kind"] == kind
            for m in receiver.webhooks()
        )

    try:
        wait_for(lambda: pings() >= 2, 60, "two passes in budget (self-pings)")
        proxy.freeze()
        frozen_at = time.monotonic()
        paged_after = wait_for(lambda: blind("down"), 30, "the blindness alert while the ledger hangs")
        load = os.getloadavg()[0]
        print(
            f"\nhung ledger paged {paged_after:.1f} s after the freeze (budget 3 s, loop 0.5 s; load {load:.1f})"
        )
        assert wd.pass_started is not None  # the pass is still stuck: the page did not need it
        before = pings()
        time.sleep(2)
        assert pings() == before, "the self-heartbeat must stop while a pass is stuck"
        assert time.monotonic() - frozen_at < 30
        proxy.thaw()
        wait_for(lambda: blind("recovery"), 90, "the recovery when the ledger answers again")
        wait_for(lambda: pings() > before, 30, "self-pings again")
    finally:
        stop.set()
        proxy.thaw()
        loop.join(30)
        proxy.stop()
    keys = [
        r["idempotency_key"] for r in receiver.records() if r["kind"] == "webhook" and not r.get("refused")
    ]
    assert len(keys) == len(set(keys))
