"""The dead-man's switch against a real Airflow: the heartbeat DAG paused, the scheduler hung
(SIGSTOP) and resumed (SIGCONT), the scheduler killed outright.

The watchdog runs as its own process (``python -m onceflow.watchdog``) against a PostgreSQL
ledger; the heartbeat DAG beats every 5 s (``ONCEFLOW_HEARTBEAT_SCHEDULE=5s``); the watchdog's
heartbeat check has period 10 s and grace 10 s. A probe DAG carries a Deadline Alert (20 s after
its run was queued) and a task that runs longer than that, so its deadline passes while the
scheduler is stopped. Both timelines are printed (``pytest -s``) and kept in ``docs/watchdog.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from onceflow.notifications.deadline import read_alert_records
from onceflow.testing.alert_receiver import AlertReceiver

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [pytest.mark.real_airflow, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
PERIOD, GRACE = 10, 10

PROBE = """
from datetime import timedelta
import time
import pendulum
from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference, dag, task
from onceflow.notifications.deadline import MissedDeadlineNotifier


@dag(
    dag_id="watchdog_probe",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
    doc_md="A run with a Deadline Alert 20 s after it was queued; its task takes 40 s.",
    default_args={{"owner": "onceflow", "retries": 0}},
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(seconds=20),
        callback=AsyncCallback(MissedDeadlineNotifier, kwargs={{"alert_name": "probe not done in 20 s", "path": {path!r}}}),
        name="probe not done in 20 s",
    ),
)
def probe():
    @task
    def slow() -> None:
        time.sleep(40)

    slow()


probe()
"""

CONFIG = """
ledger_url = "{ledger}"
state_dir = "{state}"
loop_seconds = 1
replica = "acceptance"

[alerts]
webhook_url = "{webhook}"
reminder_seconds = 3600
backoff_seconds = 1
backoff_max_seconds = 5

[checks.api]
kind = "api_health"
url = "{api}/api/v2/monitor/health"
period_seconds = 2
grace_seconds = 600

