"""The heartbeat DAG through ``dag.test()``: a beat lands in the ledger database, pings go out,
and a monitoring endpoint that never answers does not stop the beat."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiver

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


@pytest.fixture
def ledger_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ONCEFLOW_LEDGER", json.dumps({"conn_type": "sqlite", "extra": {"sqlalchemy_url": url}})
    )
    return url


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiver]:
    r = AlertReceiver(tmp_path / "pings.jsonl").start()
    yield r
    r.stop()


def beats(url: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM onceflow_heartbeats"))]
    engine.dispose()
    return rows


def test_a_beat_is_recorded_with_its_lag_and_pinged(
    run_dag: Any, ledger_url: str, receiver: AlertReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_HEARTBEAT_PING_URL", receiver.ping_url("check-uuid"))
    result = run_dag("heartbeat")
    assert result.state == "success", result.ti_states
    [row] = beats(ledger_url)
    assert row["run_id"] == result.dag_run.run_id
    assert row["started_at"] >= row["scheduled_at"]
    assert row["lag_seconds"] == pytest.approx(row["started_at"] - row["scheduled_at"])
    rid = str(uuid.uuid5(uuid.NAMESPACE_URL, row["run_id"]))
    pings = [(r["uuid"], r["signal"], r["rid"]) for r in receiver.records()]
    assert pings == [("check-uuid", "start", rid), ("check-uuid", "success", rid)]


def test_a_ping_endpoint_that_never_answers_does_not_stop_the_beat(
    run_dag: Any, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket that accepts and never replies: each ping times out (3 s), the beat is recorded."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setenv("ONCEFLOW_HEARTBEAT_PING_URL", f"http://127.0.0.1:{server.getsockname()[1]}/ping/x")
    try:
        result = run_dag("heartbeat")
    finally:
        stop.set()
        thread.join(5)
        for s in held:
            s.close()
        server.close()
    assert result.state == "success"
    assert len(beats(ledger_url)) == 1
    assert len(held) == 2  # start and success were both attempted


def test_the_ping_url_never_reaches_the_task_log(
    run_dag: Any,
    ledger_url: str,
    receiver: AlertReceiver,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The URL comes from the environment, so Airflow would not mask it by itself; a refused ping
    logs a warning that names it, redacted, and the secrets masker hides any other mention."""
    caplog.set_level("INFO")
    receiver.set_down(True)
    monkeypatch.setenv("ONCEFLOW_HEARTBEAT_PING_URL", receiver.ping_url("HC-SECRET-UUID-4242"))
    result = run_dag("heartbeat")
    assert result.state == "success"
    out, err = capfd.readouterr()
    logged = out + err + caplog.text
    assert "not accepted" in logged  # the warning was written: the check below is not vacuous
    assert "HC-SECRET-UUID-4242" not in logged
