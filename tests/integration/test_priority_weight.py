"""RecentFirstWeightStrategy finds a run the way the scheduler creates it, and leaves other sessions alone.

A task instance the scheduler is creating has no run attached: the strategy reads the run from the
thread's scoped session, where the new run is flushed. The API server creates runs in a session of
its own; its request threads may still have an idle scoped session from an earlier request, which
the strategy must not drag into a transaction (a pooled connection held, with a lock on dag_run).
The real-scheduler ordering is ``tests/acceptance/test_priority_pool.py``.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

from onceflow.priority import EPOCH, RECENCY_STEP, RecentFirstWeightStrategy


def run_less_ti(dag_id: str, run_id: str) -> SimpleNamespace:
    """What ``TaskInstance.insert_mapping`` hands the strategy, reduced to what it reads."""
    return SimpleNamespace(task=None, dag_id=dag_id, run_id=run_id)


def test_a_run_flushed_in_the_threads_session_gives_the_weight(airflow_db: object) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType

    start = dt.datetime(2024, 10, 26, 22, tzinfo=dt.timezone.utc)
    end = start + dt.timedelta(hours=25)
    dag_id, run_id = "weight_probe", "scheduled__2024-10-26T22:00:00+00:00"
    with create_session() as session:
        session.add(
            DagRun(
                dag_id=dag_id,
                run_id=run_id,
                logical_date=start,
                data_interval=(start, end),
                run_after=end,
                run_type=DagRunType.SCHEDULED,
            )
        )
        session.flush()
        weight = RecentFirstWeightStrategy().get_weight(run_less_ti(dag_id, run_id))  # type: ignore[arg-type]
        session.rollback()

    assert weight == (end - EPOCH) // dt.timedelta(hours=1) * RECENCY_STEP


def test_an_idle_scoped_session_is_left_idle(airflow_db: object) -> None:
    from airflow import settings
    from airflow.utils.session import create_session

    with create_session():  # an earlier request of this thread used it; closed, not removed
        pass
    session = settings.Session()
    assert not session.in_transaction()

    before = dt.datetime.now(dt.timezone.utc)
    weight = RecentFirstWeightStrategy().get_weight(run_less_ti("api_probe", "manual__x"))  # type: ignore[arg-type]

    assert not session.in_transaction(), "the strategy began a transaction in the thread's idle session"
    # No run to read: ranked as due now.
    assert weight >= (before - EPOCH) // dt.timedelta(hours=1) * RECENCY_STEP


def test_a_dag_serialized_with_the_former_strategy_name_still_loads(airflow_db: object) -> None:
    """DAGs stored before issue 12 name ``NightlyFirstWeightStrategy``; the scheduler must load them."""
    import json

    import pendulum
    from airflow.sdk import DAG
    from airflow.sdk.bases.operator import BaseOperator
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("former_weight_name", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC")) as dag:
        BaseOperator(task_id="load", weight_rule=RecentFirstWeightStrategy())
    text = json.dumps(DagSerialization.to_dict(dag))
    new, old = "onceflow.priority.RecentFirstWeightStrategy", "onceflow.priority.NightlyFirstWeightStrategy"
    assert new in text

    loaded = DagSerialization.from_dict(json.loads(text.replace(new, old)))

    rule = loaded.get_task("load").weight_rule
    assert type(rule).__name__ == "NightlyFirstWeightStrategy"
    assert isinstance(rule, RecentFirstWeightStrategy)