[checks.heartbeat]
period_seconds = {period}
grace_seconds = {grace}
max_lag_seconds = 60
"""


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.time()
        self.events: list[tuple[float, str]] = []

    def mark(self, what: str, at: float | None = None) -> float:
        at = time.time() if at is None else at
        self.events.append((at, what))
        print(f"  t={at - self.t0:7.1f}s  {what}", flush=True)
        return at

    def dump(self, title: str) -> str:
        lines = [title] + [f"  t={a - self.t0:7.1f}s  {w}" for a, w in sorted(self.events)]
        print("\n".join(lines), flush=True)
        return "\n".join(lines)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, logs: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def alerts(receiver: AlertReceiver, check: str = "heartbeat") -> list[dict[str, Any]]:
    return [
        {**r["message"]["onceflow"], "received_at": r["received_at"], "text": r["message"]["text"]}
        for r in receiver.records()
        if r["kind"] == "webhook" and not r.get("refused") and r["message"]["onceflow"]["check"] == check
    ]


def last_beat(ledger: str) -> float | None:
    engine = sa.create_engine(ledger)
    try:
        if not sa.inspect(engine).has_table("onceflow_heartbeats"):
            return None
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT MAX(started_at) FROM onceflow_heartbeats")).scalar()
    finally:
        engine.dispose()


def incident_since(ledger: str) -> float:
    engine = sa.create_engine(ledger)
    try:
        with engine.connect() as conn:
            return float(
                conn.execute(
                    sa.text("SELECT since FROM watchdog_incidents WHERE check_name = 'heartbeat'")
                ).scalar_one()
            )
    finally:
        engine.dispose()


def health(api: str) -> str:
    try:
        with urllib.request.urlopen(f"{api}/api/v2/monitor/health", timeout=5) as r:
            body = json.loads(r.read())
        return ", ".join(f"{k}={v.get('status')}" for k, v in body.items() if isinstance(v, dict))
    except Exception as exc:
        return f"error {exc!r}"


def test_the_watchdog_sees_a_paused_dag_a_hung_and_a_killed_scheduler(
    airflow_cluster_factory: Callable[..., Any], postgres_url: str, tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "dags" / "heartbeat.py", dags / "heartbeat.py")
    deadline_file = tmp_path / "missed.jsonl"
    (dags / "watchdog_probe.py").write_text(textwrap.dedent(PROBE.format(path=str(deadline_file))))
    conn = json.dumps({"conn_type": "postgres", "extra": {"sqlalchemy_url": postgres_url}})
    cluster = airflow_cluster_factory(
        dags_folder=dags,
        env={"ONCEFLOW_HEARTBEAT_SCHEDULE": "5s", "AIRFLOW_CONN_ONCEFLOW_LEDGER": conn},
        pools={"onceflow_heartbeat": 1},
    )
    receiver = AlertReceiver(tmp_path / "received.jsonl").start()
    config = tmp_path / "watchdog.toml"
    config.write_text(
        CONFIG.format(
            ledger=postgres_url,
            state=tmp_path / "state",
            webhook=receiver.webhook_url,
            api=cluster.api_url,
            period=PERIOD,
            grace=GRACE,
        )
    )
    log = (tmp_path / "watchdog.log").open("ab")
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "onceflow.watchdog", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    scheduler = cluster._procs["scheduler"]
    stopped = False
    try:

        def logs() -> str:
            return (tmp_path / "watchdog.log").read_text()[-4000:] + cluster.log_tails()

        cluster.wait_for_dag("heartbeat")
        cluster.wait_for_dag("watchdog_probe")
        cluster.cli("dags", "unpause", "heartbeat")
        wait_until(lambda: last_beat(postgres_url), 180, "the first beat", logs())

        # -- 1. the heartbeat DAG paused ------------------------------------------------------
        paused = Timeline()
        paused.mark("`airflow dags pause heartbeat` started (the CLI takes seconds to start)")
        cluster.cli("dags", "pause", "heartbeat")
        wait_until(lambda: alerts(receiver), PERIOD + GRACE + 60, "the paused alert", logs())
        [down] = alerts(receiver)
        paused.mark("last beat (started)", last_beat(postgres_url))
        paused.mark(
            f"watchdog alert received: {down['kind']} incident {down['incident']}", down["received_at"]
        )
        paused.mark("`airflow dags unpause heartbeat` started")
        cluster.cli("dags", "unpause", "heartbeat")
        wait_until(lambda: len(alerts(receiver)) == 2, 120, "the recovery", logs())
        recovery = alerts(receiver)[1]
        paused.mark("watchdog recovery received", recovery["received_at"])
        assert [(a["kind"], a["incident"]) for a in alerts(receiver)] == [("down", 1), ("recovery", 1)]
        assert down["received_at"] - last_beat_before(down) <= PERIOD + GRACE + 10  # + loop, delivery
        paused.dump("TIMELINE heartbeat DAG paused")

        # -- 2. the scheduler hung (SIGSTOP) ---------------------------------------------------
        hung = Timeline()
        run_id = cluster.trigger("watchdog_probe", run_id="probe_during_hang")
        hung.mark("probe run triggered", hung.t0)
        wait_until(
            lambda: any(ti["state"] == "running" for ti in cluster.task_instances("watchdog_probe", run_id)),
            120,
            "the probe's task running",
            logs(),
        )
        [deadline_row] = cluster.query(
            "SELECT d.deadline_time FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id WHERE r.run_id = :r",
            r=run_id,
        )
        due = _epoch(deadline_row["deadline_time"])
        os.kill(scheduler.pid, signal.SIGSTOP)
        stopped = True
        t_stop = hung.mark(f"SIGSTOP scheduler (pid {scheduler.pid})")
        hung.mark("probe run's Deadline Alert due (queued_at + 20 s)", due)
        hung.mark(f"api-server health during the hang: {health(cluster.api_url)}")
        wait_until(lambda: len(alerts(receiver)) == 3, PERIOD + GRACE + 60, "the hang alert", logs())
        hang_alert = alerts(receiver)[2]
        hung.mark("last beat (started)", last_beat(postgres_url))
        hung.mark(
            f"watchdog alert received: {hang_alert['kind']} incident {hang_alert['incident']}",
            hang_alert["received_at"],
        )
        hung.mark(f"api-server health when the watchdog alerted: {health(cluster.api_url)}")
        assert (hang_alert["kind"], hang_alert["incident"]) == ("down", 2)
        # The incident is dated from the evidence (last beat + period + grace), read by plain SQL;
        # the loose bound on delivery only catches a watchdog that waits for something else.
        beat_at = last_beat(postgres_url) or 0.0
        assert incident_since(postgres_url) == pytest.approx(beat_at + PERIOD + GRACE)
        assert hang_alert["received_at"] - beat_at <= PERIOD + GRACE + 10
        # hold the hang until well after the probe's deadline: Airflow says nothing
        wait_until(lambda: time.time() > due + 15, 120, "the probe's deadline to pass")
        hung.mark(f"api-server health, still hung: {health(cluster.api_url)}")
        hung.mark(f"Deadline Alert records during the hang: {len(read_alert_records(deadline_file))}")
        assert read_alert_records(deadline_file) == []
        os.kill(scheduler.pid, signal.SIGCONT)
        stopped = False
        hung.mark("SIGCONT scheduler")
        wait_until(lambda: len(alerts(receiver)) == 4, 120, "the recovery after SIGCONT", logs())
        hung.mark("watchdog recovery received", alerts(receiver)[3]["received_at"])
        assert (alerts(receiver)[3]["kind"], alerts(receiver)[3]["incident"]) == ("recovery", 2)
        records = wait_until(
            lambda: read_alert_records(deadline_file), 120, "the late Deadline Alert", logs()
        )
        hung.mark("Deadline Alert callback recorded (after the hang)", Path(deadline_file).stat().st_mtime)
        assert [r["run_id"] for r in records] == [run_id]
        assert t_stop < due
        hung.dump("TIMELINE scheduler SIGSTOP / SIGCONT")

        # -- 3. the scheduler killed outright --------------------------------------------------
        killed = Timeline()
        os.kill(scheduler.pid, signal.SIGKILL)
        killed.mark(f"SIGKILL scheduler (pid {scheduler.pid})")
        wait_until(lambda: len(alerts(receiver)) == 5, PERIOD + GRACE + 60, "the killed alert", logs())
        dead = alerts(receiver)[4]
        killed.mark("last beat (started)", last_beat(postgres_url))
        killed.mark(
            f"watchdog alert received: {dead['kind']} incident {dead['incident']}", dead["received_at"]
        )
        killed.mark(f"api-server health after the kill: {health(cluster.api_url)}")
        assert (dead["kind"], dead["incident"]) == ("down", 3)
        assert "Runbook: docs/watchdog.md#check-heartbeat" in dead["text"]
        killed.dump("TIMELINE scheduler SIGKILL")
        assert watchdog.poll() is None
    finally:
        if stopped:
            os.kill(scheduler.pid, signal.SIGCONT)
        watchdog.terminate()
        watchdog.wait(30)
        receiver.stop()


def last_beat_before(alert: dict[str, Any]) -> float:
    started = alert["evidence"].get("last_beat_started")
    from datetime import datetime

    return datetime.fromisoformat(started).timestamp()


def _epoch(value: Any) -> float:
    from datetime import datetime, timezone

    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
