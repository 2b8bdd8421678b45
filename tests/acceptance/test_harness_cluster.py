"""The real-process fixture: a trivial DAG through the real scheduler, on SQLite and PostgreSQL."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from onceflow.testing.airflow_cluster import AirflowCluster
from onceflow.testing.airflow_env import prepare

pytestmark = pytest.mark.real_airflow

TRIVIAL_DAG = textwrap.dedent(
    """
    import pendulum
    from airflow.sdk import dag, task

    @dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
         tags=["test"], default_args={"owner": "onceflow", "retries": 0})
    def harness_trivial():
        @task
        def produce() -> int:
            return 41

        @task
        def consume(value: int) -> int:
            return value + 1

        consume(produce())

    harness_trivial()
    """
)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _write_dag(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "harness_trivial.py").write_text(TRIVIAL_DAG)
    return folder


@pytest.mark.postgres
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_trivial_dag_succeeds_through_the_real_scheduler(
    database: str, tmp_path: Path, postgres_url_factory: object
) -> None:
    """A fresh installation per database kind: migrate, start four components, trigger, succeed."""
    if database == "postgresql":
        postgres_url_factory("probe")  # type: ignore[operator]  # fails in CI, skips elsewhere
    dags = _write_dag(tmp_path / "dags")
    env = prepare(
        dags_folder=dags,
        plugins_folder=tmp_path / "plugins",
        use_postgres=database == "postgresql",
        home=tmp_path / "home",
    )
    try:
        env.migrate()
        cluster = AirflowCluster(env.variables, tmp_path / "cluster")
        with cluster:
            run_id = cluster.trigger("harness_trivial")
            assert cluster.wait_for_run("harness_trivial", run_id, timeout=240) == "success"
            states = {ti["task_id"]: ti["state"] for ti in cluster.task_instances("harness_trivial", run_id)}
            assert states == {"produce": "success", "consume": "success"}
            pids_while_running = cluster.leftover_pids()
            assert len(pids_while_running) >= 4
            # LocalExecutor workers overwrite their environment with setproctitle(); the session
            # net must still count them as ours.
            titles = {_cmdline(pid) for pid in pids_while_running}
            assert any("LocalExecutor" in t for t in titles), titles
        assert cluster.leftover_pids() == []
        assert not [p for p in pids_while_running if _alive(p)]
    finally:
        env.cleanup()


def test_cluster_fixture_leaves_no_process_after_a_failing_body(
    airflow_cluster_factory, tmp_path: Path
) -> None:
    """The fixture's teardown ends every process even when the test body raises."""
    cluster = airflow_cluster_factory(dags_folder=_write_dag(tmp_path / "dags"))
    marker_pids = cluster.leftover_pids()
    assert marker_pids, "components should be running"
    with pytest.raises(ZeroDivisionError):
        _ = 1 / 0  # a failing test body; teardown below must still clean up
    cluster.stop()
    assert cluster.leftover_pids() == []
