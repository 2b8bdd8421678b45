"""Newest data first under pool contention, with a reprocessing backfill in flight (real scheduler).

The probe DAG runs one short task a day (data-interval timetable, UTC) in ``onceflow_warehouse``
with :class:`~onceflow.priority.RecentFirstWeightStrategy` as ``weight_rule``. The pool has one
slot. The scenario of issue 12:

1. Four days ran as ordinary *scheduled* runs (run ids ``scheduled__...``), the newest being
   tonight's; the weights the scheduler gave them when it created them already rank by recency.
2. A ``slot_holder`` task takes the only slot.
3. ``airflow backfill create --reprocess-behavior completed`` re-runs the three older days:
   Airflow clears them under their old ``scheduled__`` run ids (and recomputes their weights then).
4. Tonight's run is cleared too (say its load is retried) and waits with them.
5. The holder lets go. The metadata DB must show the tasks starting one at a time, tonight's
   first, then the reprocessed days newest first. A strategy that boosts ``scheduled__`` run ids
   gives all four the same weight, and the scheduler then starts the *oldest* day first.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import textwrap
import time
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

from pathlib import Path

# The metadata DB is PostgreSQL: on SQLite, the reprocessing backfill's clear and the scheduler
# lock each other out ("database is locked" halfway through ``airflow backfill create``).
pytestmark = [pytest.mark.real_airflow, pytest.mark.postgres]

POOL = "onceflow_warehouse"
HOLDER_ID, PROBE_ID = "slot_holder", "priority_probe"

HOLDER_DAG = """
import time
from pathlib import Path

import pendulum
from airflow.sdk import dag, task


@dag(schedule=None, start_date=pendulum.datetime(2020, 1, 1, tz="UTC"), catchup=False, tags=["test"],
     doc_md="Holds one warehouse slot until the release file exists.",
     default_args={{"owner": "onceflow", "retries": 0}})
def {holder}():
    @task(pool="{pool}")
    def hold() -> None:
        while not Path({release!r}).exists():
            time.sleep(0.2)

    hold()


{holder}()
"""

PROBE_DAG = """
import pendulum
from airflow.sdk import CronDataIntervalTimetable, dag, task

from onceflow.priority import RecentFirstWeightStrategy


@dag(
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.parse({start!r}),
    catchup=True,
    max_active_runs=8,
    tags=["test"],
    doc_md="One short load per day in the warehouse pool.",
    default_args={{"owner": "onceflow", "retries": 0, "pool": "{pool}",
                   "weight_rule": RecentFirstWeightStrategy()}},
)
def {probe}():
    @task
    def load() -> None:
        pass

    load()


