"""Airflow APIs that differ between the Airflow versions onceflow supports, behind one name each.

As the official providers' ``common.compat``: try the current API, fall back to the older one,
so the rest of the package (and the DAG files) never test versions themselves. Supported: 3.1,
3.2 and 3.3; ``docs/deploy.md`` has the table of what each minor lacks and what onceflow does
instead. A degraded feature says so once per process, in the log of the task that meets it
(:func:`note_degraded`). Keep this module light: DAG files import it.
"""

from __future__ import annotations

import inspect
import logging
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.definitions.deadline import DeadlineAlert

__all__ = [
    "DEGRADED",
    "OLDEST_SUPPORTED_AIRFLOW",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSkipException",
    "AsyncCallback",
    "BaseDeadlineReference",
    "CronDataIntervalTimetable",
    "SkipMixin",
    "deadline_alert",
    "note_degraded",
    "retry_backoff",
]

log = logging.getLogger(__name__)

#: The oldest Airflow minor onceflow works on; ``apache-airflow>=`` in pyproject.toml must say the
#: same (a test checks). Airflow 2 is out: onceflow's DAGs and operators are written against the
#: Task SDK (``airflow.sdk``), Deadline Alerts and the Execution API, which Airflow 2 does not have.
OLDEST_SUPPORTED_AIRFLOW = "3.1"

try:  # 3.2+
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSkipException
except ImportError:  # 3.1: the Task SDK raises and catches the core classes
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSkipException,
    )

try:  # 3.2+
    from airflow.sdk import CronDataIntervalTimetable
except ImportError:  # 3.1
    from airflow.timetables.interval import CronDataIntervalTimetable  # type: ignore[assignment]

try:  # 3.2+
    from airflow.sdk.bases.skipmixin import SkipMixin
except ImportError:  # 3.1: the standard provider's (Airflow 3.1 installs it)
    from airflow.providers.standard.utils.skipmixin import SkipMixin  # type: ignore[assignment]

try:  # 3.2+
    from airflow.sdk.definitions.callback import AsyncCallback
except ImportError:  # 3.1
    from airflow.sdk.definitions.deadline import AsyncCallback

try:  # 3.2+: custom deadline references, evaluated when a plugin lists them
    from airflow.sdk.definitions.deadline import REFERENCE_TYPE_FIELD, BaseDeadlineReference

    CUSTOM_DEADLINE_REFERENCES = True
except ImportError:  # 3.1 evaluates only its built-in references
    CUSTOM_DEADLINE_REFERENCES = False
    REFERENCE_TYPE_FIELD = "reference_type"

    class BaseDeadlineReference:  # type: ignore[no-redef]
        """Stands in on 3.1 so the reference classes import; :func:`deadline_alert` replaces them."""

        @property
        def reference_name(self) -> str:
            return type(self).__name__


#: Airflow 3.3 added ``name`` to ``DeadlineAlert`` (shown in the UI and the deadline's record);
#: 3.1 and 3.2 have no such parameter and refuse the keyword.
DEADLINE_ALERT_HAS_NAME = "name" in inspect.signature(DeadlineAlert.__init__).parameters

#: 3.2 made ``retry_exponential_backoff`` a multiplier (a float); 3.1 takes only a bool.
BACKOFF_IS_A_MULTIPLIER = "float" in str(
    inspect.signature(BaseOperator.__init__).parameters["retry_exponential_backoff"].annotation
)

#: Task SDK 1.2 (Airflow 3.2) lets a task read another run (``GetDagRun``: its conf); 3.1 gives
#: only its state.
CAN_READ_OTHER_RUNS = True
try:
    from airflow.sdk.execution_time.comms import GetDagRun  # noqa: F401
except ImportError:
    CAN_READ_OTHER_RUNS = False

#: What this Airflow lacks and what onceflow does instead: feature -> sentence (docs/deploy.md).
DEGRADED: dict[str, str] = {}
if not CUSTOM_DEADLINE_REFERENCES:
    DEGRADED["business_time_deadline"] = (
        "Airflow 3.1 evaluates no custom deadline reference: the business-time deadline is the run's "
        "logical date plus a fixed offset (right in standard time, an hour off across a DST change)"
    )
if not BACKOFF_IS_A_MULTIPLIER:
    DEGRADED["backoff_multiplier"] = (
        "Airflow 3.1's retry_exponential_backoff is on or off: retries back off by Airflow's own factor 2"
    )
if not CAN_READ_OTHER_RUNS:
    DEGRADED["read_other_runs"] = (
        "Airflow 3.1 cannot show a task another run's conf, so the claim token an existing article run "
        "carries is unknown: sheet_claim does not mark a second row of the same article DUPLICATE, "
        "sheet_reconcile cannot tell which row owns the run, and rechecks take the owner from the "
        "ledger's claim step (keep one row per URL, or run Airflow 3.2+; docs/deploy.md)"
    )

_noted: set[str] = set()


def note_degraded(feature: str, logger: logging.Logger | Any | None = None) -> bool:
    """Log once per process that ``feature`` runs degraded on this Airflow; ``False`` if it does not."""
    if feature not in DEGRADED:
        return False
    if feature not in _noted:
        _noted.add(feature)
        (logger or log).warning("onceflow on Airflow 3.1: %s", DEGRADED[feature])
    return True


def dagbag_module() -> Any:
    """The module of ``DagBag`` and ``sync_bag_to_db``: ``airflow.dag_processing.dagbag`` since 3.3,
    ``airflow.models.dagbag`` before (imported when asked: it is heavy)."""
    import importlib

    try:
        return importlib.import_module("airflow.dag_processing.dagbag")
    except ImportError:
        return importlib.import_module("airflow.models.dagbag")


def retry_backoff(multiplier: float) -> float | bool:
    """``retry_exponential_backoff=``: the multiplier where Airflow takes one (3.2+), else on."""
    return multiplier if BACKOFF_IS_A_MULTIPLIER else multiplier > 1


def deadline_alert(*, reference: Any, interval: timedelta, callback: Any, name: str) -> DeadlineAlert:
    """A ``DeadlineAlert``, named where the installed Airflow can name one (3.3+).

    On 3.1 and 3.2 the name is dropped from the alert itself; callers that need it later pass it to
    their callback too (``MissedDeadlineNotifier`` records it as ``alert``). On 3.1 a custom
    reference (a :class:`BaseDeadlineReference`) becomes the closest built-in one: the run's
    logical date plus the reference's ``fixed_offset()`` (``DEGRADED["business_time_deadline"]``).
    """
    if not CUSTOM_DEADLINE_REFERENCES and isinstance(reference, BaseDeadlineReference):
        from airflow.sdk.definitions.deadline import DeadlineReference

        note_degraded("business_time_deadline")  # at parse time: the dag-processor's log

        interval = interval + reference.fixed_offset()  # type: ignore[attr-defined]
        reference = DeadlineReference.DAGRUN_LOGICAL_DATE
    if DEADLINE_ALERT_HAS_NAME:
        return DeadlineAlert(reference=reference, interval=interval, callback=callback, name=name)
    return DeadlineAlert(reference=reference, interval=interval, callback=callback)
