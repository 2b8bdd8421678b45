"""Pause a real Airflow task at a named point, so a test can kill or freeze it.

The partition load already reports its progress to a ``checkpoint`` callback:
:func:`onceflow.sales.ledger_link.load_partition` calls it with ``"leased"``,
``"registered"`` and ``"warehouse_committed"``, ``PartitionStore.overwrite`` with ``"deleted"``
and ``"rows_written"`` (inside the transaction) and ``"committed"``. The article chain calls
:func:`onceflow.articles.chain.checkpoint` with ``"<step>.stored"`` (the step's output written,
its ledger commit not yet made; for ``publish``: the page published) and ``"<step>.committed"``
(the ledger commit made, the task not yet finished). :func:`install_from_env`
hands them a checkpoint that, at the configured points, writes ``<dir>/<dag_id>.<stage>.<try>.paused``
(holding the process id) and waits until ``<...>.resume`` exists. The test then sends SIGKILL or
SIGSTOP to that process, which is the task process the scheduler started.

Configured by the environment of the Airflow components (so a cluster's task processes inherit it):

* ``ONCEFLOW_CRASH_POINTS``: ``dag_id:stage:try_number`` entries, comma-separated; a stage
  ``<stage>#<n>`` means the n-th time this task process reaches it (a batch lane's task reaches
  ``fetch.stored`` once per article: ``fetch.stored#3`` is the third article's);
* ``ONCEFLOW_CRASH_POINTS_DIR``: the folder for the marker files.

A test DAG file calls :func:`install_from_env` after defining its DAG; without the variables it
does nothing. Nothing in the product imports this module.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

POINTS_ENV = "ONCEFLOW_CRASH_POINTS"
DIR_ENV = "ONCEFLOW_CRASH_POINTS_DIR"


def marker(folder: Path, dag_id: str, stage: str, try_number: int, kind: str) -> Path:
    """``<folder>/<dag_id>.<stage>.<try>.<kind>`` (kind ``paused`` or ``resume``)."""
    return folder / f"{dag_id}.{stage}.{try_number}.{kind}"


def wait_until_paused(folder: Path, dag_id: str, stage: str, try_number: int, *, timeout: float) -> int:
    """Wait for the task to reach the point; return the process id of the task process."""
    paused = marker(folder, dag_id, stage, try_number, "paused")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if paused.exists() and paused.read_text().strip():
            return int(paused.read_text())
        time.sleep(0.1)
    raise TimeoutError(f"{dag_id} try {try_number} never reached {stage!r} ({paused} not written)")


def install_from_env() -> None:
    """Wrap the load's checkpoints in this process when ``ONCEFLOW_CRASH_POINTS`` asks for it."""
    spec, folder = os.environ.get(POINTS_ENV), os.environ.get(DIR_ENV)
    if not spec or not folder:
        return
    points = {tuple(entry.split(":")) for entry in spec.split(",") if entry}
    import onceflow.articles.chain as article_chain
    import onceflow.sales.ledger_link as loads
    from onceflow.sales.partition_store import PartitionStore

    if getattr(loads.load_partition, "_crash_points", False):
        return  # the DAG file was imported twice in this process
    pause = functools.partial(_pause, Path(folder), points)
    loads.load_partition = _with_checkpoint(loads.load_partition, pause)
    PartitionStore.overwrite = _with_checkpoint(PartitionStore.overwrite, pause)  # type: ignore[method-assign]
    article_chain.checkpoint = _then(pause, article_chain.checkpoint)


def _then(pause: Any, func: Any) -> Any:
    """``func(stage)`` after pausing at ``stage`` (a plain checkpoint function, not a callback)."""

    @functools.wraps(func)
    def wrapper(stage: str) -> None:
        pause(stage)
        func(stage)

    return wrapper


def _with_checkpoint(func: Any, pause: Any) -> Any:
    @functools.wraps(func)
    def wrapper(*args: Any, checkpoint: Any = None, **kwargs: Any) -> Any:
        def both(stage: str) -> None:
            pause(stage)
            if checkpoint is not None:
                checkpoint(stage)

        return func(*args, checkpoint=both, **kwargs)

    wrapper._crash_points = True  # type: ignore[attr-defined]
    return wrapper


_REACHED: dict[str, int] = {}


def _pause(folder: Path, points: set[tuple[str, ...]], stage: str) -> None:
    from airflow.sdk import get_current_context

    context = get_current_context()
    dag_id, try_number = context["dag"].dag_id, int(context["ti"].try_number)
    _REACHED[stage] = _REACHED.get(stage, 0) + 1
    counted = f"{stage}#{_REACHED[stage]}"
    if (dag_id, counted, str(try_number)) in points:
        stage = counted
    elif (dag_id, stage, str(try_number)) not in points:
        return
    paused = marker(folder, dag_id, stage, try_number, "paused")
    tmp = paused.with_suffix(".tmp")
    tmp.write_text(str(os.getpid()))
    tmp.replace(paused)  # the test reads a whole pid or nothing
    resume = marker(folder, dag_id, stage, try_number, "resume")
    while not resume.exists():
        time.sleep(0.05)
