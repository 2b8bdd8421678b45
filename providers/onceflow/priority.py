"""Newest data first when runs compete for a pool's slots: tonight, then the newest backfill days.

The scheduler hands out free pool slots by ``-priority_weight``, then by the oldest logical date.
With equal weights a backfill's old days therefore always win over tonight's run. A task's
``priority_weight`` is fixed per task, not per run, so ordering runs needs a weight strategy that
looks at the run: :class:`RecentFirstWeightStrategy` weighs every task instance by **how recent
its run's data interval is** (the hour its interval ends), then by Airflow's default
``downstream`` weight within a run.

Why the data interval and not the run type: ``airflow backfill create --reprocess-behavior
completed`` clears old *scheduled* runs and re-runs them under their old ``scheduled__`` run ids,
and the clear recomputes the weight before the run's type is changed to ``backfill``; a strategy
that trusts the run id or type gives those old days tonight's rank. The data interval is what
the run loads, whatever created it.

Airflow only deserializes strategies that a plugin registers: :class:`OnceflowPriorityPlugin`
does (entry point ``airflow.plugins``, or a file in the plugins folder). The same plugin registers
the business-time deadline reference of ``daily_sales`` (``onceflow.notifications.deadline_reference``),
and the listener that titles article runs' notes (``onceflow.run_notes``).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from airflow.plugins_manager import AirflowPlugin
from airflow.task.priority_strategy import PriorityWeightStrategy

from onceflow.hitl_guard import RequiredForOptionGuard
from onceflow.local_api_guard import LocalRunGuard
from onceflow.notifications.deadline_reference import BusinessTimeDeadline
from onceflow.run_notes import RUN_NOTES

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance

#: Hours are counted from here; any fixed instant works, an early one keeps weights positive.
EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
#: Weight per hour of recency. The downstream weight (capped below it) orders tasks within a run.
RECENCY_STEP = 100
#: Airflow stores weights as 32-bit integers (``db_safe_priority``); stay inside.
_MAX_WEIGHT = 2**31 - 1
#: An ``absolute`` weight above every :class:`RecentFirstWeightStrategy` weight (those reach about
#: 88 million by 2100): for short tasks that share the pool and must not wait behind a backfill.
AHEAD_OF_RECENT_FIRST = _MAX_WEIGHT


class RecentFirstWeightStrategy(PriorityWeightStrategy):
    """``100 x`` hours from 2000-01-01 to the end of the run's data interval, plus ``downstream``.

    A run whose interval ended later outranks every task of a run whose interval ended earlier,
    whatever their types: tonight's run first, then the newest days of a backfill or reprocess.
    Within one run the ``downstream`` weight (capped at 99) keeps Airflow's default order. Weights
    are absolute (about 23 million in 2026), so in a pool shared with other DAGs' default-weighted
    tasks, these tasks go first.

    Stateless, as Airflow requires. Priority only orders task instances that wait for the same
    pool's slots; with free slots every task starts at once whatever its weight.
    """

    def get_weight(self, ti: TaskInstance) -> int:
        recency = _hours_since_epoch(_interval_end(ti))
        return min(_MAX_WEIGHT, recency * RECENCY_STEP + min(_downstream_weight(ti), RECENCY_STEP - 1))

    def __repr__(self) -> str:
        # A DAG's ``default_args`` are serialized with ``str()`` of each value: the default
        # ``<... object at 0x...>`` changed the DAG's hash, hence its version, on every parse.
        # The importable name is what Airflow stores as a task's ``weight_rule`` anyway.
        return f"{type(self).__module__}.{type(self).__qualname__}"


class NightlyFirstWeightStrategy(RecentFirstWeightStrategy):
    """The former name, registered so DAGs serialized with it still load; the same weights.

    It used to boost runs whose id did not start with ``backfill__``, which gave reprocessed old
    scheduled days tonight's rank (issue 12).
    """


def _downstream_weight(ti: TaskInstance) -> int:
    """Airflow's ``downstream`` rule: the task's weight plus that of everything after it."""
    task = ti.task
    if task is None:
        return 0
    weight = int(task.priority_weight)
    dag = task.get_dag()
    if dag is not None:
        weight += sum(
            int(dag.task_dict[task_id].priority_weight)
            for task_id in task.get_flat_relative_ids(upstream=False)
        )
    return max(0, weight)


def _interval_end(ti: TaskInstance) -> dt.datetime:
    """The end of the TI's run's data interval (else its logical date, else when it may run).

    A task instance that is being cleared or refreshed carries its run. One that the scheduler is
    creating does not (Airflow builds it detached, before inserting it), so its run is read from
    the session that is creating it: the thread's scoped session, where the new run is already
    flushed. Without one (a manual run created through the REST API, which uses its own session),
    the run is treated as due now: someone asked for it, and it ranks with tonight's run.
    """
    run: Any = _attached_run(ti)
    if run is not None:
        found = _first(run.data_interval_end, run.logical_date, run.run_after)
        if found is not None:
            return found
    row = _run_from_scoped_session(ti.dag_id, ti.run_id)
    if row is not None:
        found = _first(*row)
        if found is not None:
            return found
    return dt.datetime.now(dt.timezone.utc)


def _attached_run(ti: TaskInstance) -> Any:
    from sqlalchemy import inspect

    state: Any = inspect(ti, raiseerr=False)
    if state is None or state.transient or state.pending:
        return None  # accessing the relationship would find nothing (and must not load)
    try:
        return ti.dag_run
    except Exception:  # detached without a session: fall back to the scoped session
        return None


def _run_from_scoped_session(dag_id: str, run_id: str) -> tuple[Any, ...] | None:
    from airflow import settings

    scoped = getattr(settings, "Session", None)
    # Only a session this thread already has: that is the one creating the run. Opening a new
    # one would leave it in the thread's registry (a leaked connection in a server thread pool).
    if scoped is None or not scoped.registry.has():
        return None
    from airflow.models.dagrun import DagRun
    from sqlalchemy import select

    session = scoped()
    # The session creating a run has flushed it, so it is in a transaction. An idle one (the API
    # server creates runs in its own session) must stay idle: a query would begin a transaction
    # that holds a pooled connection, and a lock on dag_run, until the thread next uses it.
    if not session.in_transaction():
        return None
    with session.no_autoflush:
        row = session.execute(
            select(DagRun.data_interval_end, DagRun.logical_date, DagRun.run_after).where(
                DagRun.dag_id == dag_id, DagRun.run_id == run_id
            )
        ).first()
    return tuple(row) if row is not None else None


def _first(*values: dt.datetime | None) -> dt.datetime | None:
    return next((v for v in values if v is not None), None)


def _hours_since_epoch(when: dt.datetime) -> int:
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)  # the metadata DB stores UTC
    return max(0, int((when - EPOCH).total_seconds() // 3600))


class OnceflowPriorityPlugin(AirflowPlugin):
    """Registers onceflow's scheduler-side classes, wherever Airflow deserializes a DAG.

    :class:`RecentFirstWeightStrategy` (and its former name) as ``weight_rule`` values, and
    :class:`~onceflow.notifications.deadline_reference.BusinessTimeDeadline` as a deadline
    reference (the scheduler refuses to evaluate an unregistered one), and
    :class:`~onceflow.local_api_guard.LocalRunGuard` in front of the api-server (inert unless
    ``onceflow up`` configured it), and
    :class:`~onceflow.hitl_guard.RequiredForOptionGuard` (a review's note is required to Reject), and
    :data:`~onceflow.run_notes.RUN_NOTES`, the dag-run listener that puts an article's title into
    its run's note when the run ends.
    """

    name = "onceflow_priority"
    priority_weight_strategies = [RecentFirstWeightStrategy, NightlyFirstWeightStrategy]
    deadline_references = [BusinessTimeDeadline]
    fastapi_root_middlewares = [
        {"name": "onceflow_local_run_guard", "middleware": LocalRunGuard},
        {"name": "onceflow_hitl_required_for", "middleware": RequiredForOptionGuard},
    ]
    listeners = [RUN_NOTES]
