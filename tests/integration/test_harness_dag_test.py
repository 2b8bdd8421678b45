"""The in-process runner: ``run_dag`` returns the run, task states and XComs from the metadata DB."""

from __future__ import annotations

import pendulum
import pytest
from airflow.sdk import dag, task


def _make_dag(fail_second: bool = False):  # type: ignore[no-untyped-def]
    @dag(
        dag_id="harness_inline" + ("_failing" if fail_second else ""),
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        default_args={"owner": "onceflow", "retries": 0},
    )
    def harness_inline():
        @task
        def first(**context) -> str:  # type: ignore[no-untyped-def]
            return str(context["params"].get("word", "none"))

        @task
        def second(word: str) -> str:
            if fail_second:
                raise ValueError("bad input: " + word)
            return word.upper()

        second(first())

    return harness_inline()


def test_run_dag_returns_states_and_xcoms(run_dag) -> None:  # type: ignore[no-untyped-def]
    result = run_dag(_make_dag(), logical_date=pendulum.datetime(2024, 3, 1, tz="UTC"), conf={"word": "once"})
    assert result.state == "success"
    assert result.ti_states == {"first": "success", "second": "success"}
    assert result.xcom("first") == "once"
    assert result.xcom("second") == "ONCE"


def test_run_dag_reports_a_failed_task(run_dag) -> None:  # type: ignore[no-untyped-def]
    result = run_dag(_make_dag(fail_second=True), conf={"word": "x"})
    assert result.state == "failed"
    assert result.ti_states["first"] == "success"
    assert result.ti_states["second"] == "failed"
    with pytest.raises(KeyError):
        result.xcom("second")


def test_session_has_its_own_airflow_home(airflow_env) -> None:  # type: ignore[no-untyped-def]
    import os

    assert os.environ["AIRFLOW_HOME"] == str(airflow_env.home)
    assert "onceflow-airflow-" in str(airflow_env.home)
    from airflow.configuration import conf

    assert conf.get("database", "sql_alchemy_conn") == airflow_env.sql_alchemy_conn


def test_run_dag_runs_a_dag_with_a_deadline_alert(run_dag, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """dag.test() cannot finish a run of a DAG with a deadline (Airflow 3.3.2); run_dag leaves the
    deadline to the scheduler and gives the DAG its deadline back afterwards."""
    from onceflow.notifications.deadline import daily_load_deadline

    @dag(
        dag_id="harness_with_deadline",
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        deadline=daily_load_deadline(
            business_timezone="Europe/Amsterdam", path=str(tmp_path / "alerts.jsonl")
        ),
    )
    def harness_with_deadline():
        @task
        def only() -> int:
            return 1

        only()

    the_dag = harness_with_deadline()
    result = run_dag(the_dag, logical_date=pendulum.datetime(2024, 3, 2, tz="UTC"))
    assert result.state == "success"
    assert the_dag.deadline
