"""The view's watchdog section reads the real watchdog: its tables after a pass, its status API
(``onceflow.watchdog.status.serve`` on loopback), and falls back to the tables when the API is down."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from onceflow.opsview.watchdog import watchdog_state
from onceflow.testing.ports import free_port
from onceflow.watchdog.config import parse_config
from onceflow.watchdog.runner import Watchdog
from onceflow.watchdog.status import serve

T0 = 1_800_000_000.0


def _down_watchdog(tmp_path: Path) -> tuple[Watchdog, sa.Engine]:
    """A watchdog whose heartbeat check has seen no beat for long past its grace: down."""
    config = parse_config(
        {
            "ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}",
            "state_dir": str(tmp_path / "state"),
            "alerts": {"log_only": True},
            "checks": {"beat": {"kind": "heartbeat", "period_seconds": 60, "grace_seconds": 60}},
        }
    )
    clock = iter([T0, T0 + 1000, T0 + 5000])
    now = [T0]

    def tick() -> float:
        return now[0]

    wd = Watchdog(config, clock=tick)
    for at in clock:
        now[0] = at
        wd.run_once()
    return wd, sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")


def test_the_tables_show_the_incident_after_a_pass(tmp_path: Path) -> None:
    _wd, engine = _down_watchdog(tmp_path)
    with engine.connect() as conn:
        state = watchdog_state(conn, T0 + 5000)
    check = next(c for c in state["checks"] if c["name"] == "beat")
    assert state["source"] == "ledger"
    assert check["state"] == "down" and check["incident"] >= 1 and check["reason"]


def test_the_status_api_is_read_when_configured_and_the_tables_when_it_does_not_answer(
    tmp_path: Path,
) -> None:
    wd, engine = _down_watchdog(tmp_path)
    port = free_port()
    server = serve(wd, port)
    try:
        with engine.connect() as conn:
            state = watchdog_state(conn, T0 + 5000, f"http://127.0.0.1:{port}/status")
    finally:
        server.shutdown()
        server.server_close()
    assert state["source"] == "status_api", state.get("note")
    assert state["open_incidents"] == ["beat"]
    beat = next(c for c in state["checks"] if c["name"] == "beat")
    assert beat["state"] == "down" and beat["reason"]
    with engine.connect() as conn:  # the server is gone: the tables, and the page says why
        fallback = watchdog_state(conn, T0 + 5000, f"http://127.0.0.1:{port}/status")
    assert fallback["source"] == "ledger" and "did not answer" in fallback["note"]
    assert next(c for c in fallback["checks"] if c["name"] == "beat")["state"] == "down"


def test_the_status_api_and_the_tables_show_the_same_newest_heartbeat(tmp_path: Path) -> None:
    """The status API gives each heartbeat check its own DAG's newest beat; the page shows the
    newest of them, as the tables give it (it showed the first check's, here a's older one)."""
    from onceflow.watchdog.schema import ensure_schema, heartbeats

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine, [heartbeats])
    with engine.begin() as conn:
        for dag, at in (("a", T0 - 30), ("b", T0 - 5)):
            conn.execute(
                heartbeats.insert().values(
                    run_id=dag, dag_id=dag, scheduled_at=at, started_at=at, lag_seconds=0.0, try_number=1
                )
            )
    checks = {n: {"kind": "heartbeat", "dag_id": n, "period_seconds": 60, "grace_seconds": 60} for n in "ab"}
    config = {"ledger_url": f"sqlite:///{tmp_path / 'ledger.db'}", "state_dir": str(tmp_path / "state")}
    wd = Watchdog(parse_config({**config, "alerts": {"log_only": True}, "checks": checks}), clock=lambda: T0)
    wd.run_once()
    port = free_port()
    server = serve(wd, port)
    try:
        with engine.connect() as conn:
            api = watchdog_state(conn, T0, f"http://127.0.0.1:{port}/status")
            tables = watchdog_state(conn, T0)
    finally:
        server.shutdown()
        server.server_close()
    assert api["source"] == "status_api" and tables["source"] == "ledger"
    assert api["last_heartbeat_at"] == tables["last_heartbeat_at"] == T0 - 5
