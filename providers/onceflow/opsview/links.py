"""Links from the view's items to Airflow's own pages (the React UI's routes in Airflow 3.1+).

Ledger owners name the attempt that held a lease: ``<dag_id>/<run_id>/<try>/<task_id>`` (the
article chain's steps) or ``<dag_id>/<run_id>/<try>`` (partition loads, whose task is ``load``).
A run id may itself contain ``/`` only in theory (Airflow's default run-id pattern forbids it),
so the owner is split from both ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from urllib.parse import quote

#: The task of a partition load whose owner string names no task.
PARTITION_LOAD_TASK = "load"


def _q(part: str) -> str:
    return quote(part, safe="")


@dataclass(frozen=True)
class TaskRef:
    """A task try of a DAG run, and its links into Airflow's UI."""

    dag_id: str
    run_id: str
    try_number: int | None = None
    task_id: str | None = None

    @cached_property
    def run_url(self) -> str:
        """The UI's path of the run."""
        return f"/dags/{_q(self.dag_id)}/runs/{_q(self.run_id)}"

    @cached_property
    def log_url(self) -> str | None:
        """The task instance's page, whose first tab is its log (at this try when known)."""
        if self.task_id is None:
            return None
        url = f"{self.run_url}/tasks/{_q(self.task_id)}"
        return url if self.try_number is None else f"{url}?try_number={self.try_number}"

    def review_url(self, task_id: str = "review") -> str:
        """The run's Required Actions tab of its review task (Airflow's human-in-the-loop page)."""
        return f"{self.run_url}/tasks/{_q(task_id)}/required_actions"

    def as_dict(self) -> dict[str, str | int | None]:
        """The reference and its links as plain data."""
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "try_number": self.try_number,
            "task_id": self.task_id,
            "run_url": self.run_url,
            "log_url": self.log_url,
        }


def from_owner(owner: str | None, *, default_task: str | None = None) -> TaskRef | None:
    """Parse a lease owner / ``committed_by``; ``None`` when it names no Airflow attempt."""
    if not owner or "/" not in owner:
        return None
    parts = owner.split("/")
    if len(parts) >= 4 and parts[-2].isdigit():
        return TaskRef(parts[0], "/".join(parts[1:-2]), int(parts[-2]), parts[-1])
    if len(parts) >= 3 and parts[-1].isdigit():
        return TaskRef(parts[0], "/".join(parts[1:-1]), int(parts[-1]), default_task)
    return None