{probe}()
"""


def poll(predicate: Callable[[], Any], *, timeout: float, what: str, cluster: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.log_tails()}")


def write_probe(dags: Path, today: dt.date) -> None:
    start = dt.datetime.combine(today - dt.timedelta(days=4), dt.time(0), tzinfo=dt.timezone.utc)
    source = PROBE_DAG.format(start=start.isoformat(), pool=POOL, probe=PROBE_ID)
    (dags / f"{PROBE_ID}.py").write_text(textwrap.dedent(source))


def test_tonight_then_the_newest_reprocessed_days_get_the_only_slot(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from onceflow.testing.sales_backfill import standalone_cluster

    dags = tmp_path / "dags"
    dags.mkdir()
    with contextlib.ExitStack() as stack:
        if request.getfixturevalue("airflow_env").is_postgres:
            cluster = request.getfixturevalue("airflow_cluster_factory")(dags_folder=dags, pools={POOL: 1})
        else:
            cluster = stack.enter_context(standalone_cluster(tmp_path / "airflow", dags, pools={POOL: 1}))
        compete(cluster, dags, tmp_path)


def compete(cluster: Any, dags: Path, tmp_path: Path) -> None:
    """Steps 1 to 5 of the module docstring, then what the metadata DB recorded."""
    from onceflow.testing.sales_backfill import create_backfill

    today = dt.datetime.now(dt.timezone.utc).date()
    old_days = [today - dt.timedelta(days=n) for n in (4, 3, 2)]  # tonight's run is day -1

    def probe_tis(states: set[str], count: int) -> list[dict[str, Any]] | None:
        tis = cluster.task_instances(PROBE_ID)
        return tis if len(tis) == count and all(t["state"] in states for t in tis) else None

    # 1. Four days run as scheduled runs (catch-up from four days ago up to tonight's interval).
    write_probe(dags, today)
    created = poll(lambda: probe_tis({"success"}, 4), timeout=240, what="4 scheduled days", cluster=cluster)
    runs = {r["run_id"]: r for r in cluster.dag_runs(PROBE_ID)}
    assert {r["run_type"] for r in runs.values()} == {"scheduled"}
    # Weighed when the scheduler created them (it hands the strategy a run-less task instance):
    # one day of recency apart, newest highest.
    created.sort(key=lambda t: runs[t["run_id"]]["data_interval_end"])
    assert all(b["priority_weight"] - a["priority_weight"] == 2400 for a, b in itertools.pairwise(created))
    tonight = runs[created[-1]["run_id"]]

    # 2. The holder takes the only slot.
    release = tmp_path / "release"
    (dags / f"{HOLDER_ID}.py").write_text(
        textwrap.dedent(HOLDER_DAG.format(pool=POOL, release=str(release), holder=HOLDER_ID))
    )
    cluster.wait_for_dag(HOLDER_ID)
    holder_run = cluster.trigger(HOLDER_ID)
    poll(
        lambda: [t for t in cluster.task_instances(HOLDER_ID, holder_run) if t["state"] == "running"],
        timeout=120,
        what="the holder to take its slot",
        cluster=cluster,
    )

    # 3. Reprocess the old days while the slot is taken; 4. tonight's run is cleared as well.
    create_backfill(
        cluster,
        PROBE_ID,
        old_days[0],
        old_days[-1],
        timezone="UTC",
        max_active_runs=8,
        reprocess_behavior="completed",
    )
    poll(lambda: probe_tis({"scheduled", "success"}, 4), timeout=120, what="the reprocess", cluster=cluster)
    logical = str(tonight["logical_date"])[:10]
    cluster.cli("tasks", "clear", PROBE_ID, "--start-date", logical, "--end-date", logical, "--yes")
    poll(lambda: probe_tis({"scheduled"}, 4), timeout=180, what="all four days waiting", cluster=cluster)

    # 5. Release the slot: who gets it, in which order?
    release.touch()
    assert cluster.wait_for_run(HOLDER_ID, holder_run, timeout=120) == "success"
    tis = poll(lambda: probe_tis({"success"}, 4), timeout=240, what="probe tasks to succeed", cluster=cluster)
    tis.sort(key=lambda t: t["start_date"])
    [holder] = cluster.task_instances(HOLDER_ID, holder_run)
    runs = {r["run_id"]: r for r in cluster.dag_runs(PROBE_ID)}

    started = [runs[t["run_id"]] for t in tis]
    # The reprocessed days kept their scheduled__ ids; Airflow made them backfill runs.
    assert all(r["run_id"].startswith("scheduled__") for r in started)
    assert [r["run_type"] for r in started] == ["scheduled", "backfill", "backfill", "backfill"]
    # Newest data interval first: tonight, then the reprocessed days from newest to oldest.
    ends = [r["data_interval_end"] for r in started]
    assert ends == sorted(ends, reverse=True), started
    assert [t["priority_weight"] for t in tis] == sorted((t["priority_weight"] for t in tis), reverse=True)
    # One day of recency outweighs anything within a run (100 per hour).
    assert all(a["priority_weight"] - b["priority_weight"] == 2400 for a, b in itertools.pairwise(tis))
    # They really competed: nobody started before the holder let go, then one at a time.
    assert tis[0]["start_date"] >= holder["end_date"]
    for earlier, later in itertools.pairwise(tis):
        assert later["start_date"] >= earlier["end_date"]
