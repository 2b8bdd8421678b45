"""The watchdog as real processes against one PostgreSQL ledger, with real failures.

Two replicas at once, a replica SIGKILLed mid-incident and restarted, the alert receiver killed
and brought back, the ledger database made unreachable. Alerts are read from the receiver's store
file and the outbox by plain SQL, never through the watchdog's own code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.testing.alert_receiver import AlertReceiverProcess, read_records

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.postgres

# Short periods so each test takes seconds: a beat is overdue 2 s after it started, down 2 s later.
CONFIG = """
ledger_url = "{ledger}"
state_dir = "{state}"
loop_seconds = 0.5
replica = "{replica}"

[alerts]
webhook_url = "http://127.0.0.1:{port}/webhook"
reminder_seconds = 3600
backoff_seconds = 0.5
backoff_max_seconds = 2
max_attempts = 3
send_timeout_seconds = 2

[checks.heartbeat]
period_seconds = 2
grace_seconds = 2
max_lag_seconds = 30
"""


def alerts(receiver: AlertReceiverProcess) -> list[tuple[str, str, int]]:
    """(check, kind, incident) of each webhook the receiver accepted."""
    return [
        (m["onceflow"]["check"], m["onceflow"]["kind"], m["onceflow"]["incident"])
        for m in receiver.webhooks()
    ]


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[AlertReceiverProcess]:
    r = AlertReceiverProcess(tmp_path / "received.jsonl").start()
    yield r
    r.kill()


@pytest.fixture
def watchdogs(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(ledger: str, port: int, replica: str, *extra: str) -> subprocess.Popen[bytes]:
        config = tmp_path / f"{replica}.toml"
        config.write_text(
            CONFIG.format(ledger=ledger, state=tmp_path / f"state-{replica}", replica=replica, port=port)
        )
        log = (tmp_path / f"{replica}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "onceflow.watchdog", "--config", str(config), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def beat(url: str, run_id: str) -> None:
    from onceflow.watchdog.schema import ensure_schema, heartbeats

    engine = sa.create_engine(url)
    ensure_schema(engine, [heartbeats])
    now = time.time()
    with engine.begin() as conn:
        conn.execute(
            heartbeats.insert().values(
                run_id=run_id,
                dag_id="heartbeat",
                scheduled_at=now,
                started_at=now,
                lag_seconds=0.0,
                try_number=1,
            )
        )
    engine.dispose()


def outbox(url: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(url)
    if not sa.inspect(engine).has_table("watchdog_alerts"):
        return []
    with engine.connect() as conn:
        rows = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text("SELECT dedup_key, state, attempts FROM watchdog_alerts ORDER BY id")
            )
        ]
    engine.dispose()
    return rows


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, logs: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    tails = "" if logs is None else "\n".join(p.read_text()[-3000:] for p in sorted(logs.glob("*.log")))
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def test_two_replicas_at_once_send_one_alert_per_incident(
    postgres_url: str, receiver: AlertReceiverProcess, watchdogs: Callable[..., Any], tmp_path: Path
) -> None:
    beat(postgres_url, "r1")
    for name in ("a", "b", "c"):
        watchdogs(postgres_url, receiver.port, name)
    wait_until(lambda: ("heartbeat", "down", 1) in alerts(receiver), 60, "the down alert", tmp_path)
    time.sleep(3)  # several more passes of every replica: nothing more may arrive
    beat(postgres_url, "r2")
    wait_until(lambda: ("heartbeat", "recovery", 1) in alerts(receiver), 60, "the recovery", tmp_path)
    wait_until(lambda: ("heartbeat", "down", 2) in alerts(receiver), 60, "the second incident", tmp_path)
    time.sleep(3)
    assert alerts(receiver) == [
        ("heartbeat", "down", 1),
        ("heartbeat", "recovery", 1),
        ("heartbeat", "down", 2),
    ]
    logs = "".join((tmp_path / f"{n}.log").read_text() for n in "abc")
    # each transition was made by one replica; the others lost the compare-and-set or found it done
    assert logs.count("up -> late") + logs.count("up -> down") == 2, logs[-3000:]


def test_a_watchdog_killed_mid_incident_neither_repeats_nor_forgets(
    postgres_url: str, receiver: AlertReceiverProcess, watchdogs: Callable[..., Any], tmp_path: Path
) -> None:
    beat(postgres_url, "r1")
    receiver.kill()  # the alert is queued but cannot be delivered
    first = watchdogs(postgres_url, receiver.port, "a")
    wait_until(
        lambda: any(r["attempts"] >= 1 for r in outbox(postgres_url)), 60, "a failed delivery", tmp_path
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert [r["state"] for r in outbox(postgres_url)] == ["queued"]
    receiver.start()
    watchdogs(postgres_url, receiver.port, "a")  # the same replica, restarted: same state_dir
    wait_until(lambda: alerts(receiver), 60, "the queued alert", tmp_path)
    time.sleep(3)
    assert alerts(receiver) == [("heartbeat", "down", 1)]
    assert [r["state"] for r in outbox(postgres_url)] == ["sent"]
    beat(postgres_url, "r2")  # the incident was not forgotten: its recovery follows
    wait_until(lambda: len(alerts(receiver)) == 2, 60, "the recovery", tmp_path)
    assert alerts(receiver)[-1] == ("heartbeat", "recovery", 1)


def test_a_receiver_down_then_back_gets_the_alert_once_late(
    postgres_url: str, receiver: AlertReceiverProcess, watchdogs: Callable[..., Any], tmp_path: Path
) -> None:
    beat(postgres_url, "r1")
    receiver.kill()
    watchdogs(postgres_url, receiver.port, "a")
    # past max_attempts (3): the loud line, and the watchdog keeps running
    wait_until(
        lambda: "ALERT NOT DELIVERED" in (tmp_path / "a.log").read_text(), 60, "the loud log line", tmp_path
    )
    receiver.start()
    wait_until(lambda: alerts(receiver), 60, "the late alert", tmp_path)
    time.sleep(3)
    assert alerts(receiver) == [("heartbeat", "down", 1)]
    [row] = outbox(postgres_url)
    assert row["state"] == "sent" and row["attempts"] >= 4


def test_an_unreachable_ledger_is_a_blindness_incident(
    postgres_url: str, receiver: AlertReceiverProcess, watchdogs: Callable[..., Any], tmp_path: Path
) -> None:
    db = sa.engine.make_url(postgres_url).database
    admin = sa.create_engine(postgres_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    beat(postgres_url, "r1")
    once = watchdogs(postgres_url, receiver.port, "once", "--once")
    assert once.wait(60) in (0, 1)  # reachable: judged (up or late, by timing), not blind (3)
    proc = watchdogs(postgres_url, receiver.port, "a")
    with admin.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false'))
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"), {"d": db}
        )
    try:
        blind = wait_until(
            lambda: [a for a in alerts(receiver) if a[0] == "watchdog.blind.ledger"],
            60,
            "the blindness alert",
            tmp_path,
        )
        assert blind == [("watchdog.blind.ledger", "down", 1)]
        text = [r["message"]["text"] for r in read_records(receiver.store) if r["kind"] == "webhook"][-1]
        assert "ledger database unreachable" in text and "#runbook-watchdog-blind" in text
        blind_once = watchdogs(postgres_url, receiver.port, "once2", "--once")
        assert blind_once.wait(60) == 3
        assert proc.poll() is None  # blind, not dead
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true'))
    wait_until(
        lambda: ("watchdog.blind.ledger", "recovery", 1) in alerts(receiver), 60, "sight again", tmp_path
    )
    admin.dispose()


def test_the_watchdog_imports_nothing_from_airflow(tmp_path: Path) -> None:
    """With every ``airflow`` import refused, the CLI still runs a full pass (SQLite ledger)."""
    config = tmp_path / "w.toml"
    config.write_text(
        CONFIG.format(ledger=f"sqlite:///{tmp_path / 'l.db'}", state=tmp_path / "s", replica="x", port=9)
    )
    script = textwrap.dedent(
        f"""
        import sys, runpy
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "airflow" or name.startswith("airflow."):
                    raise ImportError("airflow import refused: " + name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["onceflow-watchdog", "--config", {str(config)!r}, "--once"]
        try:
            runpy.run_module("onceflow.watchdog", run_name="__main__")
        except SystemExit as exit:
            print("EXIT", exit.code)
            print("MODULES", [m for m in sys.modules if m.startswith("airflow")])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "airflow import refused" not in proc.stderr, proc.stderr
    # a full pass: the schema created, the check judged (no beat yet, watched for 0 s: up)
    assert "heartbeat: up\nEXIT 0" in proc.stdout, proc.stdout + proc.stderr
    assert "MODULES []" in proc.stdout


def test_the_compare_and_set_lets_one_of_two_racing_replicas_win(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Both replicas read ``up`` before either writes (a barrier holds them there), then both try
    the transition to ``down``: exactly one UPDATE changes a row, so one down alert is queued."""
    import threading

    from onceflow.watchdog import incidents
    from onceflow.watchdog.alerts import Outbox
    from onceflow.watchdog.config import AlertConfig, CheckConfig
    from onceflow.watchdog.incidents import DOWN, Verdict
    from onceflow.watchdog.schema import ensure_schema

    engine = sa.create_engine(postgres_url)
    ensure_schema(engine)
    check = CheckConfig("race", "heartbeat", 60, 60, "docs/watchdog.md#check-heartbeat")
    now = time.time()
    incidents.get_or_create(engine, "race", now, "setup")
    barrier = threading.Barrier(2, timeout=30)
    original = incidents.get_or_create
    first_read: set[str] = set()

    def read_then_wait(engine: Any, name: str, when: float, actor: str) -> Any:
        current = original(engine, name, when, actor)
        if actor not in first_read:  # only the first read of each replica is held
            first_read.add(actor)
            barrier.wait()
        return current

    monkeypatch.setattr(incidents, "get_or_create", read_then_wait)
    results: dict[str, Any] = {}

    def replica(name: str) -> None:
        outbox = Outbox(AlertConfig(webhook_url="http://127.0.0.1:9/webhook"), name)
        verdict = Verdict(DOWN, "no heartbeat", {}, since=now)
        results[name] = incidents.apply(engine, check, verdict, outbox, now=now, actor=name)

    caplog.set_level("WARNING", logger="onceflow.watchdog.incidents")
    threads = [threading.Thread(target=replica, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with engine.connect() as conn:
        keys = [r[0] for r in conn.execute(sa.text("SELECT dedup_key FROM watchdog_alerts"))]
        row = conn.execute(
            sa.text("SELECT state, incident, version FROM watchdog_incidents WHERE check_name='race'")
        ).one()
    engine.dispose()
    assert {r.incident for r in results.values()} == {1}
    # one replica made the transition; the other's UPDATE matched no row (it re-read and found it done)
    made = [r.getMessage() for r in caplog.records if "race: up -> down" in r.getMessage()]
    assert len(made) == 1, made
    assert keys == ["race/1/down/webhook"]
    assert tuple(row) == ("down", 1, 1)


def test_the_duplicate_window_accepted_then_killed_before_marked_sent(
    postgres_url: str, watchdogs: Callable[..., Any], tmp_path: Path
) -> None:
    """The documented window for a repeat, made to happen: the receiver accepts while the test
    holds the outbox row's lock, so the watchdog's "mark sent" UPDATE waits; the watchdog is
    SIGKILLed there. Its restart sends the alert again (after the lease), with the same
    ``Idempotency-Key``: the key is what lets a receiver drop the repeat."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    engine = sa.create_engine(postgres_url)
    lock_conn = engine.connect()
    keys: list[str | None] = []
    locked = threading.Event()

    class Receiver(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            key = self.headers.get("Idempotency-Key")
            keys.append(key)
            if len(keys) == 1:  # hold the row: the watchdog's UPDATE after this 200 must wait
                lock_conn.begin()
                lock_conn.execute(
                    sa.text("SELECT 1 FROM watchdog_alerts WHERE dedup_key = :k FOR UPDATE"), {"k": key}
                )
                locked.set()
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def mark_sent_waits() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE 'UPDATE watchdog_alerts%'"
                    )
                ).scalar()
            )

    try:
        beat(postgres_url, "r1")
        first = watchdogs(postgres_url, port, "a")
        wait_until(locked.is_set, 60, "the first delivery", tmp_path)
        wait_until(mark_sent_waits, 60, "the mark-sent UPDATE waiting on the lock", tmp_path)
        first.send_signal(signal.SIGKILL)
        first.wait()
        lock_conn.rollback()
        assert [r["state"] for r in outbox(postgres_url)] == ["queued"]  # accepted, never marked
        watchdogs(postgres_url, port, "a")
        wait_until(lambda: [r["state"] for r in outbox(postgres_url)] == ["sent"], 90, "the resend", tmp_path)
    finally:
        server.shutdown()
        server.server_close()
        lock_conn.close()
        engine.dispose()
    assert keys == ["heartbeat/1/down/webhook"] * 2
