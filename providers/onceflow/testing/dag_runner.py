"""Run a DAG in-process with ``dag.test()`` and collect what a test wants to assert on.

``dag.test()`` runs every task in this process against the real metadata database (no
scheduler, no executor), which is the cheapest way to exercise a DAG end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.models.dagrun import DagRun
    from airflow.sdk import DAG


@dataclass
class DagRunResult:
    """The outcome of one run: its state, each task's state and try number, and the XComs pushed."""

    dag_id: str
    run_id: str
    state: str
    ti_states: dict[str, str] = field(default_factory=dict)
    try_numbers: dict[str, int] = field(default_factory=dict)
    xcoms: dict[tuple[str, str], Any] = field(default_factory=dict)
    data_interval_start: datetime | None = None
    data_interval_end: datetime | None = None
    dag_run: DagRun | None = None

    @property
    def succeeded(self) -> bool:
        return self.state == "success"

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        return self.xcoms[(task_id, key)]


def _state(value: object) -> str:
    return str(getattr(value, "value", value))


def collect(dag_id: str, run_id: str) -> DagRunResult:
    """Read a finished (or running) run back from the metadata database."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        dr = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).one()
        result = DagRunResult(
            dag_id=dag_id,
            run_id=run_id,
            state=_state(dr.state),
            data_interval_start=dr.data_interval_start,
            data_interval_end=dr.data_interval_end,
            dag_run=dr,
        )
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        )
        for ti in tis:
            key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
            result.ti_states[key] = _state(ti.state)
            result.try_numbers[key] = ti.try_number
        xcoms = session.scalars(
            select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == run_id)
        )
        for x in xcoms:
            result.xcoms[(x.task_id, x.key)] = XComModel.deserialize_value(x)
        session.expunge_all()
    return result


#: ``mark_success_pattern`` that runs only the claim step of ``article_pipeline`` (tests of the
#: claim, the lanes and the ledger link that do not need the article chain behind it).
FIRST_STEP_ONLY = r"(?!read_claimed_row$).*"


def run_dag(
    dag: DAG,
    *,
    logical_date: datetime | None = None,
    conf: dict[str, Any] | None = None,
    run_after: datetime | None = None,
    mark_success_pattern: str | None = None,
) -> DagRunResult:
    """Run ``dag`` once with ``dag.test()`` and return its run as read back from the metadata DB.

    :param dag: the DAG object, usually taken from a DagBag of the DAG folder so that it is the
        same one the scheduler would see.
    :param logical_date: the run's logical date; for interval timetables the data interval is
        inferred from it the way a manual trigger would.
    :param conf: the run's ``conf`` (``params`` overrides).
    :param run_after: when the run may start (defaults to now).
    :param mark_success_pattern: task ids (regex, full match) marked success without running;
        ``FIRST_STEP_ONLY`` runs only ``article_pipeline``'s ``read_claimed_row``.
    """
    _ensure_serialized(dag)
    kwargs: dict[str, Any] = {"run_conf": conf}
    if logical_date is not None:
        kwargs["logical_date"] = logical_date
    if run_after is not None:
        kwargs["run_after"] = run_after
    if mark_success_pattern is not None:
        kwargs["mark_success_pattern"] = mark_success_pattern
    # Airflow 3.3.2's dag.test() crashes when a run of a DAG with `deadline=` finishes
    # ("'dict' object has no attribute 'hex'" in DagRun.update_state): deadlines are evaluated by
    # the scheduler, so they are tested with real processes and left out of in-process runs.
    deadline = getattr(dag, "deadline", None)
    if deadline:
        dag.deadline = None
    try:
        dr = dag.test(**kwargs)
    finally:
        if deadline:
            dag.deadline = deadline
    return collect(dag.dag_id, dr.run_id)


def _ensure_serialized(dag: DAG) -> None:
    """Write a DAG defined outside the DAG folder (e.g. inside a test) to the metadata DB.

    ``dag.test()`` only serializes DAGs it finds in a configured bundle; an inline DAG would be
    refused with "the dag is not serialized".
    """
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.models.dag_version import DagVersion

    from onceflow.compat import dagbag_module

    DagBag, sync_bag_to_db = dagbag_module().DagBag, dagbag_module().sync_bag_to_db

    if DagVersion.get_version(dag.dag_id):
        return
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(collect_dags=False)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def load_dag(dag_id: str, dags_folder: str | None = None) -> DAG:
    """Parse the DAG folder (the configured one by default) and return one DAG by id."""
    from onceflow.compat import dagbag_module

    bag = dagbag_module().DagBag(dags_folder)
    if dag_id not in bag.dags:
        errors = "\n".join(f"{k}: {v}" for k, v in bag.import_errors.items())
        raise KeyError(f"DAG {dag_id!r} not found in {bag.dag_folder}; import errors:\n{errors}")
    return bag.dags[dag_id]


def dag_runs(dag_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every run of ``dag_id`` in the metadata DB: ``run_id -> (state, conf)``."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return {
            dr.run_id: (str(dr.state), dict(dr.conf or {}))
            for dr in session.scalars(select(DagRun).where(DagRun.dag_id == dag_id))
        }
