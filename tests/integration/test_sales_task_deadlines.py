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


@pytest.mark.parametrize("raw", ["nan", "inf", "1e-9", "1e300"])
def test_a_task_timeout_that_means_no_deadline_or_cannot_be_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    """'1e-9' minutes became execution_timeout = timedelta(0), which Airflow reads as no timeout
    (``if task.execution_timeout:``); 'nan', 'inf' and '1e300' passed the check and broke the DAG's
    import with a bare ValueError or OverflowError from timedelta."""
    from onceflow.sales.config import SalesConfig

    monkeypatch.setenv("ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES", raw)
    with pytest.raises(ValueError, match="ONCEFLOW_SALES_TASK_TIMEOUT_MINUTES"):
        SalesConfig.from_env()


@pytest.mark.parametrize("raw", ["nan", "-0.1", "1.5"])
def test_a_reject_ratio_that_no_day_can_be_measured_against_is_refused(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    """'nan' made ``reject_ratio > max_reject_ratio`` false for every day: a day of nothing but
    rejects loaded (an empty partition) instead of failing; -0.1 failed every day, 1.5 none."""
    from onceflow.sales.config import SalesConfig

    monkeypatch.setenv("ONCEFLOW_SALES_MAX_REJECT_RATIO", raw)
    with pytest.raises(ValueError, match="ONCEFLOW_SALES_MAX_REJECT_RATIO"):
        SalesConfig.from_env()
