"""Deadline Alerts through the real scheduler and triggerer: a late day is recorded, an on-time one is not.

The probe DAGs carry the same ``deadline=`` as ``daily_sales`` (:func:`daily_load_deadline`).
A scheduled run the scheduler creates (catching up) for a day years old is due long ago, so the
scheduler marks its deadline missed and the triggerer runs :class:`MissedDeadlineNotifier`; a
run for today is due tomorrow at 07:00 and finishes first, so Airflow prunes its deadline and
nothing is recorded. A manual re-run of an old day, asked for after that day's due time, gets no
deadline at all (the day's scheduled run had its own): no alert.

The late probe's first DAG version is dated back before that day: a day due before the DAG was
first deployed gets no deadline (a fresh deployment's first run is not "late"), so the test
plays a DAG that was deployed long ago and whose scheduler was down.

A second probe has daily_sales' timetable too (local midnights in Europe/Amsterdam): backfills
of the days around both 2024 DST changes get no deadline (their 07:00 passed before they ran;
``tests/integration/test_deadline_dst.py`` evaluates those days' deadlines as the scheduler does),
and the scheduler's own newest run gets 07:00 local on the next day, as Airflow itself computed
and stored it (the custom reference, found through the plugin).
"""

from __future__ import annotations

import datetime as dt
import textwrap
import time
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text

from onceflow.notifications.deadline import read_alert_records

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.real_airflow

DAG_ID = "deadline_probe"

PROBE_DAG = """
import pendulum
from airflow.sdk import dag, task

from onceflow.notifications.deadline import daily_load_deadline


@dag(
    dag_id="{dag_id}",
    schedule=None,
    start_date=pendulum.datetime(2019, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
    doc_md="Carries daily_sales' deadline; its task finishes at once.",
    default_args={{"owner": "onceflow", "retries": 0}},
    deadline=daily_load_deadline(business_timezone="Europe/Amsterdam", path={alerts!r}),
)
def probe():
    @task
    def load() -> None:
        pass

    load()


probe()
"""


LATE_DAG_ID = "deadline_late_probe"

# daily_sales' timetable, one day (2 January 2020, Amsterdam), caught up by the scheduler.
LATE_PROBE_DAG = """
import pendulum
from airflow.sdk import CronDataIntervalTimetable, dag, task

from onceflow.notifications.deadline import daily_load_deadline


@dag(
    dag_id="{dag_id}",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="Europe/Amsterdam"),
    start_date=pendulum.datetime(2020, 1, 2, tz="Europe/Amsterdam"),
    end_date=pendulum.datetime(2020, 1, 2, tz="Europe/Amsterdam"),
    catchup=True,
    # Unpaused by the test once parsed: a run the scheduler creates in the same instant as the
    # first parse sometimes failed to start its task (the executor reported it failed, queued).
    is_paused_upon_creation=True,
    tags=["test"],
    doc_md="daily_sales' timetable and deadline for one day in 2020; its task finishes at once.",
    default_args={{"owner": "onceflow", "retries": 0}},
    deadline=daily_load_deadline(business_timezone="Europe/Amsterdam", path={alerts!r}),
)
def probe():
    @task
    def load() -> None:
        pass

    load()


probe()
"""

DST_DAG_ID = "deadline_dst_probe"

DST_PROBE_DAG = """
import pendulum
from airflow.sdk import CronDataIntervalTimetable, dag, task

from onceflow.notifications.deadline import daily_load_deadline


@dag(
    dag_id="{dag_id}",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="Europe/Amsterdam"),
    start_date=pendulum.datetime(2024, 1, 1, tz="Europe/Amsterdam"),
    catchup=False,
    max_active_runs=8,
    tags=["test"],
    doc_md="daily_sales' timetable and deadline; its task finishes at once.",
    default_args={{"owner": "onceflow", "retries": 0}},
    deadline=daily_load_deadline(business_timezone="Europe/Amsterdam", path={alerts!r}),
)
def probe():
    @task
    def load() -> None:
        pass

    load()


probe()
"""


