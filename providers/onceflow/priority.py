"""Keep scheduled (nightly) runs ahead of backfill runs when they compete for a pool's slots.

The scheduler hands out free pool slots by ``-priority_weight``, then by the oldest logical date.
With equal weights a backfill's old days therefore always win over tonight's run. A task's
``priority_weight`` is fixed per task, not per run, so telling the two apart needs a weight
strategy that looks at the run: :class:`NightlyFirstWeightStrategy` adds :attr:`boost` to every
task instance whose run is not a backfill.

Airflow only deserializes strategies that a plugin registers: :class:`OnceflowPriorityPlugin`
does (load it from the plugins folder or the ``airflow.plugins`` entry point).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.plugins_manager import AirflowPlugin
from airflow.task.priority_strategy import PriorityWeightStrategy
from airflow.utils.types import DagRunType

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance


class NightlyFirstWeightStrategy(PriorityWeightStrategy):
    """The ``downstream`` weight (Airflow's default), plus :attr:`boost` outside backfill runs.

    Stateless, as Airflow requires (parameters are not serialized): subclass to change
    :attr:`boost`. Priority only orders task instances that wait for the same pool's slots; with
    free slots every task starts at once whatever its weight.
    """

    #: Larger than any downstream weight sum in our DAGs, so any non-backfill task ranks first.
    boost: int = 1000

    def get_weight(self, ti: TaskInstance) -> int:
        task = ti.task
        if task is None:
            return self.boost
        weight = int(task.priority_weight)
        dag = task.get_dag()
        if dag is not None:
            weight += sum(
                int(dag.task_dict[task_id].priority_weight)
                for task_id in task.get_flat_relative_ids(upstream=False)
            )
        if DagRunType.from_run_id(ti.run_id) is DagRunType.BACKFILL_JOB:
            return weight
        return weight + self.boost


class OnceflowPriorityPlugin(AirflowPlugin):
    """Registers :class:`NightlyFirstWeightStrategy` so DAGs may use it as ``weight_rule``."""

    name = "onceflow_priority"
    priority_weight_strategies = [NightlyFirstWeightStrategy]
