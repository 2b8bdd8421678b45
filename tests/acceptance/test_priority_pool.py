"""Priority weight only matters when runs compete for the same pool's slots (real scheduler).

A ``slot_holder`` task occupies one slot of ``onceflow_warehouse`` until the test releases it.
Meanwhile the probe DAG gets its nightly (scheduled) run and a three-day backfill, all in the same
pool, with :class:`~onceflow.priority.NightlyFirstWeightStrategy` as ``weight_rule``.

* One slot: all four task instances wait behind the holder; when it lets go the scheduler starts
  the nightly run first, although every backfill day has an older logical date (which is what
  wins among equal weights), then the backfill days oldest first, one at a time.
* Eight slots: nothing waits. Every probe task starts and finishes while the holder still holds
  its slot, so there was nothing for the weights to decide, although they are the same weights.
"""

from __future__ import annotations

import datetime as dt
import itertools
import textwrap
import time
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

pytestmark = pytest.mark.real_airflow

POOL = "onceflow_warehouse"

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

from onceflow.priority import NightlyFirstWeightStrategy


@dag(
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2020, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=8,
    tags=["test"],
    doc_md="One short load per day in the warehouse pool.",
    default_args={{"owner": "onceflow", "retries": 0, "pool": "{pool}",
                   "weight_rule": NightlyFirstWeightStrategy()}},
)
def {probe}():
    @task
    def load() -> None:
        pass

    load()


{probe}()
"""

PLUGIN = """
from onceflow.priority import OnceflowPriorityPlugin  # noqa: F401  (the plugins folder registers it)
"""


def poll(predicate: Callable[[], Any], *, timeout: float, what: str, cluster: Any) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.log_tails()}")


def run_competition(cluster: Any, dags: Path, release: Path, slots: int) -> dict[str, Any]:
    """Hold a slot, create the nightly run and a 3-day backfill, release, return what Airflow recorded."""
    from onceflow.testing.airflow_cluster import set_pools

    set_pools({POOL: slots})  # the scheduler reads pool sizes from the metadata DB every loop
    # DAG ids per experiment: runs of the other experiment must not satisfy this one's waits.
    holder_id, probe_id = f"slot_holder_{slots}", f"priority_probe_{slots}"
    (dags / f"{holder_id}.py").write_text(
        textwrap.dedent(HOLDER_DAG.format(pool=POOL, release=str(release), holder=holder_id))
    )
    holder_run = cluster.trigger(holder_id)
    poll(
        lambda: [t for t in cluster.task_instances(holder_id, holder_run) if t["state"] == "running"],
        timeout=120,
        what="the holder to take its slot",
        cluster=cluster,
    )

    (dags / f"{probe_id}.py").write_text(textwrap.dedent(PROBE_DAG.format(pool=POOL, probe=probe_id)))
    cluster.wait_for_dag(probe_id)
    today = dt.datetime.now(dt.timezone.utc).date()
    cluster.cli(
        "backfill",
        "create",
        "--dag-id",
        probe_id,
        "--from-date",
        (today - dt.timedelta(days=6)).isoformat(),
        "--to-date",
        (today - dt.timedelta(days=4)).isoformat(),
    )

    def probe_tis(states: set[str]) -> list[dict[str, Any]] | None:
        tis = cluster.task_instances(probe_id)
        return tis if len(tis) == 4 and all(t["state"] in states for t in tis) else None

    # One slot: all four compete (scheduled, none started). Many: all done without the holder's slot.
    waiting_for = {"scheduled"} if slots == 1 else {"success"}
    poll(lambda: probe_tis(waiting_for), timeout=180, what=f"probe tasks {waiting_for}", cluster=cluster)
    release.touch()
    assert cluster.wait_for_run(holder_id, holder_run, timeout=120) == "success"
    tis = poll(lambda: probe_tis({"success"}), timeout=180, what="probe tasks to succeed", cluster=cluster)
    [holder] = cluster.task_instances(holder_id, holder_run)
    runs = {r["run_id"]: r for r in cluster.dag_runs(probe_id)}
    return {"holder": holder, "tis": sorted(tis, key=lambda t: t["start_date"]), "runs": runs}


def test_priority_weights_decide_only_when_the_pool_is_short_of_slots(
    airflow_cluster_factory: Callable[..., Any], tmp_path: Path
) -> None:
    """Both experiments on one cluster (starting one is the costly part): one slot, then eight."""
    dags, plugins = tmp_path / "dags", tmp_path / "plugins"
    dags.mkdir()
    plugins.mkdir()
    (plugins / "onceflow_priority_plugin.py").write_text(PLUGIN)
    cluster = airflow_cluster_factory(
        dags_folder=dags, pools={POOL: 1}, env={"AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins)}
    )

    # One slot: the nightly run goes before older backfill days.
    seen = run_competition(cluster, dags, tmp_path / "release_1", slots=1)
    tis, holder, runs = seen["tis"], seen["holder"], seen["runs"]
    order = [runs[t["run_id"]]["run_type"] for t in tis]
    assert order == ["scheduled", "backfill", "backfill", "backfill"]
    backfill_days = [runs[t["run_id"]]["logical_date"] for t in tis[1:]]
    assert backfill_days == sorted(backfill_days)
    assert runs[tis[0]["run_id"]]["logical_date"] > max(backfill_days)  # newest day, yet first
    assert [t["priority_weight"] for t in tis] == [1001, 1, 1, 1]
    # They really competed: nobody started before the holder let go, then one at a time.
    assert tis[0]["start_date"] >= holder["end_date"]
    for earlier, later in itertools.pairwise(tis):
        assert later["start_date"] >= earlier["end_date"]

    # Eight slots: the same weights order nothing.
    seen = run_competition(cluster, dags, tmp_path / "release_8", slots=8)
    tis, holder, runs = seen["tis"], seen["holder"], seen["runs"]
    assert sorted(runs[t["run_id"]]["run_type"] for t in tis) == [
        "backfill",
        "backfill",
        "backfill",
        "scheduled",
    ]
    assert sorted(t["priority_weight"] for t in tis) == [1, 1, 1, 1001]
    # Every probe task ran to the end while the holder still held its slot: none waited for one.
    assert all(holder["start_date"] <= t["start_date"] and t["end_date"] <= holder["end_date"] for t in tis)