def component_lines(cluster: Any, text: str) -> str:
    """Every line of the cluster's component logs that mentions ``text`` (why a run failed)."""
    found = []
    for path in sorted(cluster.workdir.glob("*.log")):
        found += [
            f"{path.name}: {line}" for line in path.read_text(errors="replace").splitlines() if text in line
        ]
    return "\n".join(found[-80:])


def wait_for_alerts(path: Path, count: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = read_alert_records(path)
        if len(records) >= count:
            return records
        time.sleep(1.0)
    return read_alert_records(path)


@pytest.mark.slow  # 104 s; make test checks each deadline (23/25-h days) in the backfill acceptance
def test_a_late_day_fires_the_notifier_and_an_on_time_day_does_not(
    airflow_cluster_factory: Callable[..., Any], tmp_path: Path
) -> None:
    alerts = tmp_path / "alerts" / "missed.jsonl"
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{DAG_ID}.py").write_text(textwrap.dedent(PROBE_DAG.format(dag_id=DAG_ID, alerts=str(alerts))))
    dst_alerts = tmp_path / "alerts" / "dst.jsonl"
    (dags / f"{DST_DAG_ID}.py").write_text(
        textwrap.dedent(DST_PROBE_DAG.format(dag_id=DST_DAG_ID, alerts=str(dst_alerts)))
    )
    (dags / f"{LATE_DAG_ID}.py").write_text(
        textwrap.dedent(LATE_PROBE_DAG.format(dag_id=LATE_DAG_ID, alerts=str(alerts)))
    )
    cluster = airflow_cluster_factory(dags_folder=dags)

    today = dt.datetime.now(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    late_runs: list[dict[str, Any]] = []  # data day 2 January 2020, Amsterdam: the scheduler names it
    on_time = cluster.trigger(DAG_ID, run_id="on_time_day", logical_date=today.isoformat())
    cluster.wait_for_dag(DST_DAG_ID)
    # A re-run of an old day by hand (loads yesterday, as `dags trigger` infers it), asked for
    # after that day's 07:00 or finishing before it: no alert either way. Before, its deadline
    # came from the logical date (16 June 2024 07:00) and fired at once. (Not a day the
    # backfills below create.)
    rerun = cluster.trigger(DST_DAG_ID, run_id="rerun_old_day", logical_date="2024-06-14T22:00:00+00:00")
    cluster.wait_for_dag(LATE_DAG_ID)
    with cluster._engine.begin() as conn:  # deployed in 2019: 2 January 2020 is late, not pre-deployment
        conn.execute(
            text("UPDATE dag_version SET created_at = :at WHERE dag_id = :d"),
            {"at": dt.datetime(2019, 1, 1, tzinfo=dt.timezone.utc), "d": LATE_DAG_ID},
        )
    cluster.cli("dags", "unpause", LATE_DAG_ID)
    deadline = time.monotonic() + 240
    while not late_runs and time.monotonic() < deadline:
        late_runs = cluster.query("SELECT run_id, run_type FROM dag_run WHERE dag_id = :d", d=LATE_DAG_ID)
        time.sleep(1.0)
    assert [str(r["run_type"]) for r in late_runs] == ["scheduled"], (late_runs, cluster.log_tails())
    late = late_runs[0]["run_id"]
    assert cluster.wait_for_run(LATE_DAG_ID, late, timeout=240) == "success", cluster.task_log_tails(
        LATE_DAG_ID
    ) + component_lines(cluster, LATE_DAG_ID)
    assert cluster.wait_for_run(DAG_ID, on_time, timeout=240) == "success", component_lines(cluster, on_time)
    assert cluster.wait_for_run(DST_DAG_ID, rerun, timeout=240) == "success", component_lines(cluster, rerun)

    records = wait_for_alerts(alerts, 1, timeout=120)
    time.sleep(5.0)  # give a wrong alert for the re-run or on-time run the time to land too
    records = read_alert_records(alerts)

    assert [r["run_id"] for r in records] == [late], cluster.log_tails()
    [record] = records
    assert record["dag_id"] == LATE_DAG_ID
    assert record["alert"] == "daily_sales not loaded by 07:00"
    assert record["run_type"] == "scheduled"
    assert record["deadline_time"] == "2020-01-03T06:00:00+00:00"  # 07:00 CET the next day
    assert record["data_day"] == "2020-01-02"
    assert record["suppressed"] is False

    probe_deadlines = cluster.query(
        "SELECT r.run_id, d.missed, c.state FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id "
        "JOIN callback c ON c.id = d.callback_id WHERE r.dag_id IN (:a, :b)",
        a=DAG_ID,
        b=LATE_DAG_ID,
    )
    # The on-time run's deadline was pruned when the run finished before it.
    assert [(d["run_id"], bool(d["missed"])) for d in probe_deadlines] == [(late, True)]
    assert wait_for_callback_state(cluster, late, LATE_DAG_ID) == "success"
    rerun_deadlines = cluster.query(
        "SELECT d.missed FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id "
        "WHERE r.dag_id = :dag_id AND r.run_id = :run_id",
        dag_id=DST_DAG_ID,
        run_id=rerun,
    )
    assert not any(bool(d["missed"]) for d in rerun_deadlines)

    # The DST days, backfilled: Airflow stores each run's deadline when it creates the run.
    from onceflow.testing.sales_backfill import create_backfill, local_days, wait_for_backfill

    deadlines: dict[tuple[str, str], str] = {}
    for first, last in (
        (dt.date(2024, 3, 30), dt.date(2024, 3, 31)),
        (dt.date(2024, 10, 26), dt.date(2024, 10, 27)),
    ):
        backfill = create_backfill(
            cluster, DST_DAG_ID, first, last, timezone="Europe/Amsterdam", max_active_runs=2
        )
        runs = wait_for_backfill(cluster, backfill, timeout=300)
        assert [r["state"] for r in runs] == ["success"] * len(local_days(first, last)), cluster.log_tails()
    for row in cluster.query(
        "SELECT r.logical_date, r.run_type, d.deadline_time FROM deadline d "
        "JOIN dag_run r ON r.id = d.dagrun_id WHERE r.dag_id = :dag_id",
        dag_id=DST_DAG_ID,
    ):
        day = _aware(row["logical_date"]).astimezone(ZoneInfo("Europe/Amsterdam")).date()
        deadlines[(str(row["run_type"]), day.isoformat())] = _aware(row["deadline_time"]).isoformat()
    # A backfill re-loads days whose 07:00 is long past: no deadline, so no "Missed" row in the UI.
    assert {day: due for (kind, day), due in deadlines.items() if kind == "backfill"} == {}
    # The scheduler's own run (catchup=False creates the newest day) gets 07:00 local too.
    scheduled = {day: due for (kind, day), due in deadlines.items() if kind == "scheduled"}
    assert scheduled == {day: _seven_next_day(day) for day in scheduled}


def _seven_next_day(day: str) -> str:
    tz = ZoneInfo("Europe/Amsterdam")
    local = dt.datetime.combine(dt.date.fromisoformat(day) + dt.timedelta(days=1), dt.time(7), tzinfo=tz)
    return local.astimezone(dt.timezone.utc).isoformat()


def _aware(value: Any) -> dt.datetime:
    """A timestamp from the metadata DB (naive UTC on SQLite) as an aware UTC datetime."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def wait_for_callback_state(cluster: Any, run_id: str, dag_id: str, timeout: float = 60.0) -> str | None:
    """The triggerer reports the callback's outcome shortly after running it."""
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        rows = cluster.query(
            "SELECT c.state FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id "
            "JOIN callback c ON c.id = d.callback_id WHERE r.run_id = :run_id AND r.dag_id = :dag_id",
            run_id=run_id,
            dag_id=dag_id,
        )
        state = rows[0]["state"] if rows else None
        if state in ("success", "failed"):
            return state
        time.sleep(1.0)
    return state
