"""Every daily_sales task has an execution_timeout: a try that hangs anywhere ends and is retried."""

from __future__ import annotations

import datetime as dt

import pytest


def test_every_daily_sales_task_has_an_execution_timeout(airflow_db: object) -> None:
    from onceflow.testing.dag_runner import load_dag

    dag = load_dag("daily_sales")
    timeouts = {t.task_id: t.execution_timeout for t in dag.tasks}
    assert timeouts == {name: dt.timedelta(minutes=120) for name in ("extract", "clean", "load")}


def test_a_task_timeout_that_is_not_positive_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.sales.config import SalesConfig

    monkeypatch.setenv("ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES", "0")
    with pytest.raises(ValueError, match="every task needs a deadline"):
        SalesConfig.from_env()
    monkeypatch.setenv("ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES", "30")
    assert SalesConfig.from_env().task_timeout == dt.timedelta(minutes=30)
